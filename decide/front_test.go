package decide

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

// TestFrontsCountApart: each front's requests count under its own front
// label, by result, and each decision is observed once in its front's
// duration histogram, with the time the engine took; an Outcome without a
// front counts under "unknown". Decide, DecideAsync and DecideLimits all
// count.
func TestFrontsCountApart(t *testing.T) {
	rs, err := rules.Parse("name=a key=ip limit=1/1h path=/a")
	if err != nil {
		t.Fatal(err)
	}
	p, err := algo.NewPolicy(algo.Spec{Name: "l", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	g, err := guard.New(guard.Options{Store: m, Rules: rulesettest.Holder(t, rs, p)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	// A clock that moves 3ms at each reading: every decision reads it
	// twice, so each takes 3ms.
	var now time.Time
	clock := func() time.Time { now = now.Add(3 * time.Millisecond); return now }
	reg := prometheus.NewRegistry()
	e, err := New(Options{Rules: rulesettest.Holder(t, rs), Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429, Registry: reg, Clock: clock,
		BlockCIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}})
	if err != nil {
		t.Fatal(err)
	}
	web, err := e.Front("web")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := e.Front("web"); again != web || web.Name() != "web" {
		t.Errorf("Front(web) again = %p, want the same Front %p", again, web)
	}
	grpc, err := e.Front("grpc")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "Web", "a b", "1x", "front{}", "x\xff", "abcdefghijklmnopqrstuvwxyz0123456789"} {
		if _, err := e.Front(bad); err == nil {
			t.Errorf("Front(%q): no error", bad)
		}
	}

	decide := func(f *Front, client, path string) Verdict {
		var in Input
		o := Outcome{Front: f}
		e.Read(&in, netip.MustParseAddr(client), []byte("GET"), []byte(path), nil, mapHeaders{})
		e.Decide(context.Background(), &in, &o)
		if o.Front != f {
			t.Fatalf("Decide changed the outcome's front")
		}
		return o.Verdict
	}
	for _, step := range []struct {
		front        *Front
		client, path string
		want         Verdict
	}{
		{web, "203.0.113.1", "/a", Allow},
		{web, "203.0.113.1", "/a", Deny},
		{web, "203.0.113.1", "/b", Unmatched},
		{grpc, "203.0.113.2", "/a", Allow},
		{grpc, "198.51.100.1", "/a", Blocked},
		{nil, "203.0.113.3", "/a", Allow},
	} {
		if got := decide(step.front, step.client, step.path); got != step.want {
			t.Fatalf("%s %s: verdict %v, want %v", step.client, step.path, got, step.want)
		}
	}
	// DecideAsync, and DecideLimits.
	var in Input
	o := Outcome{Front: grpc}
	e.Read(&in, netip.MustParseAddr("203.0.113.2"), []byte("GET"), []byte("/a"), nil, mapHeaders{})
	done := make(chan Verdict, 1)
	if !e.DecideAsync(&in, &o, thenFunc(func(o *Outcome) { done <- o.Verdict })) {
		t.Fatal("DecideAsync on a guard: false")
	}
	if v := <-done; v != Deny {
		t.Fatalf("DecideAsync: %v, want deny", v)
	}
	l := e.NewLimit("l", p)
	o = Outcome{Front: web}
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: l, Key: []byte("k")}}, &o)
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: l, Key: []byte("k")}}, &o)
	e.DecideLimits(context.Background(), nil, &o)

	for _, c := range []struct {
		front, result string
		want          float64
	}{
		{"web", "allowed", 2}, {"web", "denied", 2}, {"web", "unmatched", 2},
		{"grpc", "allowed", 1}, {"grpc", "denied", 1}, {"grpc", "blocked", 1},
		{"unknown", "allowed", 1},
		{"grpc", "unmatched", 0}, {"unknown", "denied", 0},
	} {
		if got := counter(t, reg, "authlimit_requests_total", c.front, c.result); got != c.want {
			t.Errorf("authlimit_requests_total{front=%q,result=%q} = %v, want %v", c.front, c.result, got, c.want)
		}
	}
	for front, want := range map[string]uint64{"web": 6, "grpc": 3, "unknown": 1} {
		count, sum := histogram(t, reg, "authlimit_request_duration_seconds", front)
		if count != want || sum < float64(want)*0.003-1e-9 || sum > float64(want)*0.003+1e-9 {
			t.Errorf("authlimit_request_duration_seconds{front=%q}: %d observations summing %vs, want %d of 3ms", front, count, sum, want)
		}
	}
}

type thenFunc func(*Outcome)

func (f thenFunc) Decided(o *Outcome) { f(o) }

// histogram is the count and sum of the histogram name with the given
// label values.
func histogram(t *testing.T, reg *prometheus.Registry, name string, values ...string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(values) {
				continue
			}
			for i, l := range m.GetLabel() {
				if l.GetValue() != values[i] {
					continue metrics
				}
			}
			return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
		}
	}
	return 0, 0
}
