//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/internal/faultlog"
	"github.com/authlimit/authlimit/internal/redistest"
)

// algorithms are authlimit's algorithms, each tested under its own rule.
var algorithms = []string{"fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "leaky_bucket", "gcra"}

// algorithmRules returns one rule per algorithm, named after it with dashes
// and applying on the path /<algorithm>, each limit per window (a day, so
// that no bucket refills and no window turns during a test).
func algorithmRules(limit int) string {
	var rs []string
	for _, a := range algorithms {
		rs = append(rs, fmt.Sprintf("name=%s key=ip limit=%d/1d algorithm=%s path=/%s", strings.ReplaceAll(a, "_", "-"), limit, a, a))
	}
	return strings.Join(rs, ";")
}

// limitsHold asks limit+2 times per algorithm for a fresh client and checks
// that exactly limit pass, every answer decided by the store (rate-limit
// headers) and no store error or fail-mode decision on the way. It returns
// the answers.
func limitsHold(t *testing.T, l *limiter, ip string, limit int) []answer {
	t.Helper()
	var all []answer
	for _, alg := range algorithms {
		as := l.askN(ip, "/"+alg, limit+2)
		all = append(all, as...)
		if got := countAnswers(as, answer.admitted); got != limit {
			t.Errorf("%s: %d of %d admitted (%s), want exactly %d", alg, got, len(as), tally(as), limit)
		}
		for i, a := range as {
			if !a.counted || (i < limit) != a.admitted() {
				t.Errorf("%s, request %d: %v, want %s with rate-limit headers", alg, i+1, a, map[bool]string{true: "200", false: "429"}[i < limit])
			}
		}
	}
	m := l.sample(t)
	for _, name := range []string{"authlimit_store_errors_total", "authlimit_fail_mode_decisions_total", "authlimit_store_unavailable_total"} {
		if v := m.total(name); v != 0 {
			t.Errorf("%s = %v, want 0", name, v)
		}
	}
	return all
}

// TestFaultRedisTLS: rediss:// with AUTHLIMIT_REDIS_CA_FILE naming the CA
// that signed Redis's certificate: decisions come from Redis and every
// algorithm's limit holds. (A CA that did not sign it: see
// TestFaultStartupRefused.)
func TestFaultRedisTLS(t *testing.T) {
	const limit = 4
	srv := redistest.StartTLS(t)
	l := startLimiter(t, "authlimit-tls", map[string]string{
		"AUTHLIMIT_REDIS_URL":     srv.URL,
		"AUTHLIMIT_REDIS_CA_FILE": srv.CAFile,
		"AUTHLIMIT_RULES":         algorithmRules(limit),
	})
	l.waitReadiness(t, "ready", 10*time.Second)
	as := limitsHold(t, l, "198.51.100.10", limit)
	faults.Record(t, faultlog.Row{
		Fault:        "TLS: rediss:// with the right CA (AUTHLIMIT_REDIS_CA_FILE)",
		Expected:     "decisions from Redis; every algorithm's limit holds",
		Observed:     fmt.Sprintf("%d algorithms × %d requests: %s; no store error", len(algorithms), limit+2, tally(as)),
		WorstLatency: slowest(as),
	})
}

// TestFaultRedisACL: authlimit logged in as a least-privilege user,
// limited to its key prefix and the commands its scripts need: every
// algorithm works and holds its limit, and that user can run neither
// FLUSHALL, KEYS nor CONFIG, nor touch a key outside the prefix.
func TestFaultRedisACL(t *testing.T) {
	const limit, prefix = 4, "authlimit-acl"
	srv := redistest.NewLocal(t)
	user := redistest.NewACLUser(t, srv, prefix)
	l := startLimiter(t, "authlimit-acl", map[string]string{
		"AUTHLIMIT_REDIS_URL":  user.URL,
		"AUTHLIMIT_KEY_PREFIX": prefix,
		"AUTHLIMIT_RULES":      algorithmRules(limit),
	})
	l.waitReadiness(t, "ready", 10*time.Second)
	as := limitsHold(t, l, "198.51.100.11", limit)

	ctx := context.Background()
	keys, err := srv.Client(t).Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, prefix+":") {
			t.Errorf("authlimit wrote %q, outside its prefix", k)
		}
	}
	c := user.Client(t)
	refused := map[string]error{
		"FLUSHALL":                c.FlushAll(ctx).Err(),
		"KEYS *":                  c.Keys(ctx, "*").Err(),
		"CONFIG GET maxmemory":    c.ConfigGet(ctx, "maxmemory").Err(),
		"SET other:key":           c.Set(ctx, "other:key", "x", 0).Err(),
		"GET " + prefix + "x:key": c.Get(ctx, prefix+"x:key").Err(),
	}
	var denied []string
	for cmd, err := range refused {
		if redistest.IsNoPerm(err) {
			denied = append(denied, cmd)
		} else {
			t.Errorf("the ACL user ran %s: %v, want NOPERM", cmd, err)
		}
	}
	if n, _ := srv.Client(t).DBSize(ctx).Result(); n != int64(len(keys)) {
		t.Errorf("the database holds %d keys after the user's attempts, want %d", n, len(keys))
	}
	faults.Record(t, faultlog.Row{
		Fault:        "Least-privilege ACL user (its key prefix and the scripts' commands only)",
		Expected:     "every algorithm works and holds its limit; the user cannot FLUSHALL, KEYS, CONFIG or touch other keys",
		Observed:     fmt.Sprintf("%d algorithms × %d requests: %s, no store error, %d keys all under %q; NOPERM for %d of %d commands tried", len(algorithms), limit+2, tally(as), len(keys), prefix+":", len(denied), len(refused)),
		WorstLatency: slowest(as),
	})
}

// killedOutages are the outages of TestFaultRedisKilled.
var killedOutages = []time.Duration{time.Second, 5 * time.Second, 20 * time.Second}

// TestFaultRedisKilled kills a standalone Redis while four clients keep
// asking, keeps it down for 1 s, 5 s and 20 s, and starts it again (empty).
// Throughout, every answer is a decision within the budget and margin:
// 200, 429, or 503 unavailable. Each client used part of its limit through
// Redis before the kill, and the local fallback (fail mode local, one
// replica) continues from there: no client is admitted beyond its limit
// before Redis is back. Decisions are back on Redis within 2 s of Redis
// answering again (the recovery target) whatever the outage, the prober
// makes at most about one probe per backoff, and afterwards authlimit's
// goroutines and its connections to Redis are back where they were.
func TestFaultRedisKilled(t *testing.T) {
	for _, outage := range killedOutages {
		t.Run(fmt.Sprintf("outage %v", outage), func(t *testing.T) { redisKilled(t, outage) })
	}
}

func redisKilled(t *testing.T, outage time.Duration) {
	const (
		limit    = 40
		before   = 25 // each client's admissions through Redis before the kill
		poolSize = 4
		// The breaker's defaults: probes 100ms apart at first, the gap
		// doubling up to 500ms.
		minBackoff, maxBackoff = 100 * time.Millisecond, 500 * time.Millisecond
		// goroutineSlack is how many more goroutines than before the kill
		// count as "back near the baseline".
		goroutineSlack = 5
	)
	srv := redistest.NewLocal(t)
	l := startLimiter(t, "authlimit", map[string]string{
		"AUTHLIMIT_REDIS_URL":       srv.URL,
		"AUTHLIMIT_RULES":           fmt.Sprintf("name=per-ip key=ip limit=%d/1d algorithm=sliding_window_log", limit),
		"AUTHLIMIT_REDIS_POOL_SIZE": fmt.Sprint(poolSize),
		"AUTHLIMIT_FAIL_MODE":       "local",
	})
	l.waitReadiness(t, "ready", 10*time.Second)
	ips := clientIPs("203.0.113", 4)
	f := l.startFlow(t, ips, "/", 20*time.Millisecond)
	f.waitUntil(t, fmt.Sprintf("%d admissions per client", before), 20*time.Second, func(as []answer) bool {
		per := byClient(as)
		for _, ip := range ips {
			if countAnswers(per[ip], answer.admitted) < before {
				return false
			}
		}
		return true
	})
	m0 := l.sample(t)
	goroutines0 := m0["go_goroutines"]
	conns0, _ := l.redisConns(t, srv.Addr)

	// The outage is [killed, restarting): killed is taken before the kill,
	// as the circuit may open while Stop waits for the process to go, and
	// restarting before the restart, as a probe may find Redis answering
	// before Restart returns.
	killed := time.Now()
	srv.Stop(t)
	time.Sleep(outage) // the fault itself
	restarting := time.Now()
	srv.Restart(t)
	answering := time.Now()
	l.waitMetric(t, "with its circuit closed", 10*time.Second, func(m promSample) bool {
		return maxSeries(m, "authlimit_circuit_state") == 0
	})
	// Redis restarted empty, and the local store had every client at its
	// limit: a 200 now can only be Redis's.
	f.waitUntil(t, "every client admitted again after the restart", 10*time.Second, func(as []answer) bool {
		per := byClient(between(as, answering, time.Now()))
		for _, ip := range ips {
			if countAnswers(per[ip], answer.admitted) == 0 {
				return false
			}
		}
		return true
	})
	as := f.stop()
	m1 := l.sample(t)

	// Leaks: goroutines back near the baseline, connections back to the
	// pool, none left half closed.
	var goroutines1 float64
	var conns1, closeWait1 int
	deadline := time.Now().Add(5 * time.Second)
	for {
		goroutines1 = l.sample(t)["go_goroutines"]
		conns1, closeWait1 = l.redisConns(t, srv.Addr)
		if goroutines1 <= goroutines0+goroutineSlack && conns1 >= 1 && conns1 <= poolSize+4 && closeWait1 == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	events := l.circuitEvents(t)
	opened, okOpen := firstCircuit(events, "open", killed.Add(-time.Second))
	closed, okClosed := firstCircuit(events, "closed", killed)
	recovery := max(closed.Sub(answering), 0)
	probes := m1.total("authlimit_store_probes_total") - m0.total("authlimit_store_probes_total")
	// The backoff doubles from the least to the most (100, 200, 400, 500
	// ms), then stays there.
	maxProbes := int(outage/maxBackoff) + 4
	var transitions int
	for _, e := range events {
		if !e.at.Before(killed.Truncate(time.Millisecond)) {
			transitions++
		}
	}

	per := byClient(as)
	var admittedBefore []string
	overLimit := false
	for _, ip := range ips {
		n := countAnswers(between(per[ip], time.Time{}, restarting), answer.admitted)
		admittedBefore = append(admittedBefore, fmt.Sprint(n))
		overLimit = overLimit || n > limit
	}
	during := between(as, killed, restarting)
	faults.Record(t, faultlog.Row{
		// Padded, so that the table sorts the outages by length.
		Fault:    fmt.Sprintf("Redis killed under load for %2d s, then restarted (empty)", int(outage.Seconds())),
		Expected: fmt.Sprintf("fail mode local within the budget; no client beyond its limit (%d) before Redis is back; decisions back on Redis within 2 s of Redis answering; at most about one probe per backoff; no leaked goroutines or connections", limit),
		Observed: fmt.Sprintf("during the outage: %s; admitted per client before Redis was back: %s; circuit opened %s after the kill, closed %s after Redis answered; %v probes in %v; goroutines %v → %v; connections to Redis %d → %d (pool %d+4), %d in CLOSE_WAIT; every client admitted afresh by the empty Redis",
			tally(during), strings.Join(admittedBefore, ", "), ms(max(opened.Sub(killed), 0)), ms(recovery), probes, outage, goroutines0, goroutines1, conns0, conns1, poolSize, closeWait1),
		WorstLatency: slowest(as),
		Recovery:     recovery,
	})

	checkAnswers(t, "Redis killed", as)
	if overLimit {
		t.Errorf("a client was admitted beyond its limit of %d before Redis was back: %s", limit, strings.Join(admittedBefore, ", "))
	}
	for _, ip := range ips {
		if countAnswers(between(per[ip], killed, restarting), func(a answer) bool { return a.status == 429 }) == 0 {
			t.Errorf("%s was never denied during the outage: the local fallback did not continue from Redis's admissions (answers: %s)", ip, tally(between(per[ip], killed, restarting)))
		}
	}
	if !okOpen || !okClosed {
		t.Fatalf("the log shows no circuit opening and closing around the outage: %v", events)
	}
	if recovery > 2*time.Second {
		t.Errorf("decisions back on Redis %v after it answered again, want within 2s (the recovery target)", recovery)
	}
	if transitions != 2 {
		t.Errorf("%d circuit changes from the kill on, want 2 (open, then closed): %v", transitions, events)
	}
	if probes < 1 || probes > float64(maxProbes) {
		t.Errorf("%v probes during an outage of %v, want 1 to %d (one per backoff, %v doubling to %v)", probes, outage, maxProbes, minBackoff, maxBackoff)
	}
	if goroutines1 > goroutines0+goroutineSlack {
		t.Errorf("goroutines %v before the kill, %v after recovery: a leak", goroutines0, goroutines1)
	}
	if conns1 < 1 || conns1 > poolSize+4 || closeWait1 > 0 {
		t.Errorf("connections to Redis: %d before the kill, %d after recovery (%d in CLOSE_WAIT), want 1 to %d (REDIS_POOL_SIZE %d + 4), none in CLOSE_WAIT", conns0, conns1, closeWait1, poolSize+4, poolSize)
	}
}

// TestFaultRedisStalled stalls Redis for 3 s, 5 s and 20 s by CLIENT PAUSE
// ALL, and for 3 s by DEBUG SLEEP, while one client asks, one request at a time. Every
// decision takes at most the budget and the margin. The first
// BREAKER_FAILURES calls time out and are answered 503 unavailable (they
// may still be decided in Redis), then the circuit opens and the fail mode
// answers. With no traffic at all after that, the circuit closes once Redis
// answers again, within the recovery target (2 s).
func TestFaultRedisStalled(t *testing.T) {
	stalls := []struct {
		name string
		// stall stalls srv for d and returns a channel
		// closed when the stall is over.
		stall func(t *testing.T, srv *redistest.Server, d time.Duration) <-chan struct{}
	}{
		{"CLIENT PAUSE", func(t *testing.T, srv *redistest.Server, d time.Duration) <-chan struct{} {
			// A PING on a connection of its own is held until the pause
			// ends.
			waiter := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 1, ReadTimeout: d + 10*time.Second, MaxRetries: -1})
			t.Cleanup(func() { _ = waiter.Close() })
			if err := waiter.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			redistest.PauseClients(t, srv.Client(t), d)
			over := make(chan struct{})
			go func() {
				defer close(over)
				_ = waiter.Ping(context.Background()).Err()
			}()
			return over
		}},
		{"DEBUG SLEEP", func(t *testing.T, srv *redistest.Server, d time.Duration) <-chan struct{} {
			return redistest.DebugSleep(t, srv.Client(t), d)
		}},
	}
	for _, st := range stalls {
		for _, length := range []time.Duration{3 * time.Second, 5 * time.Second, 20 * time.Second} {
			if st.name == "DEBUG SLEEP" && length > 3*time.Second {
				continue // the same for Redis as a pause; one length shows it
			}
			t.Run(fmt.Sprintf("%s %v", st.name, length), func(t *testing.T) { redisStalled(t, st.name, length, false, st.stall) })
		}
	}
	// Over TLS, a Redis that runs no event loop (DEBUG SLEEP) accepts
	// connections (the kernel does) and completes no handshake: a decision
	// that dials then is bounded by its budget, as over plain TCP.
	t.Run("DEBUG SLEEP 3s over TLS", func(t *testing.T) { redisStalled(t, "DEBUG SLEEP, TLS", 3*time.Second, true, stalls[1].stall) })
}

func redisStalled(t *testing.T, name string, length time.Duration, overTLS bool, stall func(t *testing.T, srv *redistest.Server, d time.Duration) <-chan struct{}) {
	const (
		failures = 5
		ip       = "203.0.113.50"
	)
	env := map[string]string{
		"AUTHLIMIT_RULES":            "name=per-ip key=ip limit=100000/1d",
		"AUTHLIMIT_FAIL_MODE":        "local",
		"AUTHLIMIT_BREAKER_FAILURES": fmt.Sprint(failures),
	}
	var srv *redistest.Server
	if overTLS {
		ts := redistest.StartTLS(t, redistest.WithDebugCommand())
		srv, env["AUTHLIMIT_REDIS_CA_FILE"] = ts.Server, ts.CAFile
	} else {
		srv = redistest.NewLocal(t, redistest.WithDebugCommand())
	}
	env["AUTHLIMIT_REDIS_URL"] = srv.URL
	l := startLimiter(t, "authlimit", env)
	l.waitReadiness(t, "ready", 10*time.Second)
	for _, a := range l.askN(ip, "/", 3) {
		if !a.admitted() || !a.counted {
			t.Fatalf("before the stall: %v, want 200 from Redis", a)
		}
	}
	m0 := l.sample(t)

	over := stall(t, srv, length)
	stalled := time.Now()
	var as []answer
	for time.Since(stalled) < length-time.Second {
		as = append(as, l.ask(ip, "/"))
		time.Sleep(20 * time.Millisecond)
	}
	m1 := l.sample(t) // the last request's; none follows until the circuit closed
	<-over
	ended := time.Now()
	closedAt := l.waitMetric(t, "with its circuit closed", 10*time.Second, func(m promSample) bool {
		return maxSeries(m, "authlimit_circuit_state") == 0
	})
	m2 := l.sample(t)
	recovery := max(closedAt.Sub(ended), 0)
	after := l.ask(ip, "/")
	m3 := l.sample(t)

	unavailable := 0
	for _, a := range as {
		if !a.unavailable() {
			break
		}
		unavailable++
	}
	delta := func(m promSample, series string) float64 { return m[series] - m0[series] }
	faults.Record(t, faultlog.Row{
		// Padded, so that the table sorts the stalls by length.
		Fault:    fmt.Sprintf("Redis stalled %2d s (%s)", int(length.Seconds()), name),
		Expected: fmt.Sprintf("every decision within the budget (%v) + margin; 503 unavailable for the first %d timeouts, then the fail mode (local); the circuit closes without traffic within 2 s of Redis answering", decisionBudget, failures),
		Observed: fmt.Sprintf("%d requests, one at a time: the first %d answered 503, then %s; %v timeouts; circuit opened %v×, closed %s after the stall ended with no request in between",
			len(as), unavailable, tally(as[unavailable:]), delta(m1, `authlimit_store_errors_total{kind="timeout"}`),
			delta(m2, `authlimit_circuit_transitions_total{state="open"}`), ms(recovery)),
		WorstLatency: slowest(as),
		Recovery:     recovery,
	})

	checkAnswers(t, name, as)
	if unavailable != failures {
		t.Errorf("%d answers 503 before the fail mode, want %d (BREAKER_FAILURES): %v", unavailable, failures, as[:min(len(as), failures+2)])
	}
	for _, a := range as[unavailable:] {
		if !a.counted || a.status != 200 {
			t.Errorf("after the circuit opened: %v, want 200 from the local store", a)
		}
	}
	if got := delta(m1, `authlimit_store_errors_total{kind="timeout"}`); got != failures {
		t.Errorf("%v timeouts counted, want %d", got, failures)
	}
	if got, want := delta(m1, `authlimit_fail_mode_decisions_total{mode="local"}`), float64(len(as)-unavailable); got != want {
		t.Errorf("%v fail-mode decisions, want %v", got, want)
	}
	if got := delta(m2, `authlimit_circuit_transitions_total{state="open"}`); got != 1 {
		t.Errorf("the circuit opened %v times, want once", got)
	}
	if m2.total("authlimit_requests_total") != m1.total("authlimit_requests_total") {
		t.Errorf("requests came between the stall's end and the circuit closing; it should close without traffic")
	}
	if recovery > 2*time.Second {
		t.Errorf("the circuit closed %v after the stall ended, want within 2s", recovery)
	}
	if !after.admitted() || !after.counted || m3.total("authlimit_store_errors_total") != m2.total("authlimit_store_errors_total") ||
		m3.total("authlimit_fail_mode_decisions_total") != m2.total("authlimit_fail_mode_decisions_total") {
		t.Errorf("after the circuit closed: %v, want a 200 decided by Redis", after)
	}
}

// TestFaultRedisSlowLink puts a latency proxy between authlimit and Redis.
// At +5 ms each way, decisions stay on Redis, well within the budget, with
// no store error. At +60 ms each way (a round trip of 120 ms, above the
// 50 ms budget) the budget holds: every answer within the budget and the
// margin. Calls that time out may still be decided, and consume, in Redis;
// the local fallback counts each as consumed too, so with one replica and
// LOCAL_DIVISOR=1 the client's admissions through the whole test, Redis's
// and the fallback's together, never exceed its limit.
func TestFaultRedisSlowLink(t *testing.T) {
	const (
		limit = 30
		fast  = 10 // requests at +5 ms
		ip    = "203.0.113.60"
	)
	srv := redistest.NewLocal(t)
	px := redistest.NewLatencyProxy(t, srv.Addr)
	l := startLimiter(t, "authlimit", map[string]string{
		"AUTHLIMIT_REDIS_URL":     "redis://" + px.Addr,
		"AUTHLIMIT_RULES":         fmt.Sprintf("name=per-ip key=ip limit=%d/1d algorithm=sliding_window_log", limit),
		"AUTHLIMIT_REDIS_TIMEOUT": decisionBudget.String(),
		"AUTHLIMIT_FAIL_MODE":     "local",
		"AUTHLIMIT_LOCAL_DIVISOR": "1",
	})
	l.waitReadiness(t, "ready", 10*time.Second)

	px.SetDelay(5 * time.Millisecond)
	slow := l.askN(ip, "/", fast)
	m1 := l.sample(t)

	px.SetDelay(60 * time.Millisecond)
	changed := time.Now()
	var slower []answer
	for time.Since(changed) < 4*time.Second {
		slower = append(slower, l.ask(ip, "/"))
		time.Sleep(10 * time.Millisecond)
	}
	m2 := l.sample(t)
	changes := map[string]int{}
	for _, e := range l.circuitEvents(t) {
		if !e.at.Before(changed.Truncate(time.Millisecond)) {
			changes[e.state]++
		}
	}

	// What Redis counted: the newest member of the client's log is its
	// running total. Calls that timed out land 60 ms after they were sent.
	admin := srv.Client(t)
	ctx := context.Background()
	consumed := func() int64 {
		keys, err := admin.Keys(ctx, "authlimit:per-ip:*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("the client's key in Redis: %v, %v", keys, err)
		}
		last, err := admin.ZRange(ctx, keys[0], -1, -1).Result()
		if err != nil || len(last) != 1 {
			t.Fatalf("the client's log in Redis: %v, %v", last, err)
		}
		n, err := logMemberTotal(last[0])
		if err != nil {
			t.Fatalf("log member %q: %v", last[0], err)
		}
		return n
	}
	var inRedis int64
	deadline := time.Now().Add(5 * time.Second)
	for prev := int64(-1); ; prev = inRedis {
		time.Sleep(200 * time.Millisecond) // longer than a delayed round trip
		if inRedis = consumed(); inRedis == prev || time.Now().After(deadline) {
			break
		}
	}

	admitted := countAnswers(slow, answer.admitted) + countAnswers(slower, answer.admitted)
	unavailable := countAnswers(slower, answer.unavailable)
	faults.Record(t, faultlog.Row{
		Fault:    "Slow link: +5 ms, then +60 ms each way (latency proxy; budget 50 ms)",
		Expected: fmt.Sprintf("+5 ms: decisions on Redis, no store error; +60 ms: every answer within the budget + margin, and the client's admissions across Redis and the local fallback never above its limit (%d)", limit),
		Observed: fmt.Sprintf("+5 ms: %s, worst %v, %v store errors; +60 ms: %s in 4 s, %v timeouts, the circuit opened %d× and closed %d× (a probe must decide within the budget, which the slow link never allows), worst %v; admitted in all %d of %d; Redis counted %d (its %d admissions and timed-out calls it still ran; the fallback counted the timed-out calls as consumed)",
			tally(slow), slowest(slow).Round(100*time.Microsecond), m1.total("authlimit_store_errors_total"), tally(slower), m2[`authlimit_store_errors_total{kind="timeout"}`],
			changes["open"], changes["closed"], slowest(slower).Round(100*time.Microsecond), admitted, limit, inRedis, countAnswers(slow, answer.admitted)),
		WorstLatency: slowest(append(slow, slower...)),
	})

	for _, a := range slow {
		if !a.admitted() || !a.counted || a.latency() > decisionBudget {
			t.Errorf("+5 ms: %v, want 200 from Redis within %v", a, decisionBudget)
		}
	}
	for _, name := range []string{"authlimit_store_errors_total", "authlimit_fail_mode_decisions_total"} {
		if v := m1.total(name); v != 0 {
			t.Errorf("+5 ms: %s = %v, want 0", name, v)
		}
	}
	checkAnswers(t, "+60 ms", slower)
	if admitted > limit {
		t.Errorf("admitted %d in all, above the limit of %d: a call that timed out was admitted again by the fallback", admitted, limit)
	}
	if inRedis > limit || inRedis < int64(countAnswers(slow, answer.admitted)) {
		t.Errorf("Redis counted %d, want between the %d it admitted at +5 ms and the limit %d", inRedis, countAnswers(slow, answer.admitted), limit)
	}
	if unavailable == 0 || countAnswers(slower, func(a answer) bool { return a.status == 429 }) == 0 {
		t.Errorf("+60 ms: %s; want 503s (calls past the budget) and the fallback's 429s once the limit is used", tally(slower))
	}
}

// TestFaultRedisRestartedEmpty restarts Redis without its data. State is
// lost by design: limits start fresh. A client that had used part of its
// quota, and one that was at its limit (denied), each get a whole new quota
// (exactly the limit) from the empty Redis, on an authlimit with the deny
// cache (the default) and on one without; nothing crashes; authlimit's
// scripts come back (NOSCRIPT is answered by loading them), also when only
// the script cache is flushed.
func TestFaultRedisRestartedEmpty(t *testing.T) {
	const limit = 5
	srv := redistest.NewLocal(t)
	env := func(prefix, denyCache string) map[string]string {
		return map[string]string{
			"AUTHLIMIT_REDIS_URL":       srv.URL,
			"AUTHLIMIT_RULES":           fmt.Sprintf("name=per-ip key=ip limit=%d/1d algorithm=sliding_window_log", limit),
			"AUTHLIMIT_FAIL_MODE":       "local",
			"AUTHLIMIT_KEY_PREFIX":      prefix,
			"AUTHLIMIT_DENY_CACHE_SIZE": denyCache,
		}
	}
	instances := []struct {
		name string
		l    *limiter
	}{
		{"deny cache on (default)", startLimiter(t, "authlimit-cached", env("cached", "100000"))},
		{"deny cache off", startLimiter(t, "authlimit-uncached", env("uncached", "0"))},
	}
	const denied, partial = "203.0.113.70", "203.0.113.71"
	type client struct {
		ip           string
		before       []answer
		after, quota []answer
		fresh        time.Duration
	}
	clients := map[string][]*client{}
	m0 := map[string]promSample{}
	for _, in := range instances {
		in.l.waitReadiness(t, "ready", 10*time.Second)
		clients[in.name] = []*client{
			{ip: denied, before: in.l.askN(denied, "/", limit+1)},
			{ip: partial, before: in.l.askN(partial, "/", limit-2)},
		}
		m0[in.name] = in.l.sample(t)
	}

	srv.Stop(t)
	srv.Restart(t)
	var observed []string
	for _, in := range instances {
		for _, c := range clients[in.name] {
			// Ask until admitted, for at most 3 s: Redis answers already.
			asked := time.Now()
			for len(c.after) == 0 || !c.after[len(c.after)-1].admitted() {
				if time.Since(asked) > 3*time.Second {
					break
				}
				c.after = append(c.after, in.l.ask(c.ip, "/"))
				time.Sleep(10 * time.Millisecond)
			}
			if last := c.after[len(c.after)-1]; last.admitted() {
				c.fresh = last.end.Sub(asked)
				c.quota = append(c.after[len(c.after)-1:], in.l.askN(c.ip, "/", limit)...)
				c.after = c.after[:len(c.after)-1]
			}
		}
		m := in.l.sample(t)
		hits := m.total("authlimit_deny_cache_hits_total") - m0[in.name].total("authlimit_deny_cache_hits_total")
		var parts []string
		for _, c := range clients[in.name] {
			what := map[string]string{denied: "at its limit", partial: fmt.Sprintf("%d of %d used", limit-2, limit)}[c.ip]
			if c.fresh == 0 {
				parts = append(parts, fmt.Sprintf("client %s: %s for 3 s, never admitted (Retry-After %d s)", what, tally(c.after), c.after[len(c.after)-1].retryAfter))
				continue
			}
			first := "on its first request"
			if len(c.after) > 0 {
				first = "after " + tally(c.after)
			}
			parts = append(parts, fmt.Sprintf("client %s: admitted %s after the restart, %s, then %s", what, first, ms(c.fresh), tally(c.quota)))
		}
		observed = append(observed, fmt.Sprintf("%s: %s; deny cache hits %v", in.name, strings.Join(parts, "; "), hits))
	}
	noscript := errorStat(t, srv, "NOSCRIPT")

	// The script cache alone is lost (SCRIPT FLUSH, or a failover to a
	// replica that never loaded the scripts).
	ctx := context.Background()
	l := instances[0].l
	s0 := l.sample(t)
	if err := srv.Client(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	flushed := l.askN("203.0.113.72", "/", 2)
	s1 := l.sample(t)
	noscriptFlushed := errorStat(t, srv, "NOSCRIPT") - noscript

	var all []answer
	var recovery time.Duration
	for _, in := range instances {
		for _, c := range clients[in.name] {
			all = append(append(append(all, c.before...), c.after...), c.quota...)
			recovery = max(recovery, c.fresh)
		}
	}
	faults.Record(t, faultlog.Row{
		Fault:    "Redis restarted empty (state lost)",
		Expected: "limits start fresh: every client, also one at its limit, gets a whole new quota; nothing crashes; the scripts are loaded again (NOSCRIPT handled)",
		Observed: fmt.Sprintf("%s; NOSCRIPT %d× after the restart; after SCRIPT FLUSH: %s, NOSCRIPT %d×, %v store errors",
			strings.Join(observed, ". "), noscript, tally(flushed), noscriptFlushed,
			s1.total("authlimit_store_errors_total")-s0.total("authlimit_store_errors_total")),
		WorstLatency: slowest(all),
		Recovery:     recovery,
	})

	checkAnswers(t, "restarted empty", all)
	for _, in := range instances {
		for _, c := range clients[in.name] {
			if got, want := countAnswers(c.before, answer.admitted), min(len(c.before), limit); got != want {
				t.Errorf("%s, %s before the restart: %s, want %d admitted", in.name, c.ip, tally(c.before), want)
			}
			if c.fresh == 0 {
				t.Errorf("%s, %s: %s in the 3 s after Redis restarted empty, never admitted: limits do not start fresh (the deny cache keeps a denial Redis no longer knows until its Retry-After)", in.name, c.ip, tally(c.after))
				continue
			}
			if got := countAnswers(c.quota, answer.admitted); got != limit || c.quota[len(c.quota)-1].status != 429 {
				t.Errorf("%s, %s after the restart: %s, want a fresh quota of exactly %d, then 429", in.name, c.ip, tally(c.quota), limit)
			}
		}
		if in.l.exited() || strings.Contains(in.l.logText(t), "level=ERROR") {
			t.Errorf("%s: authlimit exited or logged an error:\n%s", in.name, lastLines(in.l.logText(t), 20))
		}
	}
	for _, a := range flushed {
		if !a.admitted() || !a.counted {
			t.Errorf("after SCRIPT FLUSH: %v, want 200 from Redis", a)
		}
	}
	if s1.total("authlimit_store_errors_total") != s0.total("authlimit_store_errors_total") || s1.total("authlimit_fail_mode_decisions_total") != s0.total("authlimit_fail_mode_decisions_total") {
		t.Errorf("after SCRIPT FLUSH: store errors or fail-mode decisions; NOSCRIPT must be answered by loading the script")
	}
	if noscriptFlushed < 1 {
		t.Errorf("Redis answered NOSCRIPT %d times after SCRIPT FLUSH: the test did not reach the NOSCRIPT path", noscriptFlushed)
	}
}

// errorStat returns Redis's count of error replies with the prefix (INFO
// errorstats), 0 if none.
func errorStat(t *testing.T, srv *redistest.Server, prefix string) int {
	t.Helper()
	info, err := srv.Client(t).Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "errorstat_"+prefix+":count="); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// TestFaultSentinelFailover kills the master of a Sentinel setup (one
// master, one replica, three sentinels) while clients keep asking two
// authlimits in sentinel mode: one with fail mode open, whose fail-mode
// answers carry no rate-limit headers, so that every answer shows whether
// Redis decided it, and one with fail mode local. During the failover
// every answer is a fail-mode answer or 503 unavailable, within the budget
// and margin. Once the replica is promoted, decisions come from Redis
// again, measured from the promotion and from the kill. Where Redis
// decided, each client's limit holds exactly across the whole test: the
// promoted replica has every admission the old master made. Fail mode
// local admits no client beyond its limit before Redis is back.
func TestFaultSentinelFailover(t *testing.T) {
	const (
		limit  = 60
		before = 20 // each client's admissions through Redis before the kill
	)
	topo := redistest.NewSentinelTopology(t)
	sentinels := topo.SentinelAddrs()
	env := func(mode string) map[string]string {
		return map[string]string{
			"AUTHLIMIT_REDIS_MODE":    "sentinel",
			"AUTHLIMIT_REDIS_URL":     "redis://" + sentinels[0],
			"AUTHLIMIT_REDIS_ADDRS":   strings.Join(sentinels[1:], ","),
			"AUTHLIMIT_REDIS_MASTER":  topo.MasterName,
			"AUTHLIMIT_REDIS_TIMEOUT": decisionBudget.String(),
			"AUTHLIMIT_FAIL_MODE":     mode,
			"AUTHLIMIT_KEY_PREFIX":    "sentinel-" + mode,
			"AUTHLIMIT_RULES":         fmt.Sprintf("name=per-ip key=ip limit=%d/1d algorithm=sliding_window_log", limit),
		}
	}
	open := startLimiter(t, "authlimit-open", env("open"))
	local := startLimiter(t, "authlimit-local", env("local"))
	open.waitReadiness(t, "ready", 10*time.Second)
	local.waitReadiness(t, "ready", 10*time.Second)
	openIPs, localIPs := clientIPs("203.0.113", 4), clientIPs("198.51.100", 4)
	openFlow := open.startFlow(t, openIPs, "/", 20*time.Millisecond)
	localFlow := local.startFlow(t, localIPs, "/", 20*time.Millisecond)
	usedSome := func(ips []string) func([]answer) bool {
		return func(as []answer) bool {
			per := byClient(as)
			for _, ip := range ips {
				if countAnswers(per[ip], answer.admitted) < before {
					return false
				}
			}
			return true
		}
	}
	openFlow.waitUntil(t, "used part of the limit", 20*time.Second, usedSome(openIPs))
	localFlow.waitUntil(t, "used part of the limit", 20*time.Second, usedSome(localIPs))
	m0 := map[*limiter]promSample{open: open.sample(t), local: local.sample(t)}

	killing := time.Now()
	dead := topo.KillMaster(t)
	killed := time.Now()
	promotedTo, took := topo.WaitFailover(t, 30*time.Second)
	promoted := time.Now()

	// Fail mode open: back on Redis at the first answer with rate-limit
	// headers that was asked for after the kill.
	var backOpen time.Time
	openFlow.waitUntil(t, "deciding with Redis again", 20*time.Second, func(as []answer) bool {
		for _, a := range as {
			if a.counted && !a.start.Before(killed) {
				backOpen = a.end
				return true
			}
		}
		return false
	})
	// Fail mode local: back on Redis when its circuit closed.
	var closedLocal time.Time
	waitFor(t, local.proc, "closing its circuit", func() bool {
		var ok bool
		closedLocal, ok = firstCircuit(local.circuitEvents(t), "closed", killed)
		return ok
	})
	// Every open client reaches its limit on Redis.
	openFlow.waitUntil(t, "denied by Redis", 30*time.Second, func(as []answer) bool {
		per := byClient(between(as, backOpen, time.Now()))
		for _, ip := range openIPs {
			if countAnswers(per[ip], func(a answer) bool { return a.counted && a.status == 429 }) == 0 {
				return false
			}
		}
		return true
	})
	// And so does every local client, counting from the close.
	localFlow.waitUntil(t, "denied by Redis", 30*time.Second, func(as []answer) bool {
		per := byClient(as)
		for _, ip := range localIPs {
			if countAnswers(per[ip], func(a answer) bool { return a.status == 429 && a.start.After(closedLocal.Add(time.Millisecond)) }) == 0 {
				return false
			}
		}
		return true
	})
	openAs, localAs := openFlow.stop(), localFlow.stop()
	m1 := map[*limiter]promSample{open: open.sample(t), local: local.sample(t)}
	delta := func(l *limiter, name string) float64 { return m1[l].total(name) - m0[l].total(name) }

	// Fail mode open: what answered while Redis could not.
	openDuring := between(openAs, killed, backOpen)
	var exact []string
	exactOK := true
	perOpen := byClient(openAs)
	for _, ip := range openIPs {
		byRedis := countAnswers(perOpen[ip], func(a answer) bool { return a.admitted() && a.counted })
		unavailable := countAnswers(perOpen[ip], answer.unavailable)
		exact = append(exact, fmt.Sprint(byRedis))
		if byRedis > limit || unavailable == 0 && byRedis != limit || byRedis < limit-unavailable {
			exactOK = false
		}
	}
	// Fail mode local: admissions before its circuit closed, and what
	// Redis, which never learns of the local admissions, admitted after.
	safeBefore := closedLocal.Add(-2 * time.Millisecond) // the log's millisecond stamps
	perLocal := byClient(localAs)
	var beforeBack, afterBack, byRedis []string
	localOver, redisOver := false, false
	for _, ip := range localIPs {
		n := countAnswers(between(perLocal[ip], time.Time{}, safeBefore), answer.admitted)
		beforeBack = append(beforeBack, fmt.Sprint(n))
		localOver = localOver || n > limit
		// Redis decided what ended before the kill and what was asked
		// after the close; in between, and around both edges, the local
		// store may have.
		after := countAnswers(perLocal[ip], func(a answer) bool { return a.admitted() && a.start.After(closedLocal.Add(time.Millisecond)) })
		afterBack = append(afterBack, fmt.Sprint(after))
		r := countAnswers(between(perLocal[ip], time.Time{}, killing), answer.admitted) + after
		byRedis = append(byRedis, fmt.Sprint(r))
		redisOver = redisOver || r > limit
	}
	localDuring := between(localAs, killed, safeBefore)

	faults.Record(t, faultlog.Row{
		Fault:    "Sentinel: master killed under load, its replica in sync (fail mode open)",
		Expected: "during the failover fail-mode answers (200 without headers) or 503, within the budget + margin; decisions back on Redis soon after the promotion; the limit decided by Redis exact across the failover, the replica having every write the master answered",
		Observed: fmt.Sprintf("%s → %s promoted %s after the kill; during the failover %s; back on Redis %s after the promotion (%s after the kill); Redis-decided admissions per client %s of %d; %v probes",
			dead.Addr, promotedTo.Addr, ms(took), tally(openDuring), ms(backOpen.Sub(promoted)), ms(backOpen.Sub(killed)), strings.Join(exact, ", "), limit, delta(open, "authlimit_store_probes_total")),
		WorstLatency: slowest(openAs),
		Recovery:     backOpen.Sub(killed),
	})
	faults.Record(t, faultlog.Row{
		Fault:    "Sentinel: master killed under load, its replica in sync (fail mode local)",
		Expected: "during the failover the local fallback (or 503) within the budget + margin, continuing from Redis's admissions: no client beyond its limit before Redis is back",
		Observed: fmt.Sprintf("during the failover %s; circuit closed %s after the promotion (%s after the kill); admitted per client before that %s of %d; after it Redis, which does not learn of local admissions, admitted %s more (Redis-decided in all: %s)",
			tally(localDuring), ms(closedLocal.Sub(promoted)), ms(closedLocal.Sub(killed)), strings.Join(beforeBack, ", "), limit, strings.Join(afterBack, ", "), strings.Join(byRedis, ", ")),
		WorstLatency: slowest(localAs),
		Recovery:     closedLocal.Sub(killed),
	})

	checkAnswers(t, "fail mode open", openAs)
	checkAnswers(t, "fail mode local", localAs)
	for _, a := range openDuring {
		if a.start.Before(killed) {
			continue // asked before the kill: Redis may have answered
		}
		if !(a.status == 200 && !a.counted) && !a.unavailable() {
			t.Errorf("fail mode open, during the failover: %v, want 200 without rate-limit headers or 503 unavailable", a)
		}
	}
	if !exactOK {
		t.Errorf("fail mode open: Redis-decided admissions per client %s, want exactly %d (less only by the client's 503s, which may have been decided in Redis)", strings.Join(exact, ", "), limit)
	}
	for _, a := range localDuring {
		if !a.start.Before(killed) && !a.counted && !a.unavailable() {
			t.Errorf("fail mode local, during the failover: %v, want a decision of the local store or 503 unavailable", a)
		}
	}
	if redisOver {
		t.Errorf("fail mode local: Redis-decided admissions per client %s, above the limit of %d", strings.Join(byRedis, ", "), limit)
	}
	if localOver {
		t.Errorf("fail mode local: admitted per client before Redis was back %s, above the limit of %d", strings.Join(beforeBack, ", "), limit)
	}
	for _, ip := range localIPs {
		if countAnswers(between(perLocal[ip], killed, safeBefore), func(a answer) bool { return a.status == 429 }) == 0 {
			t.Errorf("fail mode local: %s was never denied during the failover (%s): the fallback did not continue from Redis's admissions", ip, tally(between(perLocal[ip], killed, safeBefore)))
		}
	}
	if backOpen.Sub(promoted) > 2*time.Second || closedLocal.Sub(promoted) > 2*time.Second {
		t.Errorf("decisions back on Redis %v (open) and %v (local) after the promotion, want within 2s", backOpen.Sub(promoted), closedLocal.Sub(promoted))
	}
}
