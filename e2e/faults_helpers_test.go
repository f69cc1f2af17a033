//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
)

// The decision budget of the fault tests and the margin a client may see on
// top of it (HTTP on loopback, the local fallback, a busy two-core machine).
const (
	decisionBudget = 50 * time.Millisecond // AUTHLIMIT_REDIS_TIMEOUT's default
	budgetMargin   = 50 * time.Millisecond
)

// limiter is an authlimit under a fault test, asked over keep-alive
// connections as a proxy asks it.
type limiter struct {
	*authlimit
	http *http.Client
}

// startLimiter starts authlimit with env and waits until it serves.
func startLimiter(t *testing.T, name string, env map[string]string) *limiter {
	t.Helper()
	a := startAuthlimit(t, name, env)
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &limiter{authlimit: a, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// answer is one decision as the client saw it.
type answer struct {
	client     string
	start, end time.Time
	status     int
	// problem is the type of a problem+json answer without "urn:authlimit:"
	// (rate-limited, unavailable, ...); empty for a 200.
	problem string
	// counted: the answer carries rate-limit headers, so a store decided
	// it (Redis, or the local fallback); fail mode open's 200 has none.
	counted   bool
	remaining int
	// retryAfter is the Retry-After header in seconds, 0 if none.
	retryAfter int
	err        error
}

func (a answer) latency() time.Duration { return a.end.Sub(a.start) }

// admitted reports a 200.
func (a answer) admitted() bool { return a.err == nil && a.status == 200 }

// unavailable reports a 503 urn:authlimit:unavailable.
func (a answer) unavailable() bool { return a.status == 503 && a.problem == "unavailable" }

func (a answer) String() string {
	if a.err != nil {
		return fmt.Sprintf("%s: error %v after %v", a.client, a.err, a.latency())
	}
	s := fmt.Sprintf("%s: %d", a.client, a.status)
	if a.problem != "" {
		s += " " + a.problem
	}
	if a.counted {
		s += fmt.Sprintf(" remaining=%d", a.remaining)
	}
	return s + fmt.Sprintf(" in %v", a.latency().Round(100*time.Microsecond))
}

var problemType = regexp.MustCompile(`"type":"urn:authlimit:([a-z-]+)"`)

// ask asks for a decision for the client ip on path, as a proxy would.
func (l *limiter) ask(ip, path string) answer {
	a := answer{client: ip, start: time.Now()}
	req, err := http.NewRequestWithContext(context.Background(), "GET", "http://"+l.addr+"/auth", nil)
	if err != nil {
		a.err, a.end = err, time.Now()
		return a
	}
	req.Header.Set("X-Forwarded-For", ip)
	req.Header.Set("X-Forwarded-Uri", path)
	resp, err := l.http.Do(req)
	if err != nil {
		a.err, a.end = err, time.Now()
		return a
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	a.end = time.Now()
	a.status, a.err = resp.StatusCode, err
	if m := problemType.FindStringSubmatch(string(body)); m != nil {
		a.problem = m[1]
	}
	a.retryAfter, _ = strconv.Atoi(resp.Header.Get("Retry-After"))
	if r := resp.Header.Get("X-RateLimit-Remaining"); r != "" {
		a.counted = true
		a.remaining, _ = strconv.Atoi(r)
	}
	return a
}

// askN asks n times in a row and returns the answers.
func (l *limiter) askN(ip, path string, n int) []answer {
	out := make([]answer, n)
	for i := range out {
		out[i] = l.ask(ip, path)
	}
	return out
}

// promSample is one scrape of /metrics: series (name with labels) → value.
type promSample map[string]float64

// sample scrapes /metrics.
func (l *limiter) sample(t *testing.T) promSample {
	t.Helper()
	resp, err := l.http.Get("http://" + l.addr + "/metrics")
	if err != nil {
		t.Fatalf("%s: scrape /metrics: %v", l.name, err)
	}
	defer resp.Body.Close()
	s := promSample{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			s[line[:i]] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: read /metrics: %v", l.name, err)
	}
	return s
}

// total adds every series of the metric name, whatever its labels.
func (s promSample) total(name string) float64 {
	var v float64
	for k, x := range s {
		if k == name || strings.HasPrefix(k, name+"{") {
			v += x
		}
	}
	return v
}

// readiness returns /readyz's status and first line.
func (l *limiter) readiness() (int, string) {
	resp, err := l.http.Get("http://" + l.addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// waitReadiness polls /readyz until its body starts with prefix and returns
// when it saw it; it fails t after timeout.
func (l *limiter) waitReadiness(t *testing.T, prefix string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		status, body := l.readiness()
		if strings.HasPrefix(body, prefix) {
			return time.Now()
		}
		if l.exited() {
			t.Fatalf("%s exited while waiting for /readyz %q:\n%s", l.name, prefix, tail(l.log, 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: /readyz is %d %q after %v, want %q…", l.name, status, body, timeout, prefix)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitMetric polls /metrics until ok accepts the sample, and returns when it
// did; it fails t after timeout.
func (l *limiter) waitMetric(t *testing.T, what string, timeout time.Duration, ok func(promSample) bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if ok(l.sample(t)) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not %s after %v", l.name, what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// redisConns counts authlimit's TCP connections to addr, and of them those
// in CLOSE_WAIT.
func (l *limiter) redisConns(t *testing.T, addr string) (open, closeWait int) {
	t.Helper()
	open, closeWait, err := redistest.ProcessConns(l.cmd.Process.Pid, addr)
	if err != nil {
		t.Fatalf("%s: connections to %s: %v", l.name, addr, err)
	}
	return open, closeWait
}

// circuitEvent is a circuit change authlimit logged.
type circuitEvent struct {
	at    time.Time
	state string // open or closed
}

var circuitLine = regexp.MustCompile(`^time=(\S+) .*msg="store circuit (open|closed)"`)

// circuitEvents reads the circuit changes from authlimit's log, in order.
// slog's text handler stamps them to the millisecond.
func (l *limiter) circuitEvents(t *testing.T) []circuitEvent {
	t.Helper()
	f, err := os.Open(l.log)
	if err != nil {
		t.Fatalf("%s: read log: %v", l.name, err)
	}
	defer f.Close()
	var out []circuitEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := circuitLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatalf("%s: log time %q: %v", l.name, m[1], err)
		}
		out = append(out, circuitEvent{at: at, state: m[2]})
	}
	return out
}

// firstCircuit returns the first change to state at or after from, and
// whether there was one.
func firstCircuit(events []circuitEvent, state string, from time.Time) (time.Time, bool) {
	for _, e := range events {
		if e.state == state && !e.at.Before(from.Truncate(time.Millisecond)) {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// logText returns authlimit's whole output so far.
func (l *limiter) logText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(l.log)
	if err != nil {
		t.Fatalf("%s: read log: %v", l.name, err)
	}
	return string(b)
}

// flow is traffic from several clients, each asking in a loop, one request
// at a time, with a pause between requests, until stopped.
type flow struct {
	l    *limiter
	quit chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	got  []answer
	// pause between a client's requests; the clients start spread over it.
	pause time.Duration
}

// startFlow starts a client for each ip asking for path.
func (l *limiter) startFlow(t *testing.T, ips []string, path string, pause time.Duration) *flow {
	t.Helper()
	f := &flow{l: l, quit: make(chan struct{}), pause: pause}
	for i, ip := range ips {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			wait := time.Duration(i) * pause / time.Duration(len(ips))
			for {
				select {
				case <-f.quit:
					return
				case <-time.After(wait):
				}
				a := l.ask(ip, path)
				f.mu.Lock()
				f.got = append(f.got, a)
				f.mu.Unlock()
				wait = pause
			}
		}()
	}
	t.Cleanup(func() { f.stop() })
	return f
}

// answers returns what the clients got so far, in order of completion.
func (f *flow) answers() []answer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]answer(nil), f.got...)
}

// stop stops the clients and returns every answer. It may be called more
// than once.
func (f *flow) stop() []answer {
	select {
	case <-f.quit:
	default:
		close(f.quit)
	}
	f.wg.Wait()
	return f.answers()
}

// waitUntil polls the flow's answers until ok accepts them; it fails t after
// timeout.
func (f *flow) waitUntil(t *testing.T, what string, timeout time.Duration, ok func([]answer) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok(f.answers()) {
		if f.l.exited() {
			t.Fatalf("%s exited while waiting until %s:\n%s", f.l.name, what, tail(f.l.log, 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not %s after %v", f.l.name, what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// byClient groups answers by client, each in order of completion.
func byClient(as []answer) map[string][]answer {
	m := map[string][]answer{}
	for _, a := range as {
		m[a.client] = append(m[a.client], a)
	}
	return m
}

// slowest returns the longest latency among as.
func slowest(as []answer) time.Duration {
	var w time.Duration
	for _, a := range as {
		w = max(w, a.latency())
	}
	return w
}

// countAnswers counts the answers ok accepts.
func countAnswers(as []answer, ok func(answer) bool) int {
	n := 0
	for _, a := range as {
		if ok(a) {
			n++
		}
	}
	return n
}

// tally sums up answers by kind for messages and the fault table:
// "200×12 429×40 503×5".
func tally(as []answer) string {
	m := map[string]int{}
	for _, a := range as {
		k := strconv.Itoa(a.status)
		if a.err != nil {
			k = "error"
		} else if a.status == 200 && !a.counted {
			k = "200(no headers)"
		}
		m[k]++
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s×%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// checkAnswers fails t for every answer that is not a decision within the
// budget and margin: an error, a status other than 200, 429 or 503
// unavailable, or one slower than decisionBudget+budgetMargin.
func checkAnswers(t *testing.T, what string, as []answer) {
	t.Helper()
	bad := 0
	for _, a := range as {
		ok := a.err == nil && (a.status == 200 || a.status == 429 && a.problem == "rate-limited" || a.unavailable())
		if ok && a.latency() <= decisionBudget+budgetMargin {
			continue
		}
		if bad++; bad <= 5 {
			t.Errorf("%s: %v: want 200, 429 or 503 unavailable within %v", what, a, decisionBudget+budgetMargin)
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d such answers in all, of %d", what, bad, len(as))
	}
}

// between returns the answers that completed in [from, to).
func between(as []answer, from, to time.Time) []answer {
	var out []answer
	for _, a := range as {
		if !a.end.Before(from) && a.end.Before(to) {
			out = append(out, a)
		}
	}
	return out
}

// ms formats a duration in whole milliseconds for the fault table.
func ms(d time.Duration) string {
	return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
}

// clientIPs returns n documentation addresses (TEST-NET) for clients,
// distinct per base.
func clientIPs(base string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s.%d", base, i+1)
	}
	return out
}

// logMemberTotal reads the running total of a sliding_window_log member in
// Redis: 14 hex digits, then, for an admission, ':' and the request's id
// (see scripts/decide.lua).
func logMemberTotal(member string) (int64, error) {
	total, _, _ := strings.Cut(member, ":")
	if len(total) != 14 {
		return 0, fmt.Errorf("log member %q does not start with 14 hex digits", member)
	}
	return strconv.ParseInt(total, 16, 64)
}
