package denials

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/authlimit/authlimit/decide"
)

// clock is a test's clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncBuffer is a log's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines returns the JSON lines written, decoded.
func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func newTestRecorder(t *testing.T, c *clock, opts Options) (*Recorder, *syncBuffer) {
	t.Helper()
	buf := &syncBuffer{}
	if opts.Size == 0 {
		opts.Size = 16
	}
	if opts.Window == 0 {
		opts.Window = 10 * time.Minute
	}
	opts.Logger = slog.New(slog.NewJSONHandler(buf, nil))
	opts.Clock = c.now
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r, buf
}

func deny(rule, tag string, client string, now time.Time) *decide.Decision {
	d := &decide.Decision{Rule: rule, Policy: rule, Tag: []byte(tag), Denied: true, RetryAfter: 1500 * time.Millisecond,
		Method: []byte("GET"), Path: []byte("/api/x"), Front: "http", Now: now}
	if client != "" {
		d.Client = netip.MustParseAddr(client)
	}
	return d
}

// TestTopOrdersAndWindows: Top lists a rule's keys most denied first with
// their clients and admissions, the previous window apart from the
// current one, and nothing of another rule.
func TestTopOrdersAndWindows(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	r, _ := newTestRecorder(t, c, Options{})
	counts := map[string]int{"10.0.0.1": 35, "10.0.0.2": 20, "10.0.0.3": 10}
	for ip, n := range counts {
		for i := 0; i < n; i++ {
			r.Observe(deny("per-ip", ip, ip, c.now()))
		}
	}
	r.Observe(deny("other", "10.0.0.9", "10.0.0.9", c.now()))
	ok := &decide.Decision{Rule: "per-ip", Tag: []byte("10.0.0.2"), Now: c.now()}
	r.Observe(ok)
	r.Observe(ok)
	c.add(10 * time.Minute)
	r.Observe(deny("per-ip", "10.0.0.4", "10.0.0.4", c.now()))

	a := r.Top(context.Background(), "per-ip", 10)
	if got := entriesString(a.Previous.Entries); got != "10.0.0.1=35 10.0.0.2=20 10.0.0.3=10" {
		t.Errorf("previous = %s", got)
	}
	if got := entriesString(a.Current.Entries); got != "10.0.0.4=1" {
		t.Errorf("current = %s", got)
	}
	if !a.Previous.Exact || a.Previous.ErrorBound != 0 || a.Previous.Keys != 3 {
		t.Errorf("previous: exact %v, bound %d, keys %d; want exact, 0, 3", a.Previous.Exact, a.Previous.ErrorBound, a.Previous.Keys)
	}
	if got := a.Previous.Entries[1]; got.Admitted != 2 || got.Client != "10.0.0.2" {
		t.Errorf("10.0.0.2: admitted %d client %q; want 2, 10.0.0.2", got.Admitted, got.Client)
	}
	if got, want := a.Current.Start, c.now().Truncate(10*time.Minute); !got.Equal(want) {
		t.Errorf("current.start = %s, want %s", got, want)
	}
	if got := r.Top(context.Background(), "per-ip", 2); len(got.Previous.Entries) != 2 {
		t.Errorf("n=2 gave %d entries", len(got.Previous.Entries))
	}
	c.add(20 * time.Minute)
	if a := r.Top(context.Background(), "per-ip", 10); len(a.Current.Entries)+len(a.Previous.Entries) != 0 {
		t.Errorf("two windows later: current %v previous %v, want empty", a.Current.Entries, a.Previous.Entries)
	}
}

func entriesString(es []Entry) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, fmt.Sprintf("%s=%d", e.Tag, e.Denied))
	}
	return strings.Join(parts, " ")
}

// TestTopSaysWhenEstimated: a window with more keys than the summary holds
// is not exact, and gives its error bound.
func TestTopSaysWhenEstimated(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	r, _ := newTestRecorder(t, c, Options{Size: 4})
	for i := 0; i < 40; i++ {
		r.Observe(deny("r", "heavy", "", c.now()))
		r.Observe(deny("r", fmt.Sprint("light", i), "", c.now()))
	}
	a := r.Top(context.Background(), "r", 10)
	if a.Current.Exact || a.Current.ErrorBound == 0 {
		t.Fatalf("exact %v bound %d; want an estimate with a bound", a.Current.Exact, a.Current.ErrorBound)
	}
	if e := a.Current.Entries[0]; e.Tag != "heavy" || e.Denied < 40 || e.Denied-e.Error > 40 {
		t.Errorf("first entry %+v; want heavy, 40 within its error", e)
	}
}

// TestDenialLogOneLinePerKey: twenty denials of one client under one rule
// write one line, naming the rule, the policy, the client, the request and
// the front; a shadow rule's line says it would have denied.
func TestDenialLogOneLinePerKey(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	r, buf := newTestRecorder(t, c, Options{LogRate: 10})
	for i := 0; i < 20; i++ {
		r.Observe(deny("per-ip", "192.0.2.1", "192.0.2.1", c.now()))
		c.add(100 * time.Millisecond)
	}
	r.Flush()
	lines := buf.lines(t)
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1: %v", len(lines), lines)
	}
	l := lines[0]
	for k, want := range map[string]any{"msg": "rate limit denied", "level": "INFO", "rule": "per-ip", "policy": "per-ip",
		"key": "192.0.2.1", "client": "192.0.2.1", "method": "GET", "path": "/api/x", "retry_after": 1.5, "front": "http"} {
		if l[k] != want {
			t.Errorf("%s = %v, want %v", k, l[k], want)
		}
	}
	d := deny("new-limit", "192.0.2.1", "192.0.2.1", c.now())
	d.Shadow = true
	r.Observe(d)
	r.Flush()
	if lines := buf.lines(t); len(lines) != 2 || lines[1]["msg"] != "rate limit would have denied (shadow rule)" || lines[1]["rule"] != "new-limit" {
		t.Errorf("shadow line: %v", lines[len(lines)-1])
	}
	// The next window logs the key again.
	c.add(10 * time.Minute)
	r.Observe(deny("per-ip", "192.0.2.1", "192.0.2.1", c.now()))
	r.Flush()
	if n := len(buf.lines(t)); n != 3 {
		t.Errorf("%d lines after a new window, want 3", n)
	}
}

// TestDenialLogHidesCredentials: a key that may be a credential is logged
// as a short hash, unless keys are to be logged.
func TestDenialLogHidesCredentials(t *testing.T) {
	for _, logKeys := range []bool{false, true} {
		t.Run(fmt.Sprint(logKeys), func(t *testing.T) {
			c := &clock{t: time.Unix(1e9, 0)}
			r, buf := newTestRecorder(t, c, Options{LogRate: 10, LogKeys: logKeys})
			d := deny("per-key", "sk_live_secret", "", c.now())
			d.Credential = true
			r.Observe(d)
			r.Flush()
			lines := buf.lines(t)
			want := KeyHash([]byte("sk_live_secret"))
			if logKeys {
				want = "sk_live_secret"
			}
			if len(lines) != 1 || lines[0]["key"] != want {
				t.Fatalf("lines %v, want key %q", lines, want)
			}
			if _, ok := lines[0]["client"]; ok {
				t.Errorf("a key not by address logged a client: %v", lines[0])
			}
		})
	}
}

// TestDenialLogFlood: 100,000 distinct keys denied over five seconds write
// at most the cap a second, and the suppressed lines are all reported.
func TestDenialLogFlood(t *testing.T) {
	const rate, keys, seconds = 10, 100000, 5
	c := &clock{t: time.Unix(1e9, 0)}
	r, buf := newTestRecorder(t, c, Options{LogRate: rate, Size: 256})
	for i := 0; i < keys; i++ {
		r.Observe(deny("per-ip", fmt.Sprintf("k%d", i), "", c.now()))
		if (i+1)%(keys/seconds) == 0 {
			r.Flush()
			c.add(time.Second)
		}
	}
	r.Flush()
	denied, suppressed := 0, 0.0
	perSecond := map[string]int{}
	for _, l := range buf.lines(t) {
		switch l["msg"] {
		case "rate limit denied":
			denied++
			perSecond[l["time"].(string)[:19]]++
		case "denial log lines suppressed":
			suppressed += l["suppressed"].(float64)
		}
	}
	if denied > rate*seconds {
		t.Errorf("%d denial lines in %d seconds, cap %d a second", denied, seconds, rate)
	}
	if denied == 0 {
		t.Error("no denial line")
	}
	if int(suppressed)+denied != keys {
		t.Errorf("%d lines + %v suppressed, want %d", denied, suppressed, keys)
	}
}

// TestObserveAllocatesNothing: once a rule is known, observing admissions
// and denials (new keys, displaced keys, a new window) allocates nothing.
func TestObserveAllocatesNothing(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	r, _ := newTestRecorder(t, c, Options{Size: 8, LogRate: 5})
	tags := make([][]byte, 64)
	for i := range tags {
		tags[i] = []byte(fmt.Sprint("10.1.0.", i))
	}
	d := &decide.Decision{Rule: "r", Policy: "r", Client: netip.MustParseAddr("10.1.0.1"), Method: []byte("GET"), Path: []byte("/"), Now: c.now()}
	r.Observe(d)
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		i++
		d.Tag, d.Denied = tags[i%len(tags)], i%3 != 0
		d.Now = d.Now.Add(time.Second)
		r.Observe(d)
	})
	if allocs != 0 {
		t.Errorf("Observe allocates %.1f times a call", allocs)
	}
}

// TestNewRefusesBadOptions names each bad option.
func TestNewRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Size: 0, Window: time.Minute}, "size 0"},
		{Options{Size: MaxSize + 1, Window: time.Minute}, "size 10001"},
		{Options{Size: 1, Window: time.Millisecond}, "window 1ms"},
		{Options{Size: 1, Window: time.Minute, LogRate: -1}, "log rate -1"},
		{Options{Size: 1, Window: time.Minute, Exchange: fakeExchange{}}, "replica name"},
	} {
		if _, err := New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error with %q", tc.opts, err, tc.want)
		}
	}
}

type fakeExchange struct{}

func (fakeExchange) Publish(context.Context, string, []Blob) error { return nil }
func (fakeExchange) Fetch(context.Context, []WindowID) ([]map[string][]byte, error) {
	return nil, nil
}

// failingExchange fails every call.
type failingExchange struct{}

func (failingExchange) Publish(context.Context, string, []Blob) error {
	return fmt.Errorf("redis down")
}
func (failingExchange) Fetch(context.Context, []WindowID) ([]map[string][]byte, error) {
	return nil, fmt.Errorf("redis down")
}

// TestTopWithoutTheExchange: when the other replicas' summaries cannot be
// read, Top answers with this replica's own and says why; a failed publish
// is sent again at the next one.
func TestTopWithoutTheExchange(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	r, _ := newTestRecorder(t, c, Options{Exchange: failingExchange{}, Replica: "a", ShareInterval: time.Second})
	r.Observe(deny("r", "k", "", c.now()))
	a := r.Top(context.Background(), "r", 10)
	if a.Shared || a.ShareError != "redis down" || entriesString(a.Current.Entries) != "k=1" || a.Current.Replicas != 1 {
		t.Errorf("answer %+v; want this replica's k=1, unshared, with the error", a)
	}
	if err := r.Publish(context.Background()); err == nil {
		t.Fatal("Publish through a failing exchange: no error")
	}
	if _, dirty := r.local(r.window(c.now()), false); !dirty {
		t.Error("a failed publish left nothing to publish again")
	}
}
