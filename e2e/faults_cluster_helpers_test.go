//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/internal/faultlog"
	"github.com/authlimit/authlimit/internal/redistest"
)

// startClusterAuthlimit starts authlimit in cluster mode on topo, seeded
// with every node, trusting only 127.0.0.1 as a proxy (the tests send
// X-Forwarded-For from there), with its keys under a prefix of its own.
// env adds to or overrides those settings.
func startClusterAuthlimit(t *testing.T, topo *redistest.ClusterTopology, prefix string, env map[string]string) *authlimit {
	t.Helper()
	addrs := topo.Addrs()
	vars := map[string]string{
		"AUTHLIMIT_REDIS_URL":       "redis://" + addrs[0],
		"AUTHLIMIT_REDIS_ADDRS":     strings.Join(addrs[1:], ","),
		"AUTHLIMIT_REDIS_MODE":      "cluster",
		"AUTHLIMIT_KEY_PREFIX":      prefix,
		"AUTHLIMIT_TRUSTED_PROXIES": "127.0.0.1/32",
	}
	for k, v := range env {
		vars[k] = v
	}
	return startAuthlimit(t, "authlimit", vars)
}

// source is what decided an answer, told apart by its status, problem type
// and X-RateLimit-Limit: Redis's limits and the local fail mode's (divided
// by AUTHLIMIT_LOCAL_DIVISOR) differ on purpose in every test.
type source string

const (
	byRedis     source = "redis"       // 200 or deny with one of Redis's limits
	byLocal     source = "local"       // 200 or deny with one of the local limits
	failedOpen  source = "open"        // 200 without rate-limit headers
	unavailable source = "unavailable" // 503 urn:authlimit:unavailable
	otherAnswer source = "other"       // anything else: a transport error, a 500, a surprise
)

// clusterAnswer is one answer authlimit gave a cluster test client.
type clusterAnswer struct {
	sent    time.Time
	took    time.Duration
	status  int
	limit   string // X-RateLimit-Limit, "" when absent
	problem string // the problem type of a denial, "" otherwise
	err     error  // a transport error
}

func (a clusterAnswer) admitted() bool { return a.err == nil && a.status == http.StatusOK }

func (a clusterAnswer) String() string {
	if a.err != nil {
		return fmt.Sprintf("error after %v: %v", a.took.Round(time.Millisecond), a.err)
	}
	return fmt.Sprintf("%d %s limit=%q after %v", a.status, a.problem, a.limit, a.took.Round(time.Millisecond))
}

// limits says which X-RateLimit-Limit values Redis gives and which the
// local fail mode gives.
type limits struct {
	redis, local []int64
}

func (l limits) of(a clusterAnswer) source {
	switch {
	case a.err != nil:
		return otherAnswer
	case a.status == http.StatusServiceUnavailable && a.problem == "urn:authlimit:unavailable":
		return unavailable
	case a.status == http.StatusOK && a.limit == "":
		return failedOpen
	case a.status != http.StatusOK && a.status != http.StatusTooManyRequests:
		return otherAnswer
	case a.status == http.StatusTooManyRequests && a.problem != "urn:authlimit:rate-limited":
		return otherAnswer
	}
	n, err := strconv.ParseInt(a.limit, 10, 64)
	if err != nil {
		return otherAnswer
	}
	for _, v := range l.redis {
		if n == v {
			return byRedis
		}
	}
	for _, v := range l.local {
		if n == v {
			return byLocal
		}
	}
	return otherAnswer
}

// asker sends decisions to one authlimit over kept-alive connections from
// 127.0.0.1, as a proxy would.
type asker struct {
	url  string
	http *http.Client
}

func newAsker(a *authlimit) *asker {
	return &asker{url: "http://" + a.addr + "/auth", http: &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute},
	}}
}

// ask asks for a decision for the client ip on path.
func (k *asker) ask(ip, path string) clusterAnswer {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, k.url, nil)
	if err != nil {
		return clusterAnswer{sent: time.Now(), err: err}
	}
	req.Header.Set("X-Forwarded-For", ip)
	req.Header.Set("X-Forwarded-Uri", path)
	a := clusterAnswer{sent: time.Now()}
	resp, err := k.http.Do(req)
	if err != nil {
		a.took, a.err = time.Since(a.sent), err
		return a
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	a.took, a.err = time.Since(a.sent), err
	a.status = resp.StatusCode
	a.limit = resp.Header.Get("X-RateLimit-Limit")
	if _, rest, ok := strings.Cut(string(body), `"type":"`); ok {
		a.problem, _, _ = strings.Cut(rest, `"`)
	}
	return a
}

// loadClient is one client of a load: an IP asking about one path.
type loadClient struct {
	ip, path string
}

func (c loadClient) String() string { return c.ip + c.path }

// load keeps clients asking, each in its own goroutine at its own pace,
// and keeps every answer.
type load struct {
	k    *asker
	mu   sync.Mutex
	got  map[loadClient][]clusterAnswer
	stop chan struct{}
	wg   sync.WaitGroup
}

func newLoad(k *asker) *load {
	return &load{k: k, got: map[loadClient][]clusterAnswer{}, stop: make(chan struct{})}
}

// start makes each client ask every interval until stopped (a pace, not a
// wait for readiness).
func (l *load) start(every time.Duration, clients ...loadClient) {
	for _, c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				a := l.k.ask(c.ip, c.path)
				l.mu.Lock()
				l.got[c] = append(l.got[c], a)
				l.mu.Unlock()
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
			}
		}()
	}
}

// halt stops every client and waits for their last answers.
func (l *load) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// answers returns a copy of what c got so far.
func (l *load) answers(c loadClient) []clusterAnswer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]clusterAnswer(nil), l.got[c]...)
}

// count returns how many answers c got.
func (l *load) count(c loadClient) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.got[c])
}

// waitAnswers polls until every client has at least n answers.
func (l *load) waitAnswers(t *testing.T, n int, timeout time.Duration, clients ...loadClient) {
	t.Helper()
	waitUntil(t, timeout, func() error {
		for _, c := range clients {
			if got := l.count(c); got < n {
				return fmt.Errorf("client %s has %d answers, want %d", c, got, n)
			}
		}
		return nil
	})
}

// waitUntil polls check every 20ms until it returns nil, or fails t with its
// last error once timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clusterTally counts answers by what decided them, and the admissions of each.
type clusterTally struct {
	answers, admitted map[source]int
	worst             time.Duration
	others            []string // the first few surprises
}

func newTally() *clusterTally {
	return &clusterTally{answers: map[source]int{}, admitted: map[source]int{}}
}

func (ty *clusterTally) add(l limits, c loadClient, as ...clusterAnswer) {
	for _, a := range as {
		s := l.of(a)
		ty.answers[s]++
		if a.admitted() {
			ty.admitted[s]++
		}
		ty.worst = max(ty.worst, a.took)
		if s == otherAnswer && len(ty.others) < 5 {
			ty.others = append(ty.others, fmt.Sprintf("%s at %s: %v", c, a.sent.Format("15:04:05.000"), a))
		}
	}
}

func (ty *clusterTally) total() int {
	n := 0
	for _, v := range ty.answers {
		n += v
	}
	return n
}

// metrics reads authlimit's /metrics into a map from series (name and
// labels, as printed) to value.
func scrapeMetrics(t *testing.T, a *authlimit) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + a.addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read /metrics: %v", err)
	}
	return m
}

// metricsSummary prints the fault-related series for a log or a message.
func metricsSummary(m map[string]float64) string {
	var keys []string
	for k := range m {
		for _, p := range []string{"authlimit_requests_total", "authlimit_store_errors_total", "authlimit_store_unavailable_total",
			"authlimit_fail_mode_decisions_total", "authlimit_circuit_", "authlimit_store_probes_total", "authlimit_refunds_lost_total"} {
			if strings.HasPrefix(k, p) && m[k] != 0 {
				keys = append(keys, k)
				break
			}
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %g; ", k, m[k])
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// slotOwners maps each slot to the id of the master serving it, as the
// topology's first answering node sees it.
func slotOwners(t *testing.T, topo *redistest.ClusterTopology) []string {
	t.Helper()
	owners := make([]string, redistest.Slots)
	for _, v := range topo.State(t) {
		if !v.Master || v.Failed {
			continue
		}
		for _, r := range v.Slots {
			for s := r.First; s <= r.Last; s++ {
				owners[s] = v.ID
			}
		}
	}
	return owners
}

// pickIPs returns n client IPs from 198.18.0.0/15 (the benchmarking range)
// whose key slot satisfies keep and that are not in used, and adds them to
// used. For key=ip the key tag is the address itself, so the slot of every
// storage key of the client is KeySlot(ip).
func pickIPs(t *testing.T, n int, used map[string]bool, keep func(slot int) bool) []string {
	t.Helper()
	var ips []string
	for i := 1; i < 1<<17 && len(ips) < n; i++ {
		ip := fmt.Sprintf("198.%d.%d.%d", 18+i>>16, i>>8&255, i&255)
		if used[ip] || !keep(redistest.KeySlot(ip)) {
			continue
		}
		used[ip] = true
		ips = append(ips, ip)
	}
	if len(ips) < n {
		t.Fatalf("found only %d of %d client IPs", len(ips), n)
	}
	return ips
}

// logTotal returns what a sliding_window_log rule's log in Redis holds for
// one key tag: the newest entry's running total minus the oldest's, which
// is every consumption within the window that was not refunded. The key
// is found by SCAN, so that the test does not spell the storage key's
// algorithm letter; 0 if there is no such key.
func logTotal(t *testing.T, cc *redis.ClusterClient, prefix, rule, tag string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pattern := fmt.Sprintf("%s:%s:{%s}:*", prefix, rule, tag)
	keys, err := clusterKeys(ctx, cc, pattern)
	if err != nil {
		t.Fatalf("find %s: %v", pattern, err)
	}
	switch len(keys) {
	case 0:
		return 0
	case 1:
	default:
		t.Fatalf("%s matches %v, want one key", pattern, keys)
	}
	first, err := cc.ZRange(ctx, keys[0], 0, 0).Result()
	if err != nil {
		t.Fatalf("ZRANGE %s 0 0: %v", keys[0], err)
	}
	last, err := cc.ZRange(ctx, keys[0], -1, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE %s -1 -1: %v", keys[0], err)
	}
	if len(first) == 0 || len(last) == 0 {
		return 0
	}
	lo, err1 := logMemberTotal(first[0])
	hi, err2 := logMemberTotal(last[0])
	if err1 != nil || err2 != nil {
		t.Fatalf("%s: entries %q and %q are not hex totals", keys[0], first[0], last[0])
	}
	return hi - lo
}

// waitBackOnRedis waits until some client's answer sent after the fault
// was decided by Redis. A request sent before that one may still be on its
// way: once the load has halted, backOnRedis says which came first.
func waitBackOnRedis(t *testing.T, ld *load, lim limits, clients []loadClient, fault time.Time) {
	t.Helper()
	waitUntil(t, clusterRecoveryTarget+5*time.Second, func() error {
		if _, answered := backOnRedis(ld, lim, clients, fault); answered.IsZero() {
			return fmt.Errorf("no decision by Redis %v after the fault", time.Since(fault).Round(time.Millisecond))
		}
		return nil
	})
}

// backOnRedis returns when the first request sent after the fault and
// decided by Redis, of the answers so far, was sent and when its answer
// came; zero if there is none.
func backOnRedis(ld *load, lim limits, clients []loadClient, fault time.Time) (sent, answered time.Time) {
	for _, c := range clients {
		for _, a := range ld.answers(c) {
			if a.sent.After(fault) && lim.of(a) == byRedis && (sent.IsZero() || a.sent.Before(sent)) {
				sent, answered = a.sent, a.sent.Add(a.took)
			}
		}
	}
	return sent, answered
}

// clusterKeys returns the keys matching pattern on every primary.
func clusterKeys(ctx context.Context, cc *redis.ClusterClient, pattern string) ([]string, error) {
	var keys []string
	var mu sync.Mutex
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		found, err := c.Keys(ctx, pattern).Result()
		mu.Lock()
		keys = append(keys, found...)
		mu.Unlock()
		return err
	})
	return keys, err
}

// recordRow records *row in the fault table when t ends, with what the
// test had filled in by then (a failed test's row is marked so).
func recordRow(t *testing.T, row *faultlog.Row) {
	t.Helper()
	if row.Observed == "" {
		row.Observed = "test stopped before measuring"
	}
	faults.Record(t, *row)
}

// logEntries returns the times of a sliding_window_log rule's entries in
// Redis for one key tag (scores are µs since 2020-01-01 UTC), to find
// consumptions that match no admission.
func logEntries(t *testing.T, cc *redis.ClusterClient, prefix, rule, tag string) []time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys, _ := clusterKeys(ctx, cc, fmt.Sprintf("%s:%s:{%s}:*", prefix, rule, tag))
	if len(keys) != 1 {
		return nil
	}
	zs, err := cc.ZRangeWithScores(ctx, keys[0], 0, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE %s WITHSCORES: %v", keys[0], err)
	}
	epoch := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	var out []time.Time
	for _, z := range zs {
		if z.Score > 0 {
			out = append(out, epoch.Add(time.Duration(z.Score)*time.Microsecond))
		}
	}
	return out
}

// unaccounted returns the entries that no admitted answer accounts for: each
// admitted answer (in time order) takes the first entry between its
// sending and its arrival (with a millisecond of slack for the clocks'
// rounding).
func unaccounted(entries []time.Time, admitted []clusterAnswer) []time.Time {
	used := make([]bool, len(entries))
	for _, a := range admitted {
		for i, e := range entries {
			if !used[i] && !e.Before(a.sent.Add(-time.Millisecond)) && !e.After(a.sent.Add(a.took+time.Millisecond)) {
				used[i] = true
				break
			}
		}
	}
	var out []time.Time
	for i, e := range entries {
		if !used[i] {
			out = append(out, e)
		}
	}
	return out
}

// logEvidence prints, when t fails, the lines of authlimit's log that say
// what went wrong with the store (the first and last few of them).
func logEvidence(t *testing.T, a *authlimit) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		b, err := os.ReadFile(a.log)
		if err != nil {
			return
		}
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			for _, p := range []string{"store failed", "store circuit", "refund lost", "probe failed"} {
				if strings.Contains(l, p) {
					lines = append(lines, l)
					break
				}
			}
		}
		counts := map[string]int{}
		for _, l := range lines {
			_, msg, _ := strings.Cut(l, "msg=")
			if i := strings.Index(msg, " shard="); i > 0 {
				msg = msg[:i]
			}
			counts[msg]++
		}
		var summary []string
		for m, c := range counts {
			summary = append(summary, fmt.Sprintf("%5d × %s", c, m))
		}
		sort.Strings(summary)
		if len(lines) > 24 {
			lines = append(lines[:12], append([]string{"..."}, lines[len(lines)-12:]...)...)
		}
		t.Logf("authlimit's store messages, by count:\n%s\nfirst and last:\n%s", strings.Join(summary, "\n"), strings.Join(lines, "\n"))
	})
}
