//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/faultlog"
	"github.com/authlimit/authlimit/internal/redistest"
)

// The budget of one decision in the cluster fault tests, and the margin an
// answer may take beyond it on a shared two-core machine (HTTP, scheduling).
const (
	clusterBudget = 100 * time.Millisecond
	clusterMargin = 100 * time.Millisecond
)

// clusterRecoveryTarget is how soon after Redis answers again (here: after
// the replica's promotion) decisions must come from Redis again.
const clusterRecoveryTarget = 2 * time.Second

// TestFaultClusterFailover kills a master of three (one replica each) with
// SIGKILL while clients on every master keep asking, with fail mode local
// and AUTHLIMIT_LOCAL_DIVISOR=2, so that the local limit (N/2) tells a
// fail-mode answer from Redis's (N) in X-RateLimit-Limit:
//
//   - every answer for a key of the killed master comes within the budget
//     plus a margin and, until Redis decides again, is the fail mode's
//     (local, admitting no more than the local limit less what Redis had
//     admitted on this replica) or 503 unavailable;
//   - once the replica is promoted, Redis decides those keys again within
//     2s (both delays measured and reported);
//   - keys of the other masters are decided by Redis throughout, and each
//     gets exactly N admissions however many requests it sends;
//   - the metrics agree with what the clients saw.
//
// It runs twice: with cluster-require-full-coverage off, where the other
// masters keep serving while a master is down, and with Redis's defaults,
// where every master refuses queries (CLUSTERDOWN) from the moment the dead
// master is flagged failed until its replica takes over. There, keys of the
// healthy masters cannot be decided by Redis for that moment; they must
// still get only what the fail mode defines.
func TestFaultClusterFailover(t *testing.T) {
	for _, tc := range []struct {
		name         string
		opts         []redistest.Option
		fullCoverage bool
	}{
		{"full coverage off", []redistest.Option{redistest.WithArgs("--cluster-require-full-coverage", "no")}, false},
		{"redis defaults", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clusterFailover(t, tc.fullCoverage, tc.opts...)
		})
	}
}

func clusterFailover(t *testing.T, fullCoverage bool, opts ...redistest.Option) {
	const n, divisor = 30, 2
	lim := limits{redis: []int64{n}, local: []int64{n / divisor}}
	coverage := "cluster-require-full-coverage no"
	if fullCoverage {
		coverage = "Redis defaults (cluster-require-full-coverage yes)"
	}
	row := faultlog.Row{
		Fault: "Cluster: a master of three (one replica each) killed (SIGKILL) under load; " + coverage,
		Expected: fmt.Sprintf("killed master's keys: fail mode local (limit %d/%d) or 503 within budget %v + %v; back on Redis within %v of the promotion. ",
			n, divisor, clusterBudget, clusterMargin, clusterRecoveryTarget),
	}
	if fullCoverage {
		row.Expected += fmt.Sprintf("Other masters' keys: Redis, or while the cluster refuses queries the fail mode or 503; never more than Redis's %d plus what the fail mode defines", n)
	} else {
		row.Expected += fmt.Sprintf("Other masters' keys: decided by Redis throughout, exactly %d admitted each", n)
	}
	defer recordRow(t, &row)

	topo := redistest.NewClusterTopology(t, 3, 1, opts...)
	prefix := topo.Prefix(t)
	al := startClusterAuthlimit(t, topo, prefix, map[string]string{
		"AUTHLIMIT_RULES":           fmt.Sprintf("name=per-ip key=ip limit=%d/1h algorithm=sliding_window_log", n),
		"AUTHLIMIT_FAIL_MODE":       "local",
		"AUTHLIMIT_LOCAL_DIVISOR":   strconv.Itoa(divisor),
		"AUTHLIMIT_REDIS_TIMEOUT":   clusterBudget.String(),
		"AUTHLIMIT_DENY_CACHE_SIZE": "0", // every answer a decision, so each tells its source
	})
	logEvidence(t, al)

	masters := topo.Masters(t)
	owners := slotOwners(t, topo)
	victim := masters[0]
	used := map[string]bool{}
	var steady, fresh, healthy []loadClient
	for _, m := range masters {
		ips := pickIPs(t, 3, used, func(s int) bool { return owners[s] == m.ID })
		for _, ip := range ips {
			c := loadClient{ip, "/"}
			if m == victim {
				steady = append(steady, c)
			} else {
				healthy = append(healthy, c)
			}
		}
	}
	for _, ip := range pickIPs(t, 3, used, func(s int) bool { return owners[s] == victim.ID }) {
		fresh = append(fresh, loadClient{ip, "/"})
	}

	const every = 20 * time.Millisecond
	ld := newLoad(newAsker(al))
	t.Cleanup(ld.halt)
	ld.start(every, append(append([]loadClient(nil), steady...), healthy...)...)
	// Every steady client past its limit before the fault.
	ld.waitAnswers(t, n+10, 30*time.Second, append(append([]loadClient(nil), steady...), healthy...)...)

	topo.Kill(t, victim)
	killedAt := time.Now()
	ld.start(every, fresh...) // clients that Redis never saw
	successor, took := topo.WaitFailover(t, victim, 30*time.Second)
	promotedAt := killedAt.Add(took)
	t.Logf("failover: %s killed, %s promoted %v later (every node agreeing)", victim, successor, took.Round(time.Millisecond))

	// Back on Redis: the first Redis answer for a key of the killed master
	// sent after the kill; the failover lasts until that request was sent,
	// and recovery is when its answer came.
	killed := append(append([]loadClient(nil), steady...), fresh...)
	waitBackOnRedis(t, ld, lim, killed, killedAt)
	// Run on long enough for the fresh clients to use their whole quota in
	// Redis too.
	ld.waitAnswers(t, ld.count(fresh[0])+n+10, 30*time.Second, fresh...)
	ld.halt()
	backSent, backAt := backOnRedis(ld, lim, killed, killedAt) // the answers on their way when it was first seen included
	afterKill, afterPromotion := backAt.Sub(killedAt), backAt.Sub(promotedAt)
	t.Logf("decisions for the killed master's keys back on Redis %v after the kill, %v after the promotion", afterKill.Round(time.Millisecond), afterPromotion.Round(time.Millisecond))

	// The killed master's keys.
	killedTally := newTally()
	late := 0 // answers after the recovery not decided by Redis
	for _, c := range killed {
		as := ld.answers(c)
		ty := newTally()
		ty.add(lim, c, as...)
		killedTally.add(lim, c, as...)
		redisBefore := 0
		for _, a := range as {
			if a.sent.Before(killedAt) && a.admitted() && lim.of(a) == byRedis {
				redisBefore++
			}
			if a.sent.After(backAt) && lim.of(a) != byRedis {
				late++
				if late <= 5 {
					t.Errorf("%s: answer sent %v after the recovery not decided by Redis: %v", c, a.sent.Sub(backAt).Round(time.Millisecond), a)
				}
			}
			if a.sent.After(killedAt) && a.sent.Before(backSent) {
				if s := lim.of(a); s != byLocal && s != unavailable {
					t.Errorf("%s during the failover: %v (%s), want the local fail mode or 503", c, a, s)
				}
			}
		}
		localQuota := max(0, n/divisor-redisBefore)
		if got := ty.admitted[byLocal]; got > localQuota {
			t.Errorf("%s: the local fail mode admitted %d, want at most %d (local limit %d less the %d Redis admitted before)",
				c, got, localQuota, n/divisor, redisBefore)
		}
		// The steady clients used their quota before the kill, long enough
		// before for the replica to have it; the fresh ones only in the new
		// master. Either way Redis admits exactly N in all.
		if got := ty.admitted[byRedis]; got != n {
			t.Errorf("%s: Redis admitted %d, want %d (%d Redis answers)", c, got, n, ty.answers[byRedis])
		}
	}
	if len(killedTally.others) > 0 {
		t.Errorf("killed master's keys: %d answers neither Redis, local nor 503, e.g. %s", killedTally.answers[otherAnswer], strings.Join(killedTally.others, "; "))
	}
	if killedTally.worst > clusterBudget+clusterMargin {
		t.Errorf("killed master's keys: the slowest answer took %v, want at most %v", killedTally.worst, clusterBudget+clusterMargin)
	}
	// The recovery target is a verdict of its own in the fault table.
	t.Run("back on Redis within 2s of the promotion", func(t *testing.T) {
		target := faultlog.Row{
			Fault:    "Cluster: recovery target after a master's replica is promoted; " + coverage,
			Expected: fmt.Sprintf("decisions for the failed master's keys back on Redis within %v of the promotion (the breaker's default backoff: probes 100ms apart, the gap doubling to 500ms)", clusterRecoveryTarget),
			Observed: fmt.Sprintf("back on Redis %v after the promotion, %v after the kill (the failover took %v, from the kill to every node agreeing; a negative figure means authlimit's client learned the new master before every node agreed). Slowest answer for the killed master's keys %v.",
				ms(afterPromotion), ms(afterKill), took.Round(time.Millisecond), ms(killedTally.worst)),
			WorstLatency: killedTally.worst,
			Recovery:     afterPromotion,
		}
		recordRow(t, &target)
		if afterPromotion > clusterRecoveryTarget {
			t.Errorf("decisions for the killed master's keys back on Redis %v after the promotion, want at most %v", afterPromotion, clusterRecoveryTarget)
		}
	})

	// The healthy masters' keys.
	healthyTally := newTally()
	for _, c := range healthy {
		as := ld.answers(c)
		ty := newTally()
		ty.add(lim, c, as...)
		healthyTally.add(lim, c, as...)
		if got := ty.admitted[byRedis] + ty.admitted[byLocal]; got != n {
			t.Errorf("%s on a healthy master: admitted %d (%d by Redis, %d by the fail mode) of %d requests, want exactly %d",
				c, got, ty.admitted[byRedis], ty.admitted[byLocal], len(as), n)
		}
		if !fullCoverage && ty.answers[byRedis] != len(as) {
			var which []string
			for _, a := range as {
				if lim.of(a) != byRedis && len(which) < 3 {
					which = append(which, fmt.Sprintf("sent %v after the kill: %v", a.sent.Sub(killedAt).Round(time.Millisecond), a))
				}
			}
			t.Errorf("%s on a healthy master: %d of %d answers not decided by Redis (%d local, %d 503, %d other): %s",
				c, len(as)-ty.answers[byRedis], len(as), ty.answers[byLocal], ty.answers[unavailable], ty.answers[otherAnswer], strings.Join(which, "; "))
		}
	}
	if len(healthyTally.others) > 0 {
		t.Errorf("healthy masters' keys: %d answers neither Redis, local nor 503, e.g. %s", healthyTally.answers[otherAnswer], strings.Join(healthyTally.others, "; "))
	}
	if healthyTally.worst > clusterBudget+clusterMargin {
		t.Errorf("healthy masters' keys: the slowest answer took %v, want at most %v", healthyTally.worst, clusterBudget+clusterMargin)
	}

	// The metrics agree with the clients.
	m := scrapeMetrics(t, al)
	t.Logf("metrics: %s", metricsSummary(m))
	locals := killedTally.answers[byLocal] + healthyTally.answers[byLocal]
	n503 := killedTally.answers[unavailable] + healthyTally.answers[unavailable]
	if got := m[`authlimit_fail_mode_decisions_total{mode="local"}`]; int(got) != locals {
		t.Errorf("authlimit_fail_mode_decisions_total{mode=\"local\"} = %v, the clients saw %d local answers", got, locals)
	}
	if got := m[`authlimit_requests_total{front="http",result="unavailable"}`]; int(got) != n503 {
		t.Errorf("authlimit_requests_total{front=\"http\",result=\"unavailable\"} = %v, the clients saw %d", got, n503)
	}
	if m[`authlimit_circuit_transitions_total{state="open"}`] < 1 || m[`authlimit_circuit_transitions_total{state="closed"}`] < 1 {
		t.Errorf("circuit transitions: open %v, closed %v; want the killed master's circuit opened and closed again",
			m[`authlimit_circuit_transitions_total{state="open"}`], m[`authlimit_circuit_transitions_total{state="closed"}`])
	}
	if got := maxSeries(m, "authlimit_circuit_state"); got != 0 {
		t.Errorf("authlimit_circuit_state = %v after the recovery, want 0", got)
	}

	summary := fmt.Sprintf("failover took %v (kill to every node agreeing). Killed master's keys (%d clients, %d answers): %d local (%d admitted), %d 503, %d by Redis, %d other; back on Redis %v after the kill, %v after the promotion%s. "+
		"Other masters' keys (%d clients, %d answers): %d by Redis (%d admitted), %d local (%d admitted), %d 503, %d other. Metrics: %s",
		took.Round(time.Millisecond), len(killed), killedTally.total(), killedTally.answers[byLocal], killedTally.admitted[byLocal], killedTally.answers[unavailable],
		killedTally.answers[byRedis], killedTally.answers[otherAnswer], ms(afterKill), ms(afterPromotion), lateNote(late),
		len(healthy), healthyTally.total(), healthyTally.answers[byRedis], healthyTally.admitted[byRedis], healthyTally.answers[byLocal], healthyTally.admitted[byLocal],
		healthyTally.answers[unavailable], healthyTally.answers[otherAnswer], metricsSummary(m))
	t.Log(summary)
	row.Observed = summary
	row.WorstLatency = max(killedTally.worst, healthyTally.worst)
	row.Recovery = afterKill
}

func lateNote(late int) string {
	if late == 0 {
		return ""
	}
	return fmt.Sprintf(" (then still %d answers not by Redis)", late)
}

// reshardAlgorithms are the algorithms whose limits the resharding test
// holds to exactly N, one rule each on a path of its own.
var reshardAlgorithms = []string{"sliding_window_log", "token_bucket", "fixed_window", "sliding_window_counter", "leaky_bucket", "gcra"}

// TestFaultClusterReshard moves slots while clients whose keys live in them
// keep asking, each client with one algorithm's rule (limit N a day, so
// that no quota comes back during the test):
//
//   - "redis-cli reshard": redis-cli --cluster reshard moves a range of
//     slots, key batch by key batch; clients get MOVED (and ASK while a
//     slot's keys are on their way);
//   - "ASK phase held open": one slot moved by hand, its keys a few at a
//     time, the slot MIGRATING on one master and IMPORTING on the other for
//     seconds, so that some keys of the slot are on each side.
//
// No client may see an error (no 5xx, no 503, no fail-mode decision: the
// fail mode is local with divisor 2, so X-RateLimit-Limit would show it),
// and every client gets exactly N admissions.
func TestFaultClusterReshard(t *testing.T) {
	const n, divisor = 20, 2
	lim := limits{redis: []int64{n}, local: []int64{n / divisor}}
	var rules []string
	for _, a := range reshardAlgorithms {
		rules = append(rules, fmt.Sprintf("name=%s key=ip limit=%d/1d algorithm=%s path=/%s", ruleName(a), n, a, ruleName(a)))
	}
	topo := redistest.NewClusterTopology(t, 3, 1)
	prefix := topo.Prefix(t)
	cc := topo.Client(t)
	logged := func(t *testing.T, ip string) int64 {
		return logTotal(t, cc, prefix, ruleName(reshardAlgorithms[0]), ip)
	}
	al := startClusterAuthlimit(t, topo, prefix, map[string]string{
		"AUTHLIMIT_RULES":           strings.Join(rules, "; "),
		"AUTHLIMIT_FAIL_MODE":       "local",
		"AUTHLIMIT_LOCAL_DIVISOR":   strconv.Itoa(divisor),
		"AUTHLIMIT_REDIS_TIMEOUT":   clusterBudget.String(),
		"AUTHLIMIT_DENY_CACHE_SIZE": "0",
	})
	logEvidence(t, al)
	masters := topo.Masters(t)
	used := map[string]bool{}
	clientsOf := func(ips []string) []loadClient {
		var cs []loadClient
		for _, ip := range ips {
			for _, a := range reshardAlgorithms {
				cs = append(cs, loadClient{ip, "/" + ruleName(a)})
			}
		}
		return cs
	}

	t.Run("redis-cli reshard", func(t *testing.T) {
		const slots = 1000
		from, to := masters[0], masters[1]
		// redis-cli takes the lowest slots of the source.
		first := topo.View(t, from)
		var lo int
		for _, v := range first {
			if v.ID == from.ID {
				lo = v.Slots[0].First
			}
		}
		ips := pickIPs(t, 4, used, func(s int) bool { return s >= lo && s < lo+slots })
		row := faultlog.Row{
			Fault:    fmt.Sprintf("Cluster: %d slots resharded by redis-cli --cluster reshard (MOVED, ASK) under load", slots),
			Expected: fmt.Sprintf("no 5xx, no 503, no fail-mode decision; exactly %d admitted per key whose slot moves, for %s", n, strings.Join(reshardAlgorithms, ", ")),
		}
		defer recordRow(t, &row)
		clients := clientsOf(ips)
		ld, before := startReshardLoad(t, al, clients)
		start := time.Now()
		moved := topo.Reshard(t, from, to, slots, 10)
		took := time.Since(start)
		for _, ip := range ips {
			s := redistest.KeySlot(ip)
			in := false
			for _, r := range moved {
				in = in || r.Contains(s)
			}
			if !in {
				t.Fatalf("redis-cli moved %v, not slot %d of client %s", moved, s, ip)
			}
		}
		t.Logf("redis-cli moved slots %v from %s to %s in %v", moved, from, to, took.Round(time.Millisecond))
		ld.waitAnswers(t, ld.count(clients[0])+5, 30*time.Second, clients...)
		ld.waitAnswers(t, n+10, 30*time.Second, clients...)
		ld.halt()
		row.Observed = checkReshard(t, al, ld, lim, n, clients, before, logged) + fmt.Sprintf(" redis-cli moved slots %v in %v, meanwhile %d requests for keys in them.",
			moved, took.Round(time.Millisecond), sentBetween(ld, clients, start, start.Add(took)))
		row.WorstLatency = worstOf(ld, clients)
	})

	t.Run("ASK phase held open", func(t *testing.T) {
		from, to := masters[2], masters[0]
		owners := slotOwners(t, topo)
		seed := pickIPs(t, 1, used, func(s int) bool { return owners[s] == from.ID })
		slot := redistest.KeySlot(seed[0])
		ips := append(seed, pickIPs(t, 2, used, func(s int) bool { return s == slot })...)
		row := faultlog.Row{
			Fault: "Cluster: one slot migrated by hand with its ASK phase held open for seconds under load (" +
				strconv.Itoa(len(ips)*len(reshardAlgorithms)) + " keys in the slot, moved a few at a time)",
			Expected: fmt.Sprintf("no 5xx, no 503, no fail-mode decision; exactly %d admitted per key, for %s", n, strings.Join(reshardAlgorithms, ", ")),
		}
		defer recordRow(t, &row)
		clients := clientsOf(ips)
		ld, before := startReshardLoad(t, al, clients)
		m := topo.BeginMigration(t, slot, to)
		start := time.Now()
		steps := []string{}
		for moved := 1; moved > 0; {
			// About a second of traffic with the slot half here, half there.
			ld.waitAnswers(t, ld.count(clients[0])+8, 30*time.Second, clients...)
			moved = m.MoveKeys(t, len(reshardAlgorithms))
			steps = append(steps, strconv.Itoa(moved))
		}
		ld.waitAnswers(t, ld.count(clients[0])+8, 30*time.Second, clients...)
		m.Finish(t)
		held := time.Since(start)
		t.Logf("slot %d MIGRATING from %s to %s for %v, keys moved in batches of %s", slot, from, to, held.Round(time.Millisecond), strings.Join(steps, ", "))
		ld.waitAnswers(t, n+10, 30*time.Second, clients...)
		ld.halt()
		row.Observed = checkReshard(t, al, ld, lim, n, clients, before, logged) + fmt.Sprintf(" Slot %d held migrating for %v, keys moved %s at a time, meanwhile %d requests for keys in it.",
			slot, held.Round(time.Millisecond), strings.Join(steps, ", "), sentBetween(ld, clients, start, start.Add(held)))
		row.WorstLatency = worstOf(ld, clients)
	})
}

// startReshardLoad notes the metrics, then starts the clients asking every
// 100ms, and returns once each has had 5 answers.
func startReshardLoad(t *testing.T, al *authlimit, clients []loadClient) (*load, map[string]float64) {
	t.Helper()
	before := scrapeMetrics(t, al)
	ld := newLoad(newAsker(al))
	t.Cleanup(ld.halt)
	ld.start(100*time.Millisecond, clients...)
	ld.waitAnswers(t, 5, 30*time.Second, clients...)
	return ld, before
}

// ruleName is the rule (and path) name of an algorithm's rule.
func ruleName(algorithm string) string { return strings.ReplaceAll(algorithm, "_", "-") }

// checkReshard asserts that every client's answers came from Redis with
// exactly n admissions, that the sliding_window_log rule's log in Redis
// holds exactly those n (logged reads it: a decision sent twice would show
// there), and that the metrics saw no failure since before; it returns what
// it saw.
func checkReshard(t *testing.T, al *authlimit, ld *load, lim limits, n int, clients []loadClient, before map[string]float64, logged func(t *testing.T, ip string) int64) string {
	t.Helper()
	all := newTally()
	perAlgo := map[string][]int{}
	for _, c := range clients {
		as := ld.answers(c)
		ty := newTally()
		ty.add(lim, c, as...)
		all.add(lim, c, as...)
		perAlgo[c.path] = append(perAlgo[c.path], ty.admitted[byRedis]+ty.admitted[byLocal]+ty.admitted[failedOpen])
		if ty.answers[byRedis] != len(as) {
			var which []string
			for _, a := range as {
				if lim.of(a) != byRedis && len(which) < 3 {
					which = append(which, a.String())
				}
			}
			t.Errorf("%s: %d of %d answers not decided by Redis (%d local, %d 503, %d other), e.g. %s",
				c, len(as)-ty.answers[byRedis], len(as), ty.answers[byLocal], ty.answers[unavailable], ty.answers[otherAnswer], strings.Join(which, "; "))
		}
		if got := ty.admitted[byRedis] + ty.admitted[byLocal] + ty.admitted[failedOpen]; got != n {
			t.Errorf("%s: %d admitted of %d requests, want exactly %d", c, got, len(as), n)
		}
		if c.path == "/"+ruleName(reshardAlgorithms[0]) {
			if got := logged(t, c.ip); got != int64(ty.admitted[byRedis]) {
				t.Errorf("%s: the log in Redis holds %d admissions, the client saw %d admitted by Redis", c, got, ty.admitted[byRedis])
			}
		}
	}
	after := scrapeMetrics(t, al)
	for _, series := range []string{`authlimit_fail_mode_decisions_total{mode="local"}`, `authlimit_requests_total{front="http",result="unavailable"}`,
		`authlimit_requests_total{front="http",result="error"}`, `authlimit_store_errors_total{kind="timeout"}`, `authlimit_store_errors_total{kind="error"}`,
		`authlimit_store_errors_total{kind="unreachable"}`} {
		if d := after[series] - before[series]; d != 0 {
			t.Errorf("%s rose by %v during the move", series, d)
		}
	}
	var admitted []string
	for _, a := range reshardAlgorithms {
		admitted = append(admitted, fmt.Sprintf("%s %v", a, perAlgo["/"+ruleName(a)]))
	}
	summary := fmt.Sprintf("%d clients, %d answers: %d by Redis, %d local, %d 503, %d other; admitted per client (want %d each): %s.",
		len(clients), all.total(), all.answers[byRedis], all.answers[byLocal], all.answers[unavailable], all.answers[otherAnswer], n, strings.Join(admitted, "; "))
	t.Log(summary)
	return summary
}

// sentBetween counts the clients' requests sent from from to to.
func sentBetween(ld *load, clients []loadClient, from, to time.Time) int {
	n := 0
	for _, c := range clients {
		for _, a := range ld.answers(c) {
			if !a.sent.Before(from) && !a.sent.After(to) {
				n++
			}
		}
	}
	return n
}

// worstOf returns the slowest answer the clients got.
func worstOf(ld *load, clients []loadClient) time.Duration {
	var worst time.Duration
	for _, c := range clients {
		for _, a := range ld.answers(c) {
			worst = max(worst, a.took)
		}
	}
	return worst
}

// TestFaultClusterSpread sends one decision for each of 10,000 client IPs
// (198.18.0.0 to 198.18.39.15) through authlimit and counts the keys each
// master holds afterwards: they must be where the slots of the IPs say
// (for key=ip the key tag is the address), and no master may hold less
// than 25% or more than 42% of them.
func TestFaultClusterSpread(t *testing.T) {
	const clients, workers = 10000, 16
	const minShare, maxShare = 0.25, 0.42
	row := faultlog.Row{
		Fault:    fmt.Sprintf("Cluster: %d client IPs (198.18.0.0/18, first %d) over three masters", clients, clients),
		Expected: fmt.Sprintf("every key on the master its IP's slot names; each master %.0f%% to %.0f%% of the keys", 100*minShare, 100*maxShare),
	}
	defer recordRow(t, &row)
	topo := redistest.NewClusterTopology(t, 3, 1)
	al := startClusterAuthlimit(t, topo, topo.Prefix(t), map[string]string{
		"AUTHLIMIT_RULES":         "name=per-ip key=ip limit=5/1h algorithm=fixed_window",
		"AUTHLIMIT_REDIS_TIMEOUT": "1s", // this test is about placement, not speed
	})
	logEvidence(t, al)
	masters := topo.Masters(t)
	owners := slotOwners(t, topo)
	want := map[string]int{}
	ips := make(chan string, clients)
	for i := 0; i < clients; i++ {
		ip := fmt.Sprintf("198.18.%d.%d", i>>8, i&255)
		want[owners[redistest.KeySlot(ip)]]++
		ips <- ip
	}
	close(ips)

	k := newAsker(al)
	lim := limits{redis: []int64{5}}
	start := time.Now()
	var mu sync.Mutex
	ty := newTally()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ip := range ips {
				a := k.ask(ip, "/")
				mu.Lock()
				ty.add(lim, loadClient{ip, "/"}, a)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if ty.admitted[byRedis] != clients {
		t.Errorf("%d of %d first requests admitted by Redis (%d local, %d 503, %d other: %s)", ty.admitted[byRedis], clients,
			ty.answers[byLocal], ty.answers[unavailable], ty.answers[otherAnswer], strings.Join(ty.others, "; "))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var counts []string
	lo, hi := clients, 0
	for i, m := range masters {
		got, err := m.Client(t).DBSize(ctx).Result()
		if err != nil {
			t.Fatalf("DBSIZE on %s: %v", m, err)
		}
		share := float64(got) / clients
		counts = append(counts, fmt.Sprintf("master %d (%s): %d keys (%.1f%%)", i+1, m.Addr, got, 100*share))
		lo, hi = min(lo, int(got)), max(hi, int(got))
		if int(got) != want[m.ID] {
			t.Errorf("master %s holds %d keys; the slots of the IPs put %d there", m, got, want[m.ID])
		}
		if share < minShare || share > maxShare {
			t.Errorf("master %s holds %.1f%% of the keys, want %.0f%% to %.0f%%", m, 100*share, 100*minShare, 100*maxShare)
		}
	}
	row.Observed = fmt.Sprintf("%s; min/max %.3f. %d decisions in %v, all by Redis: %v.", strings.Join(counts, ", "),
		float64(lo)/float64(max(hi, 1)), clients, took.Round(time.Millisecond), ty.admitted[byRedis] == clients)
	row.WorstLatency = ty.worst
	t.Log(row.Observed)
}

// TestFaultClusterMultiRule checks all or nothing for requests whose rules
// live in different slots: a per-IP rule (key=ip) and a global one
// (key=global, one key in one slot). A request that one slot denies after
// another admitted must be refunded in the admitting slot, or the lost
// refund reported (authlimit_refunds_lost_total, and the log): the
// consumption stored in Redis must be at least the admitted requests and at
// most those plus the reported lost refunds (one reported lost may have
// run: its reply did not come) and the 503s (one that passed its budget
// may have been decided and consumed in Redis).
//
//   - "failover": the global rule denies most requests (a token bucket of
//     100/s) and its master is killed; the per-IP rules live on the other
//     masters and keep exact logs, so their consumption is compared with
//     the requests Redis admitted;
//   - "refund to a moving slot": the per-IP rules deny (6 an hour each)
//     and the global rule's slot is migrated by hand while the refunds
//     flow into it, through the ASK phase and after it (MOVED); the global
//     log's consumption is compared with the admitted requests.
func TestFaultClusterMultiRule(t *testing.T) {
	t.Run("failover", multiRuleFailover)
	t.Run("refund to a moving slot", refundToMovingSlot)
}

func multiRuleFailover(t *testing.T) {
	const divisor = 2
	row := faultlog.Row{
		Fault: "Cluster: per-IP rule + global rule (different slots) through a failover of the global rule's master",
		Expected: "all or nothing: per-IP consumption in Redis = requests Redis admitted (+ at most the reported lost refunds and the 503s that passed their budget); " +
			"fail mode local or 503 during the failover; requests of the per-IP rule alone on healthy masters decided by Redis throughout",
	}
	defer recordRow(t, &row)
	topo := redistest.NewClusterTopology(t, 3, 1, redistest.WithArgs("--cluster-require-full-coverage", "no"))
	prefix := topo.Prefix(t)
	cc := topo.Client(t)
	al := startClusterAuthlimit(t, topo, prefix, map[string]string{
		"AUTHLIMIT_RULES":           "name=per-ip key=ip limit=100000/1h algorithm=sliding_window_log; name=global key=global limit=100/1s algorithm=token_bucket burst=20 path=/both",
		"AUTHLIMIT_FAIL_MODE":       "local",
		"AUTHLIMIT_LOCAL_DIVISOR":   strconv.Itoa(divisor),
		"AUTHLIMIT_REDIS_TIMEOUT":   clusterBudget.String(),
		"AUTHLIMIT_DENY_CACHE_SIZE": "0", // a cached global denial would keep requests off Redis and off the refund path
	})
	logEvidence(t, al)
	// X-RateLimit-Limit names the most restrictive rule: the global
	// bucket's burst (20, locally 10), or the per-IP limit.
	lim := limits{redis: []int64{20, 100000}, local: []int64{10, 50000}}
	owners := slotOwners(t, topo)
	globalSlot := redistest.KeySlot("*") // the tag of key=global
	victim := topo.Node(t, owners[globalSlot])
	used := map[string]bool{}
	ips := pickIPs(t, 8, used, func(s int) bool { return owners[s] != victim.ID })
	var clients []loadClient
	for _, ip := range ips {
		clients = append(clients, loadClient{ip, "/both"})
	}
	// Clients of the per-IP rule alone, on the healthy masters: nothing
	// they ask involves the killed master.
	var solo []loadClient
	for _, ip := range pickIPs(t, 4, used, func(s int) bool { return owners[s] != victim.ID }) {
		solo = append(solo, loadClient{ip, "/solo"})
	}
	ld := newLoad(newAsker(al))
	t.Cleanup(ld.halt)
	ld.start(20*time.Millisecond, append(append([]loadClient(nil), clients...), solo...)...)
	ld.waitAnswers(t, 60, 30*time.Second, clients...)

	topo.Kill(t, victim)
	killedAt := time.Now()
	successor, took := topo.WaitFailover(t, victim, 30*time.Second)
	t.Logf("failover: %s killed, %s promoted %v later", victim, successor, took.Round(time.Millisecond))
	waitBackOnRedis(t, ld, lim, clients, killedAt)
	ld.waitAnswers(t, ld.count(clients[0])+60, 30*time.Second, clients...)
	ld.halt()
	backSent, backAt := backOnRedis(ld, lim, clients, killedAt) // the answers on their way when it was first seen included

	all := newTally()
	for _, c := range clients {
		as := ld.answers(c)
		all.add(lim, c, as...)
		for _, a := range as {
			if a.sent.After(killedAt) && a.sent.Before(backSent) {
				if s := lim.of(a); s != byLocal && s != unavailable {
					t.Errorf("%s during the failover: %v (%s), want the local fail mode or 503", c, a, s)
				}
			}
		}
	}
	if len(all.others) > 0 {
		t.Errorf("%d answers neither Redis, local nor 503, e.g. %s", all.answers[otherAnswer], strings.Join(all.others, "; "))
	}
	soloTally := newTally()
	for _, c := range solo {
		as := ld.answers(c)
		ty := newTally()
		ty.add(lim, c, as...)
		soloTally.add(lim, c, as...)
		if ty.answers[byRedis] == len(as) {
			continue
		}
		firsts := map[source]string{}
		for _, a := range as {
			if s := lim.of(a); s != byRedis && firsts[s] == "" {
				firsts[s] = fmt.Sprintf("first %s answer sent %v after the kill: %v", s, a.sent.Sub(killedAt).Round(time.Millisecond), a)
			}
		}
		var notes []string
		for _, n := range firsts {
			notes = append(notes, n)
		}
		sort.Strings(notes)
		t.Errorf("%s (per-IP rule only, healthy master): %d of %d answers not Redis's (%d local, %d 503); %s",
			c, len(as)-ty.answers[byRedis], len(as), ty.answers[byLocal], ty.answers[unavailable], strings.Join(notes, "; "))
	}
	if all.answers[byRedis] == all.admitted[byRedis] {
		t.Fatalf("the global rule denied nothing: the test exercised no refund")
	}
	consumed, m := settledConsumption(t, al, all.admitted[byRedis], func() int64 {
		var sum int64
		for _, ip := range ips {
			sum += logTotal(t, cc, prefix, "per-ip", ip)
		}
		return sum
	})
	lost := int(m["authlimit_refunds_lost_total"])
	timeouts := all.answers[unavailable] // 503s of the two-rule requests: each may have consumed
	// Which entries of the logs no admission accounts for, and what their
	// requests were answered. A denial by Redis whose refund was lost is
	// reported; a request sent after the kill was never decided in the
	// global slot (its master was dead), so an entry of its per-IP rule is
	// a refund owed, whatever the answer; an entry of no request at all is
	// a decision sent twice.
	strays := map[string]int{}
	var strayNotes []string
	for _, c := range clients {
		var admitted []clusterAnswer
		as := ld.answers(c)
		for _, a := range as {
			if a.admitted() && lim.of(a) == byRedis {
				admitted = append(admitted, a)
			}
		}
		for _, e := range unaccounted(logEntries(t, cc, prefix, "per-ip", c.ip), admitted) {
			kind := "no request in flight"
			for _, a := range as {
				if e.Before(a.sent) || e.After(a.sent.Add(a.took)) {
					continue
				}
				when := "sent before the kill"
				if a.sent.After(killedAt) {
					when = "sent after the kill"
				}
				kind = fmt.Sprintf("%s, %s", lim.of(a), when)
				if len(strayNotes) < 6 {
					strayNotes = append(strayNotes, fmt.Sprintf("%s: entry %v after the kill, request sent %v after it, answered %v (%s)",
						c, e.Sub(killedAt).Round(time.Millisecond), a.sent.Sub(killedAt).Round(time.Millisecond), a, lim.of(a)))
				}
			}
			strays[kind]++
		}
	}
	silent := strays["no request in flight"]
	for kind, n := range strays {
		if strings.HasSuffix(kind, "sent after the kill") && !strings.HasPrefix(kind, string(byRedis)) {
			silent += n
		}
	}
	if silent > 0 {
		t.Errorf("%d per-IP log entries in Redis belong to two-rule requests whose global part was never decided (sent after its master died) or to no request: "+
			"consumed, never refunded, not in authlimit_refunds_lost_total. Unaccounted entries by their request's answer: %v; e.g. %s",
			silent, strays, strings.Join(strayNotes, "; "))
	}
	// A refund reported lost may have run (its reply did not come), so the
	// reported ones bound the consumption from above only.
	if lo, hi := all.admitted[byRedis], all.admitted[byRedis]+lost+timeouts; int(consumed) < lo || int(consumed) > hi {
		t.Errorf("per-IP consumption in Redis %d, want %d admitted by Redis, + up to %d lost refunds and %d answered 503: "+
			"below, a refund was applied twice; above, a denied request consumed, or a refund was silently lost. Unaccounted entries by their request's answer: %v; e.g. %s",
			consumed, all.admitted[byRedis], lost, timeouts, strays, strings.Join(strayNotes, "; "))
	}
	row.Observed = fmt.Sprintf("failover took %v; %d requests: %d by Redis (%d admitted, %d denied and refunded), %d local (%d admitted), %d 503, %d other; decisions back on Redis %v after the kill. "+
		"Per-IP consumption in Redis %d; %d admitted by Redis, %d lost refunds reported, %d answered 503; log entries no admission accounts for, by their request's answer: %v. "+
		"Per-IP-only clients on the healthy masters: %d answers, %d by Redis, %d local, %d 503. Metrics: %s",
		took.Round(time.Millisecond), all.total(), all.answers[byRedis], all.admitted[byRedis], all.answers[byRedis]-all.admitted[byRedis],
		all.answers[byLocal], all.admitted[byLocal], all.answers[unavailable], all.answers[otherAnswer], ms(backAt.Sub(killedAt)),
		consumed, all.admitted[byRedis], lost, timeouts, strays,
		soloTally.total(), soloTally.answers[byRedis], soloTally.answers[byLocal], soloTally.answers[unavailable], metricsSummary(m))
	row.WorstLatency = all.worst
	row.Recovery = backAt.Sub(killedAt)
	t.Log(row.Observed)
}

func refundToMovingSlot(t *testing.T) {
	const perIP, divisor = 6, 2
	row := faultlog.Row{
		Fault:    "Cluster: per-IP rule + global rule; the global rule's slot migrated by hand (ASK phase held open, then MOVED) while per-IP denials refund into it",
		Expected: fmt.Sprintf("global consumption in Redis = requests admitted (+ at most the reported lost refunds); no 5xx, no 503, no fail-mode decision; exactly %d admitted per IP", perIP),
	}
	defer recordRow(t, &row)
	topo := redistest.NewClusterTopology(t, 3, 1)
	prefix := topo.Prefix(t)
	cc := topo.Client(t)
	al := startClusterAuthlimit(t, topo, prefix, map[string]string{
		"AUTHLIMIT_RULES":           fmt.Sprintf("name=per-ip key=ip limit=%d/1h algorithm=sliding_window_log; name=global key=global limit=100000/1h algorithm=sliding_window_log", perIP),
		"AUTHLIMIT_FAIL_MODE":       "local",
		"AUTHLIMIT_LOCAL_DIVISOR":   strconv.Itoa(divisor),
		"AUTHLIMIT_REDIS_TIMEOUT":   clusterBudget.String(),
		"AUTHLIMIT_DENY_CACHE_SIZE": "0", // a cached per-IP denial would keep requests off Redis and off the refund path
	})
	logEvidence(t, al)
	lim := limits{redis: []int64{perIP, 100000}, local: []int64{perIP / divisor, 100000 / divisor}}
	globalSlot := redistest.KeySlot("*")
	owners := slotOwners(t, topo)
	from := topo.Node(t, owners[globalSlot])
	var to *redistest.ClusterNode
	for _, m := range topo.Masters(t) {
		if m != from {
			to = m
			break
		}
	}
	ips := pickIPs(t, 20, map[string]bool{}, func(s int) bool { return s != globalSlot })
	var clients []loadClient
	for _, ip := range ips {
		clients = append(clients, loadClient{ip, "/"})
	}
	before := scrapeMetrics(t, al)
	ld := newLoad(newAsker(al))
	t.Cleanup(ld.halt)
	ld.start(40*time.Millisecond, clients...)
	ld.waitAnswers(t, perIP+10, 30*time.Second, clients...)

	// About a second of refunds each: before the slot moves, with the slot
	// migrating and the key still on the old master, with the key moved
	// (ASK), and after (MOVED). The lost refunds are counted per phase.
	type phase struct {
		name  string
		start time.Time
		lost  float64
	}
	var phases []*phase
	mark := func(name string) {
		now, m := time.Now(), scrapeMetrics(t, al)
		if len(phases) > 0 {
			phases[len(phases)-1].lost = m["authlimit_refunds_lost_total"]
		}
		if name != "" {
			phases = append(phases, &phase{name: name, start: now})
		}
	}
	second := func() { ld.waitAnswers(t, ld.count(clients[0])+25, 30*time.Second, clients...) }
	mark("before the move")
	second()
	mark("slot migrating, key on the old master")
	m := topo.BeginMigration(t, globalSlot, to)
	second()
	mark("key moved, ASK")
	m.MoveKeys(t, 10)
	second()
	mark("slot moved, MOVED")
	m.Finish(t)
	second()
	ld.halt()
	mark("")
	var perPhase []string
	prev := before["authlimit_refunds_lost_total"]
	for _, p := range phases {
		perPhase = append(perPhase, fmt.Sprintf("%s %v", p.name, p.lost-prev))
		prev = p.lost
	}
	phaseOf := func(at time.Time) string {
		name := "warm-up"
		for _, p := range phases {
			if !at.Before(p.start) {
				name = p.name
			}
		}
		return name
	}

	all := newTally()
	var odd []string
	for _, c := range clients {
		as := ld.answers(c)
		ty := newTally()
		ty.add(lim, c, as...)
		all.add(lim, c, as...)
		if got := ty.admitted[byRedis] + ty.admitted[byLocal]; got != perIP {
			t.Errorf("%s: %d admitted, want exactly %d", c, got, perIP)
		}
		for _, a := range as {
			if lim.of(a) != byRedis && len(odd) < 6 {
				odd = append(odd, fmt.Sprintf("%s %s: %v", c, phaseOf(a.sent), a))
			}
		}
	}
	if n := all.total() - all.answers[byRedis]; n > 0 {
		t.Errorf("%d of %d answers not decided by Redis: %d local, %d 503, %d other; e.g. %s", n, all.total(),
			all.answers[byLocal], all.answers[unavailable], all.answers[otherAnswer], strings.Join(odd, "; "))
	}
	if d := phases[0].lost - before["authlimit_refunds_lost_total"]; d > 0 {
		t.Errorf("%v refunds lost before anything moved (README: a request that one rule denies consumes nothing from the others)", d)
	}
	consumed, m2 := settledConsumption(t, al, all.admitted[byRedis], func() int64 { return logTotal(t, cc, prefix, "global", "*") })
	lost := int(m2["authlimit_refunds_lost_total"] - before["authlimit_refunds_lost_total"])
	timeouts := all.answers[unavailable] // each 503 may have consumed
	// A refund reported lost may have run (its reply did not come), so the
	// reported ones bound the consumption from above only.
	if lo, hi := all.admitted[byRedis], all.admitted[byRedis]+lost+timeouts; int(consumed) < lo || int(consumed) > hi {
		t.Errorf("global consumption in Redis %d, want %d admitted, + up to %d lost refunds and %d answered 503: below, a refund was applied twice; above, a refund was silently lost",
			consumed, all.admitted[byRedis], lost, timeouts)
	}
	row.Observed = fmt.Sprintf("slot %d moved from %s to %s; %d requests: %d by Redis (%d admitted, %d denied by the per-IP rule, their global consumption to refund), %d local, %d 503, %d other. "+
		"Global consumption in Redis %d; %d admitted, %d lost refunds reported (by phase: %s), %d answered 503. Metrics: %s",
		globalSlot, from.Addr, to.Addr, all.total(), all.answers[byRedis], all.admitted[byRedis], all.answers[byRedis]-all.admitted[byRedis],
		all.answers[byLocal], all.answers[unavailable], all.answers[otherAnswer], consumed, all.admitted[byRedis], lost, strings.Join(perPhase, ", "), timeouts, metricsSummary(m2))
	row.WorstLatency = all.worst
	t.Log(row.Observed)
}

// settledConsumption waits until the consumption read by consumed is no
// more than admitted plus the lost refunds reported (a refund reported lost
// may have run), or refunds have had time to run their retries (about 4s),
// and returns the last reading and metrics.
func settledConsumption(t *testing.T, al *authlimit, admitted int, consumed func() int64) (int64, map[string]float64) {
	t.Helper()
	deadline := time.Now().Add(6 * time.Second)
	for {
		m := scrapeMetrics(t, al)
		got := consumed()
		if int(got) <= admitted+int(m["authlimit_refunds_lost_total"]) || time.Now().After(deadline) {
			return got, m
		}
		time.Sleep(100 * time.Millisecond)
	}
}
