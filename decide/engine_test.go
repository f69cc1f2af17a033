package decide

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

// newEngine returns an engine deciding src's rules (and those of more rule
// sets, for swap) with the memory store through a guard that shares its
// rule set.
func newEngine(t testing.TB, d func(Decider) Decider, src string, more ...string) (*Engine, [][]*rules.Rule) {
	t.Helper()
	var sets [][]*rules.Rule
	for _, s := range append([]string{src}, more...) {
		rs, err := rules.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, rs)
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	h := rulesettest.Holder(t, sets[0])
	g, err := guard.New(guard.Options{Store: m, Rules: h, DenyCacheSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var dec Decider = g
	if d != nil {
		dec = d(g)
	}
	e, err := New(Options{Rules: h, Decider: dec, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429,
		BlockCIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}})
	if err != nil {
		t.Fatal(err)
	}
	return e, sets
}

// swap puts rs in force in e's rule set, as a reload does.
func swap(t testing.TB, e *Engine, rs []*rules.Rule) {
	t.Helper()
	set, err := e.rules.WithRules(rs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	e.rules.Store(set, time.Now())
}

// mapHeaders is a request's headers as a map, each name with its values.
type mapHeaders map[string][]string

func (m mapHeaders) Lookup(name string) ([]byte, int) {
	for k, v := range m {
		if strings.EqualFold(k, name) {
			if len(v) == 0 {
				return nil, 0
			}
			return []byte(v[0]), len(v)
		}
	}
	return nil, 0
}

func header(o *Outcome, name string) string {
	for _, h := range o.Headers {
		if string(h.Name) == name {
			return string(h.Value)
		}
	}
	return ""
}

// oneHeader is a request with one header.
type oneHeader struct {
	name  string
	value []byte
}

func (h *oneHeader) Lookup(name string) ([]byte, int) {
	if strings.EqualFold(name, h.name) {
		return h.value, 1
	}
	return nil, 0
}

// blockingDecider holds every decision until release is closed, after
// telling entered.
type blockingDecider struct {
	Decider
	entered chan struct{}
	release chan struct{}
}

func (b blockingDecider) Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.Decider.Decide(ctx, reqs, res)
}

// TestSwapInFlight: a request that started under one rule set finishes
// under it, headers and results included, while a rule set swapped in
// meanwhile decides the requests that start after.
func TestSwapInFlight(t *testing.T) {
	var bd blockingDecider
	e, sets := newEngine(t, func(d Decider) Decider {
		bd = blockingDecider{d, make(chan struct{}, 2), make(chan struct{})}
		return bd
	}, "name=old key=ip limit=5/1m", "name=new key=ip limit=7/1h")
	var in Input
	e.Read(&in, netip.MustParseAddr("203.0.113.7"), []byte("GET"), []byte("/"), []byte("a.example"), mapHeaders{})
	var first Outcome
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Decide(context.Background(), &in, &first)
	}()
	<-bd.entered
	swap(t, e, sets[1])
	close(bd.release)
	<-done
	if got, want := header(&first, "RateLimit-Policy"), `"old";q=5;w=60`; got != want {
		t.Errorf("in-flight RateLimit-Policy = %q, want %q", got, want)
	}
	if len(first.Results) != 1 || first.Results[0].Rule != sets[0][0] {
		t.Errorf("in-flight results %+v, want the old rule's", first.Results)
	}
	var second Outcome
	e.Decide(context.Background(), &in, &second)
	if got, want := header(&second, "RateLimit-Policy"), `"new";q=7;w=3600`; got != want {
		t.Errorf("after the swap RateLimit-Policy = %q, want %q", got, want)
	}
}

// TestVerdicts: each verdict with its status, kind, headers and body.
func TestVerdicts(t *testing.T) {
	e, _ := newEngine(t, nil, "name=ip key=ip limit=1/1m path=/one; name=k key=header:X-Key limit=5/1m path=/k on_missing=deny;"+
		"name=c key=ip limit=5/1m path=/c cost=header:X-Cost; name=s key=ip limit=1/1m path=/s shadow=true")
	ip := netip.MustParseAddr("203.0.113.7")
	for _, tc := range []struct {
		name      string
		client    string
		path      string
		hdr       mapHeaders
		invalid   string
		verdict   Verdict
		status    int
		kind      string
		remaining string
	}{
		{"allowed", "", "/one", nil, "", Allow, 200, "", "0"},
		{"rate-limited", "", "/one", nil, "", Deny, 429, "rate-limited", "0"},
		{"blocked", "198.51.100.1", "/one", nil, "", Blocked, 429, "blocked", ""},
		{"allow-listed, even unreadable", "192.0.2.1", "/one", nil, "invalid-url", Allowlisted, 200, "", ""},
		{"unreadable", "", "/one", nil, "invalid-url", Invalid, 429, "invalid-url", ""},
		{"unmatched", "", "/other", nil, "", Unmatched, 200, "", ""},
		{"missing key", "", "/k", nil, "", Invalid, 429, "missing-key", ""},
		{"repeated key", "", "/k", mapHeaders{"X-Key": {"a", "b"}}, "", Invalid, 429, "repeated-header", ""},
		{"invalid cost", "", "/c", mapHeaders{"X-Cost": {"x"}}, "", Invalid, 429, "invalid-cost", ""},
		{"cost too high", "", "/c", mapHeaders{"X-Cost": {"6"}}, "", Deny, 429, "cost-too-high", "5"},
		{"shadow admits", "", "/s", nil, "", Allow, 200, "", ""},
		{"shadow denial admits", "", "/s", nil, "", Allow, 200, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := ip
			if tc.client != "" {
				client = netip.MustParseAddr(tc.client)
			}
			var in Input
			e.Read(&in, client, []byte("GET"), []byte(tc.path), []byte("a.example"), tc.hdr)
			if tc.invalid != "" {
				in.Refuse(client, tc.invalid, "unreadable")
			}
			var o Outcome
			e.Decide(context.Background(), &in, &o)
			if o.Verdict != tc.verdict || o.Status != tc.status || o.Kind != tc.kind {
				t.Fatalf("verdict %v, status %d, kind %q; want %v, %d, %q (%s)", o.Verdict, o.Status, o.Kind, tc.verdict, tc.status, tc.kind, o.Body)
			}
			if got := header(&o, "X-RateLimit-Remaining"); got != tc.remaining {
				t.Errorf("X-RateLimit-Remaining %q, want %q", got, tc.remaining)
			}
			if got := len(o.Body) > 0; got == o.Verdict.Admitted() {
				t.Errorf("body %q for verdict %v", o.Body, o.Verdict)
			}
			if tc.kind != "" && !strings.Contains(string(o.Body), `"type":"urn:authlimit:`+tc.kind+`"`) {
				t.Errorf("body %s, want kind %s", o.Body, tc.kind)
			}
			if (tc.kind == "rate-limited") != (header(&o, "Retry-After") != "") || (tc.kind == "rate-limited") != (o.RetryAfter > 0) {
				t.Errorf("Retry-After %q (%d) for kind %q", header(&o, "Retry-After"), o.RetryAfter, tc.kind)
			}
		})
	}
}

// TestDecideAllocatesNothing: an engine decision, allowed or denied, with
// headers, allocates nothing once the Outcome is warm.
func TestDecideAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	e, _ := newEngine(t, nil, "name=a key=ip limit=1000000/1m; name=b key=ip+header:X-Key limit=1/1h algorithm=gcra")
	hdr := oneHeader{"X-Key", []byte("k")}
	var in Input
	var o Outcome
	run := func() {
		e.Read(&in, netip.MustParseAddr("203.0.113.7"), []byte("POST"), []byte("/x"), []byte("a.example"), &hdr)
		e.Decide(context.Background(), &in, &o)
	}
	run()
	run()
	if o.Verdict != Deny {
		t.Fatalf("verdict %v, want deny", o.Verdict)
	}
	if got := testing.AllocsPerRun(100, run); got != 0 {
		t.Errorf("%v allocations per decision, want 0", got)
	}
}

// TestSlowDeciderBoundedByContext: a deadline on ctx reaches the decider.
func TestSlowDeciderBoundedByContext(t *testing.T) {
	e, _ := newEngine(t, func(d Decider) Decider { return ctxDecider{} }, "name=a key=ip limit=5/1m")
	var in Input
	e.Read(&in, netip.MustParseAddr("203.0.113.7"), []byte("GET"), []byte("/"), nil, mapHeaders{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var o Outcome
	e.Decide(ctx, &in, &o)
	if o.Verdict != Failed || o.Status != 500 {
		t.Errorf("verdict %v status %d, want failed 500", o.Verdict, o.Status)
	}
}

// ctxDecider waits for its context to end and returns its error.
type ctxDecider struct{}

func (ctxDecider) Decide(ctx context.Context, _ []algo.Request, _ []algo.Result) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

// TestDecideLimits: limits a front picks itself are decided as one
// request, with the fail modes, results, headers and problem of Decide;
// bad requests are refused, none is unmatched.
func TestDecideLimits(t *testing.T) {
	a, err := algo.NewPolicy(algo.Spec{Name: "a", Algorithm: algo.FixedWindow, Limit: 2, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	b, err := algo.NewPolicy(algo.Spec{Name: "b", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	rs, err := rules.Parse("name=r key=ip limit=1/1m")
	if err != nil {
		t.Fatal(err)
	}
	// The guard numbers a and b, as it numbers a rate-limit
	// configuration's policies.
	reg := prometheus.NewRegistry()
	g, err := guard.New(guard.Options{Store: m, Rules: rulesettest.Holder(t, rs, a, b), DenyCacheSize: 100, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Rules: rulesettest.Holder(t, rs), Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	la, lb := e.NewLimit("per-route", a), e.NewLimit("per-user", b)
	var o Outcome
	key := []byte("user 1")
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: la, Key: key}, {Limit: lb, Key: key, Shadow: true}}, &o)
	if o.Verdict != Allow || len(o.Results) != 2 || o.Results[0].Limit != la || o.Results[0].Rule != nil || o.Results[0].Remaining != 1 {
		t.Fatalf("first: %v %+v", o.Verdict, o.Results)
	}
	if got, want := header(&o, "RateLimit-Policy"), `"per-route";q=2;w=60`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q (shadow limits stay out)", got, want)
	}
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: la, Key: key}, {Limit: lb, Key: key}}, &o)
	if o.Verdict != Deny || o.Kind != "rate-limited" || !strings.Contains(string(o.Body), `"violated-policies":["per-user"]`) || header(&o, "Retry-After") == "" {
		t.Fatalf("second: %v %q %s %v", o.Verdict, o.Kind, o.Body, o.Headers)
	}
	if got := header(&o, "RateLimit"); !strings.HasPrefix(got, `"per-user";r=0;`) {
		t.Errorf("RateLimit %q, want the denying limit's", got)
	}
	// Again: the guard's deny cache knows per-user's denial, but
	// DecideLimits reads every limit: per-route's count is the store's.
	hits := counter(t, reg, "authlimit_deny_cache_hits_total")
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: la, Key: key}, {Limit: lb, Key: key}}, &o)
	if o.Verdict != Deny || o.Results[0].NotDecided || o.Results[0].Remaining != 1 || o.Results[1].NotDecided || o.Most != 1 {
		t.Fatalf("with per-user's denial cached: %v %+v most %d", o.Verdict, o.Results, o.Most)
	}
	if got := counter(t, reg, "authlimit_deny_cache_hits_total"); got != hits {
		t.Errorf("deny cache hits %v, want %v: a decision of several limits goes to the store", got, hits)
	}
	// per-user alone is answered from the deny cache, whole.
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: lb, Key: key}}, &o)
	if o.Verdict != Deny || o.Results[0].NotDecided {
		t.Fatalf("per-user alone: %v %+v", o.Verdict, o.Results)
	}
	if got := counter(t, reg, "authlimit_deny_cache_hits_total"); got != hits+1 {
		t.Errorf("deny cache hits %v, want %v: one limit's denial is the cache's to answer", got, hits+1)
	}
	// A limit counted under another label keeps its name in the headers.
	lc := e.NewLimitCountedAs("rls-override-2-per-minute", "override", a)
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: lc, Key: []byte("user 3")}}, &o)
	if got := header(&o, "RateLimit-Policy"); o.Verdict != Allow || got != `"rls-override-2-per-minute";q=2;w=60` {
		t.Errorf("a limit counted as override: %v RateLimit-Policy %q", o.Verdict, got)
	}
	if got := counter(t, reg, "authlimit_decisions_total", "allowed", "override"); got != 1 {
		t.Errorf("override allowed %v, want 1", got)
	}
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: la, Key: []byte("user 2"), Cost: 3}}, &o)
	if o.Verdict != Deny || o.Kind != "cost-too-high" || header(&o, "Retry-After") != "" {
		t.Errorf("cost 3 of 2: %v %q %v", o.Verdict, o.Kind, o.Headers)
	}
	e.DecideLimits(context.Background(), nil, &o)
	if o.Verdict != Unmatched || len(o.Headers) != 0 {
		t.Errorf("no limits: %v %v", o.Verdict, o.Headers)
	}
	e.DecideLimits(context.Background(), []LimitRequest{{Key: key}}, &o)
	if o.Verdict != Invalid || o.Kind != "no-limit" {
		t.Errorf("a nil limit: %v %q", o.Verdict, o.Kind)
	}
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: la, Key: key}, {Limit: la, Key: key}}, &o)
	if o.Verdict != Failed || o.Status != 500 {
		t.Errorf("a limit twice for one key: %v %d", o.Verdict, o.Status)
	}
	e.DecideLimits(context.Background(), []LimitRequest{{Limit: la, Key: []byte("user 4")}, {Limit: la, Key: []byte("user 5")}}, &o)
	if o.Verdict != Allow || o.Results[0].Remaining != 1 || o.Results[1].Remaining != 1 {
		t.Errorf("a limit for two keys: %v %+v, want each counted", o.Verdict, o.Results)
	}
	many := make([]LimitRequest, algo.MaxRules+1)
	for i := range many {
		many[i] = LimitRequest{Limit: la, Key: key}
	}
	e.DecideLimits(context.Background(), many, &o)
	if o.Verdict != Invalid || o.Kind != "too-many-limits" {
		t.Errorf("%d limits: %v %q", len(many), o.Verdict, o.Kind)
	}
}

// counter is the value of the counter name with the given label values,
// in the order of its labels' names (outcome before rule).
func counter(t *testing.T, reg *prometheus.Registry, name string, values ...string) float64 {
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
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestLimitsMadeAgainKeepCounts: a front that makes its limits again
// (the rate-limit service, once per configuration) decides them with the
// counts of those made before under the same policy identity, and a limit
// of an old configuration still deciding decides with them too: the stores
// keep a policy's state by its name and algorithm, not by the Limit.
func TestLimitsMadeAgainKeepCounts(t *testing.T) {
	e, _ := newEngine(t, nil, "name=r key=ip limit=5/1m")
	policy := func(limit int64) *algo.Policy {
		t.Helper()
		p, err := algo.NewPolicy(algo.Spec{Name: "stays", Algorithm: algo.FixedWindow, Limit: limit, Window: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	decide := func(l *Limit) Verdict {
		t.Helper()
		var o Outcome
		e.DecideLimits(context.Background(), []LimitRequest{{Limit: l, Key: []byte("k")}}, &o)
		return o.Verdict
	}
	first := e.NewLimit("stays", policy(3))
	for i := range 2 {
		if got := decide(first); got != Allow {
			t.Fatalf("request %d: %v, want Allow", i, got)
		}
	}
	var last *Limit
	for range 50 {
		last = e.NewLimit("stays", policy(3))
	}
	// 2 of 3 spent: the limit made last admits one more, and the first,
	// of a configuration long gone, sees the same count.
	if got := decide(last); got != Allow {
		t.Errorf("third request, on the limit made last: %v, want Allow", got)
	}
	if got := decide(first); got != Deny {
		t.Errorf("fourth request, on the first limit: %v, want Deny", got)
	}
	if got := decide(last); got != Deny {
		t.Errorf("fifth request: %v, want Deny: making a limit again handed out fresh quota", got)
	}
}
