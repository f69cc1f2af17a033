package decide

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/rules"
)

// newEngine returns an engine deciding src's rules (and the policies of
// more rule sets, for SetRules) with the memory store through a guard.
func newEngine(t testing.TB, d func(Decider) Decider, src string, more ...string) (*Engine, [][]*rules.Rule) {
	t.Helper()
	var sets [][]*rules.Rule
	var policies []*algo.Policy
	for _, s := range append([]string{src}, more...) {
		rs, err := rules.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, rs)
		for _, r := range rs {
			policies = append(policies, r.Policy)
		}
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	g, err := guard.New(guard.Options{Store: m, Policies: policies, DenyCacheSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var dec Decider = g
	if d != nil {
		dec = d(g)
	}
	e, err := New(Options{Rules: sets[0], Decider: dec, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429,
		BlockCIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}})
	if err != nil {
		t.Fatal(err)
	}
	return e, sets
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

// TestSetRulesInFlight: a request that started under one rule set finishes
// under it, headers and results included, while a rule set swapped in
// meanwhile decides the requests that start after.
func TestSetRulesInFlight(t *testing.T) {
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
	if err := e.SetRules(sets[1]); err != nil {
		t.Fatal(err)
	}
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
	if got := e.Rules(); len(got) != 1 || got[0] != sets[1][0] {
		t.Errorf("Rules() = %v, want the new set", got)
	}
	if err := e.SetRules(nil); err == nil {
		t.Error("SetRules(nil) accepted")
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
	reg := prometheus.NewRegistry()
	g, err := guard.New(guard.Options{Store: m, Policies: []*algo.Policy{a, b}, DenyCacheSize: 100, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rules.Parse("name=r key=ip limit=1/1m")
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Rules: rs, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429, Registry: reg})
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

// registrar is a Decider that learns policies, and refuses them when told
// to.
type registrar struct {
	Decider
	learnt [][]*algo.Policy
	refuse error
}

func (r *registrar) RegisterPolicies(ps []*algo.Policy) error {
	if r.refuse != nil {
		return r.refuse
	}
	r.learnt = append(r.learnt, ps)
	return nil
}

// TestSetRulesRegistersPolicies: SetRules tells a PolicyRegistrar the new
// set's policies before swapping it in, and keeps the set in force when it
// refuses them.
func TestSetRulesRegistersPolicies(t *testing.T) {
	reg := &registrar{}
	e, sets := newEngine(t, func(d Decider) Decider { reg.Decider = d; return reg }, "name=old key=ip limit=5/1m", "name=new key=ip limit=7/1h; name=other key=ip limit=9/1h")
	if err := e.SetRules(sets[1]); err != nil {
		t.Fatal(err)
	}
	if len(reg.learnt) != 1 || len(reg.learnt[0]) != 2 || reg.learnt[0][0] != sets[1][0].Policy || reg.learnt[0][1] != sets[1][1].Policy {
		t.Errorf("learnt %v, want the new set's two policies", reg.learnt)
	}
	// A front's limit stays registered through later swaps; one made on
	// demand is not registered.
	front, err := algo.NewPolicy(algo.Spec{Name: "front", Algorithm: algo.FixedWindow, Limit: 3, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	e.NewLimit("front", front)
	e.NewLimitCountedAs("on-demand", "override", sets[0][0].Policy)
	if err := e.SetRules(sets[1]); err != nil {
		t.Fatal(err)
	}
	if got := reg.learnt[len(reg.learnt)-1]; len(got) != 3 || got[2] != front {
		t.Errorf("learnt %v, want the set's two policies and the front's", got)
	}
	reg.refuse = errors.New("full")
	if err := e.SetRules(sets[0]); err == nil || !strings.Contains(err.Error(), "full") {
		t.Errorf("SetRules with a refusing registrar: %v", err)
	}
	if got := e.Rules(); len(got) != 2 || got[0] != sets[1][0] {
		t.Errorf("after a refused swap, rules %v, want the set in force", got)
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

// TestReleaseLimits: a front that makes its limits again on every reload
// and releases the previous ones (the rate-limit service) leaves the
// engine holding only the limits alive, each policy identity registered
// once with the rules', however many reloads; a limit made again under
// the same policy keeps its counts, and an old limit still deciding after
// its release decides with them.
func TestReleaseLimits(t *testing.T) {
	reg := &registrar{}
	e, _ := newEngine(t, func(d Decider) Decider { reg.Decider = d; return reg }, "name=r key=ip limit=5/1m")
	policy := func(name string, limit int64) *algo.Policy {
		t.Helper()
		p, err := algo.NewPolicy(algo.Spec{Name: name, Algorithm: algo.FixedWindow, Limit: limit, Window: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	decide := func(l *Limit, key string) Verdict {
		t.Helper()
		var o Outcome
		e.DecideLimits(context.Background(), []LimitRequest{{Limit: l, Key: []byte(key)}}, &o)
		return o.Verdict
	}
	// A configuration: "stays" (limit 3) and one limit of its own.
	load := func(i int) []*Limit {
		return []*Limit{e.NewLimit("stays", policy("stays", 3)), e.NewLimit("gone", policy(fmt.Sprintf("gone-%d", i), 9))}
	}
	live := load(0)
	for i, want := range []Verdict{Allow, Allow} {
		if got := decide(live[0], "k"); got != want {
			t.Fatalf("request %d before any reload: %v, want %v", i, got, want)
		}
	}
	first := live[0]
	const reloads = 50
	for i := 1; i <= reloads; i++ {
		next := load(i)
		if err := e.ReleaseLimits(live...); err != nil {
			t.Fatalf("reload %d: ReleaseLimits: %v", i, err)
		}
		live = next
	}
	e.mu.Lock()
	kept := len(e.kept)
	e.mu.Unlock()
	if kept != 2 {
		t.Errorf("after %d reloads the engine keeps %d limits, want 2", reloads, kept)
	}
	var names []string
	for _, p := range reg.learnt[len(reg.learnt)-1] {
		names = append(names, p.Name())
	}
	if want := []string{"r", "stays", fmt.Sprintf("gone-%d", reloads)}; !slices.Equal(names, want) {
		t.Errorf("registered %v after %d reloads, want %v", names, reloads, want)
	}
	if err := e.SetRules(e.Rules()); err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, p := range reg.learnt[len(reg.learnt)-1] {
		names = append(names, p.Name())
	}
	if want := []string{"r", "stays", fmt.Sprintf("gone-%d", reloads)}; !slices.Equal(names, want) {
		t.Errorf("SetRules registered %v, want %v", names, want)
	}
	// 2 of 3 spent before the reloads: the limit in force admits one
	// more, and the first limit, released long ago, sees the same count.
	if got := decide(live[0], "k"); got != Allow {
		t.Errorf("third request after %d reloads: %v, want Allow", reloads, got)
	}
	if got := decide(first, "k"); got != Deny {
		t.Errorf("fourth request, on a released limit: %v, want Deny", got)
	}
	if got := decide(live[0], "k"); got != Deny {
		t.Errorf("fifth request: %v, want Deny: a reload handed out fresh quota", got)
	}
	// Releasing again, or what NewLimit never made, changes nothing.
	n := len(reg.learnt)
	if err := e.ReleaseLimits(first, e.NewLimitCountedAs("x", "override", policy("x", 1))); err != nil || len(reg.learnt) != n {
		t.Errorf("a release of nothing alive: %v, %d registrations, want none", err, len(reg.learnt)-n)
	}
	reg.refuse = errors.New("full")
	if err := e.ReleaseLimits(live[1]); err == nil || !strings.Contains(err.Error(), "full") {
		t.Errorf("ReleaseLimits with a refusing registrar: %v", err)
	}
}
