package decide

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
	"github.com/authlimit/authlimit/store/redis"
)

const tierRules = `
name=api key=header:X-Api-Key limit=3/1h algorithm=fixed_window tier=header:X-Plan
tier rule=api name=pro limit=6/1h
override rule=api key=k-acme limit=10/1h
name=cap key=header:X-Api-Key limit=2/1h path=/cap
`

// tierStore is a store to decide tiers with, and whether the guard takes
// it for one that can fail.
type tierStore struct {
	name   string
	store  guard.Store
	remote bool
}

// tierStores are the memory store, a Redis and a Redis Cluster, each with
// keys of their own.
func tierStores(t *testing.T) []tierStore {
	t.Helper()
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	srv := redistest.New(t)
	rs := redis.New(srv.Client(t), redis.Options{Prefix: srv.Prefix(t), Timeout: 5 * time.Second})
	t.Cleanup(func() { _ = rs.Close() })
	stores := []tierStore{{"memory", m, false}, {"redis", rs, true}}
	if !testing.Short() {
		c := redistest.NewCluster(t)
		cs := redis.New(c.Client(t), redis.Options{Prefix: c.Prefix(t), Timeout: 5 * time.Second})
		t.Cleanup(func() { _ = cs.Close() })
		stores = append(stores, tierStore{"cluster", cs, true})
	}
	return stores
}

// tierEngine is an engine deciding src's rules with st through a guard
// that shares its rule set, as a reload swaps it.
func tierEngine(t *testing.T, st tierStore, src string) *Engine {
	t.Helper()
	h := rulesettest.Parse(t, src)
	g, err := guard.New(guard.Options{Store: st.store, Remote: st.remote, FailMode: guard.FailClosed, DenyCacheSize: 1000, Rules: h,
		BreakerFailures: 5, BreakerBackoff: 100 * time.Millisecond, BreakerMaxBackoff: time.Second, ProbeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Rules: h, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// ask decides one request for the API key with the given headers, from a
// trusted proxy or not.
func ask(e *Engine, path, apiKey string, trusted bool, h mapHeaders) *Outcome {
	if h == nil {
		h = mapHeaders{}
	}
	h["X-Api-Key"] = []string{apiKey}
	var in Input
	e.Read(&in, netip.MustParseAddr("203.0.113.7"), []byte("GET"), []byte(path), []byte("api.example.com"), h)
	in.TrustedPeer = trusted
	o := &Outcome{}
	e.Decide(context.Background(), &in, o)
	return o
}

// admitted counts the requests admitted before the first denial, up to
// max+1 tries; every admitted one's RateLimit-Policy must be policy.
func admitted(t *testing.T, e *Engine, path, apiKey string, trusted bool, h mapHeaders, policy string, max int) int {
	t.Helper()
	for i := 0; i <= max; i++ {
		o := ask(e, path, apiKey, trusted, h)
		if o.Verdict != Allow {
			if o.Verdict != Deny {
				t.Fatalf("request %d for %s: verdict %v (%s), want allow or deny", i+1, apiKey, o.Verdict, o.Body)
			}
			return i
		}
		if got := header(o, "RateLimit-Policy"); policy != "" && got != policy {
			t.Errorf("request %d for %s: RateLimit-Policy %q, want %q", i+1, apiKey, got, policy)
		}
	}
	return max + 1
}

// TestTiersAndOverridesInEveryStore: an override applies to exactly its
// key, a tier from a trusted proxy applies, a tier from a peer that is no
// trusted proxy, an unknown one or none is the rule's own limit, a repeated
// one is refused and consumes nothing; the headers give the limit that
// applied; a denial by another rule consumes nothing of a tier; a tier has
// state of its own. Alike in the memory store, Redis and a Redis Cluster.
func TestTiersAndOverridesInEveryStore(t *testing.T) {
	pro := mapHeaders{"X-Plan": {"pro"}}
	for _, st := range tierStores(t) {
		t.Run(st.name, func(t *testing.T) {
			e := tierEngine(t, st, tierRules)
			const own, proQ, acmeQ = `"api";q=3;w=3600`, `"api";q=6;w=3600`, `"api";q=10;w=3600`
			tests := []struct {
				name    string
				key     string
				trusted bool
				h       mapHeaders
				policy  string
				want    int
			}{
				{"no tier", "k-none", true, nil, own, 3},
				{"pro from a trusted proxy", "k-pro", true, pro, proQ, 6},
				{"pro from an untrusted peer", "k-sly", false, pro, own, 3},
				{"unknown tier", "k-gold", true, mapHeaders{"X-Plan": {"gold"}}, own, 3},
				{"override", "k-acme", false, nil, acmeQ, 10},
				{"override over a tier", "k-acme-2", true, pro, proQ, 6}, // not the override's key
			}
			for _, tt := range tests {
				if got := admitted(t, e, "/", tt.key, tt.trusted, tt.h, tt.policy, 12); got != tt.want {
					t.Errorf("%s: %d admitted, want %d", tt.name, got, tt.want)
				}
			}

			// A repeated tier header is refused and consumes nothing.
			o := ask(e, "/", "k-twice", true, mapHeaders{"X-Plan": {"pro", "pro"}})
			if o.Verdict != Invalid || o.Kind != "repeated-header" || o.Status != 429 {
				t.Errorf("repeated tier: %v %s %d, want invalid repeated-header 429", o.Verdict, o.Kind, o.Status)
			}
			// From an untrusted peer a repeated one is not even read.
			if got := admitted(t, e, "/", "k-twice", false, mapHeaders{"X-Plan": {"pro", "pro"}}, own, 12); got != 3 {
				t.Errorf("repeated tier from an untrusted peer: %d admitted, want the rule's own 3", got)
			}

			// All or nothing: /cap's denial consumes nothing of pro.
			if got := admitted(t, e, "/cap", "k-all", true, pro, "", 12); got != 2 {
				t.Fatalf("/cap: %d admitted, want 2", got)
			}
			if got := admitted(t, e, "/", "k-all", true, pro, proQ, 12); got != 4 {
				t.Errorf("after /cap's denial: %d admitted under pro, want 6-2 = 4", got)
			}

			// A tier's state is its own: a client moving to pro starts
			// it afresh, and its own limit's count stays.
			if got := admitted(t, e, "/", "k-move", true, nil, own, 12); got != 3 {
				t.Fatalf("k-move: %d admitted, want 3", got)
			}
			if got := admitted(t, e, "/", "k-move", true, pro, proQ, 12); got != 6 {
				t.Errorf("k-move on pro: %d admitted, want a fresh 6", got)
			}
			if got := admitted(t, e, "/", "k-move", true, nil, own, 12); got != 0 {
				t.Errorf("k-move back on its own limit: %d admitted, want 0: its count stays", got)
			}
		})
	}
}

// TestReloadChangesAnOverrideLive: a rule set swapped in with an
// override's limit raised applies at the next decision and keeps the
// override's count; a new override applies to its key at once.
func TestReloadChangesAnOverrideLive(t *testing.T) {
	for _, st := range tierStores(t) {
		t.Run(st.name, func(t *testing.T) {
			e := tierEngine(t, st, tierRules)
			if got := admitted(t, e, "/", "k-acme", false, nil, `"api";q=10;w=3600`, 12); got != 10 {
				t.Fatalf("%d admitted, want 10", got)
			}
			if _, err := rules.Parse(tierRules + "override rule=api key=k-acme limit=12/1h\n" + "override rule=api key=k-new limit=1/1h\n"); err == nil {
				t.Fatal("two overrides of one key parsed")
			}
			next, err := rules.Parse(`
name=api key=header:X-Api-Key limit=3/1h algorithm=fixed_window tier=header:X-Plan
tier rule=api name=pro limit=6/1h
override rule=api key=k-acme limit=12/1h
override rule=api key=k-new limit=1/1h
name=cap key=header:X-Api-Key limit=2/1h path=/cap
`)
			if err != nil {
				t.Fatal(err)
			}
			swap(t, e, next)
			if got := admitted(t, e, "/", "k-acme", false, nil, `"api";q=12;w=3600`, 12); got != 2 {
				t.Errorf("after the reload: %d admitted, want 12-10 = 2", got)
			}
			if got := admitted(t, e, "/", "k-new", false, nil, `"api";q=1;w=3600`, 12); got != 1 {
				t.Errorf("a new override: %d admitted, want 1", got)
			}
		})
	}
}

// TestTierPoliciesShareTheRulesSlot: a tier's and an override's keys hash
// to the rule's own Redis Cluster slot for one client, so that one
// request's rules stay in one slot as before.
func TestTierPoliciesShareTheRulesSlot(t *testing.T) {
	rs, err := rules.Parse(tierRules)
	if err != nil {
		t.Fatal(err)
	}
	for _, client := range []string{"k-1", "k-acme", "a much longer key than most"} {
		tag := algo.AppendTag(nil, []byte(client))
		want := redistest.KeySlot(rs[0].Policy.StorageKey("p", tag))
		for _, p := range rs[0].Policies() {
			if got := redistest.KeySlot(p.StorageKey("p", tag)); got != want {
				t.Errorf("%s: slot %d, want the rule's %d", p.StorageKey("p", tag), got, want)
			}
		}
	}
}

// TestTiersInTheLocalFallback: with the store down and fail mode local,
// each tier and override is decided locally under its own limit, this
// replica's share of it (half, with a divisor of 2), with state of its
// own.
func TestTiersInTheLocalFallback(t *testing.T) {
	srv := redistest.New(t)
	rs := redis.New(srv.Client(t), redis.Options{Prefix: srv.Prefix(t), Timeout: time.Second})
	t.Cleanup(func() { _ = rs.Close() })
	local := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = local.Close() })
	rules0, err := rules.Parse("name=api key=header:X-Api-Key limit=4/1h algorithm=fixed_window tier=header:X-Plan\ntier rule=api name=pro limit=40/1h\noverride rule=api key=k-acme limit=20/1h")
	if err != nil {
		t.Fatal(err)
	}
	h := rulesettest.Holder(t, rules0)
	g, err := guard.New(guard.Options{Store: rs, Remote: true, Local: local, FailMode: guard.FailLocal, LocalDivisor: 2, DenyCacheSize: 1000, Rules: h,
		BreakerFailures: 1, BreakerBackoff: time.Minute, BreakerMaxBackoff: time.Minute, ProbeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Rules: h, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	// The first decisions find the store gone and open the circuit.
	for deadline := time.Now().Add(30 * time.Second); ; {
		o := ask(e, "/", "k-warm", true, nil)
		if o.Verdict == Allow {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the local fallback never decided: %v %s", o.Verdict, o.Body)
		}
	}
	for _, tt := range []struct {
		key  string
		h    mapHeaders
		want int
	}{{"k-own", nil, 2}, {"k-pro", mapHeaders{"X-Plan": {"pro"}}, 20}, {"k-acme", nil, 10}} {
		if got := admitted(t, e, "/", tt.key, true, tt.h, "", 50); got != tt.want {
			t.Errorf("%s with the store down: %d admitted, want %d (this replica's half of the limit)", tt.key, got, tt.want)
		}
	}
}

// TestTierDecisionAllocatesNothing: choosing a tier or an override costs
// a decision no allocation.
func TestTierDecisionAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	e, _ := newEngine(t, nil, "name=a key=header:X-Plan limit=1000000/1m tier=header:X-Plan; tier rule=a name=pro limit=2000000/1m; override rule=a key=gold limit=3000000/1m")
	var in Input
	var o Outcome
	for _, plan := range []string{"PRO", "gold", "none"} {
		hdr := oneHeader{"X-Plan", []byte(plan)}
		run := func() {
			e.Read(&in, netip.MustParseAddr("203.0.113.7"), []byte("GET"), []byte("/x"), []byte("a.example"), &hdr)
			in.TrustedPeer = true
			e.Decide(context.Background(), &in, &o)
		}
		run()
		if o.Verdict != Allow || len(o.Results) != 1 {
			t.Fatalf("%s: verdict %v, want allow", plan, o.Verdict)
		}
		if got := testing.AllocsPerRun(100, run); got != 0 {
			t.Errorf("%s: %v allocations per decision, want 0", plan, got)
		}
	}
}
