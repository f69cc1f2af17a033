package guard

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

// replicas returns n guards, each with its own local store and a store that
// is down, so that every decision is the local fallback's, each guard
// dividing by n: n replicas deciding apart. The clock stands still.
func replicas(t *testing.T, n int, p *algo.Policy) []*Guard {
	t.Helper()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	var gs []*Guard
	for range n {
		mem := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1, Clock: clock})
		local := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1, Clock: clock})
		t.Cleanup(func() { _ = mem.Close(); _ = local.Close() })
		down := &flaky{mem: mem, broken: map[int]error{0: errDown, 1: errDown}}
		g, err := New(Options{
			Store: down, Remote: true, FailMode: FailLocal, Local: local, Rules: rulesettest.Holder(t, nil, p), LocalDivisor: n,
			BreakerFailures: 1, BreakerBackoff: time.Hour, BreakerMaxBackoff: time.Hour,
			ProbeTimeout: time.Second, Registry: prometheus.NewRegistry(), Clock: clock,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		gs = append(gs, g)
	}
	return gs
}

// TestDividedReplicasAdmitAtMostTheLimit: R replicas deciding apart with
// AUTHLIMIT_LOCAL_DIVISOR=R admit together at most what the policy admits at
// once, for every algorithm, cost and limit: a limit below R admits nothing,
// and a cost above one replica's share is too high there rather than
// charged the share.
func TestDividedReplicasAdmitAtMostTheLimit(t *testing.T) {
	for _, a := range algo.Algorithms() {
		for _, limit := range []int64{1, 3, 7, 10, 1000} {
			for _, r := range []int{2, 3, 4} {
				seen := map[int64]bool{}
				for _, cost := range []int64{1, 2, limit / int64(r), limit/int64(r) + 1, limit} {
					if cost < 1 || seen[cost] {
						continue
					}
					seen[cost] = true
					spec := algo.Spec{Name: "p", Algorithm: a, Limit: limit, Window: time.Hour}
					if a == algo.LeakyBucket {
						spec.Delay = time.Second
					}
					p, err := algo.NewPolicy(spec)
					if err != nil {
						t.Fatal(err)
					}
					name := fmt.Sprintf("%s/limit=%d/replicas=%d/cost=%d", a, limit, r, cost)
					t.Run(name, func(t *testing.T) {
						gs := replicas(t, r, p)
						var admitted int64
						share := p.MaxCost() / int64(r)
						for i := range 2 * r * int(limit/cost+1) {
							g := gs[i%r]
							var res [1]algo.Result
							ok, err := g.Decide(context.Background(), []algo.Request{{Policy: p, Key: []byte("k"), Cost: cost}}, res[:])
							if err != nil {
								t.Fatalf("Decide: %v", err)
							}
							if ok {
								admitted += cost
								continue
							}
							if want := cost > share; (res[0].Reason == algo.ReasonCostTooHigh) != want {
								t.Fatalf("denial %+v on a replica whose share is %d; cost too high = %v, want %v", res[0], share, res[0].Reason == algo.ReasonCostTooHigh, want)
							}
						}
						if admitted > p.MaxCost() {
							t.Errorf("%d replicas admitted %d, more than the policy's %d", r, admitted, p.MaxCost())
						}
						if cost <= share && admitted < int64(r)*cost {
							t.Errorf("%d replicas admitted %d; each should admit at least one request of %d", r, admitted, cost)
						}
					})
				}
			}
		}
	}
}

// TestFullLocalStoreNeverHandsOutFreshQuota: the local fallback's bounded
// store, full, refuses new keys rather than evicting a state that still
// limits: a flood of new keys during an outage does not reset a client's
// exhausted quota.
func TestFullLocalStoreNeverHandsOutFreshQuota(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mem := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1, Clock: clock})
	local := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1, Clock: clock, MaxKeys: 500})
	t.Cleanup(func() { _ = mem.Close(); _ = local.Close() })
	login, err := algo.NewPolicy(algo.Spec{Name: "login", Algorithm: algo.FixedWindow, Limit: 3, Window: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	api, err := algo.NewPolicy(algo.Spec{Name: "api", Algorithm: algo.FixedWindow, Limit: 100, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Options{
		Store: &flaky{mem: mem, broken: map[int]error{0: errDown, 1: errDown}}, Remote: true, FailMode: FailLocal, Local: local,
		Rules: rulesettest.Holder(t, nil, login, api), LocalDivisor: 1,
		BreakerFailures: 1, BreakerBackoff: time.Hour, BreakerMaxBackoff: time.Hour,
		ProbeTimeout: time.Second, Registry: prometheus.NewRegistry(), Clock: clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	decide := func(p *algo.Policy, key string) (algo.Result, bool) {
		var res [1]algo.Result
		ok, err := g.Decide(context.Background(), []algo.Request{{Policy: p, Key: []byte(key)}}, res[:])
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		return res[0], ok
	}
	for i := range 3 {
		if _, ok := decide(login, "victim"); !ok {
			t.Fatalf("login %d denied", i+1)
		}
	}
	for i := range 2000 {
		decide(api, "flood-"+strconv.Itoa(i))
	}
	if local.Refused() == 0 {
		t.Errorf("the full local store refused no new key")
	}
	if res, ok := decide(login, "victim"); ok {
		t.Errorf("the exhausted login passed the local fallback again after a flood of new keys: %+v", res)
	}
}

// TestDividedCostAboveTheLargestLimit: a policy whose limit is the largest
// there is still answers a cost above one replica's share as too high,
// though no cost R times as large can be asked of the local store.
func TestDividedCostAboveTheLargestLimit(t *testing.T) {
	p, err := algo.NewPolicy(algo.Spec{Name: "huge", Algorithm: algo.FixedWindow, Limit: algo.MaxLimit, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	gs := replicas(t, 2, p)
	for _, tc := range []struct {
		cost    int64
		allowed bool
	}{{algo.MaxLimit, false}, {algo.MaxLimit/2 + 1, false}, {algo.MaxLimit / 2, true}} {
		var res [1]algo.Result
		ok, err := gs[0].Decide(context.Background(), []algo.Request{{Policy: p, Key: []byte("k"), Cost: tc.cost}}, res[:])
		if err != nil {
			t.Fatalf("cost %d: %v", tc.cost, err)
		}
		if ok != tc.allowed || !ok && res[0].Reason != algo.ReasonCostTooHigh {
			t.Errorf("cost %d on one of 2 replicas: admitted %v, %+v; want admitted %v, else cost too high", tc.cost, ok, res[0], tc.allowed)
		}
	}
}
