package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/redistest"
)

// TestNewPolicyOfTheSameIdentityKeepsTheState: a policy rebuilt with a new
// limit (a rule set reloaded) under the same name and algorithm continues
// from its predecessor's state, in both stores alike, and the new limit
// holds from the next decision. What carries over is each algorithm's
// state: the windows and the log count what was admitted, so 6 of an old
// 10 leave 2 of a new 8; a token bucket keeps its 4 tokens left, however
// large the new burst.
func TestNewPolicyOfTheSameIdentityKeepsTheState(t *testing.T) {
	tests := []struct {
		alg      algo.Algorithm
		leftOver int64 // admitted under the new policy after 6 under the old
	}{
		{algo.FixedWindow, 2},
		{algo.SlidingWindowCounter, 2},
		{algo.SlidingWindowLog, 2},
		{algo.TokenBucket, 4},
		{algo.LeakyBucket, 2},
		{algo.GCRA, 2},
	}
	for _, tt := range tests {
		clock := algotest.NewClock(algotest.Epoch)
		for _, st := range bothStores(t, clock) {
			t.Run(fmt.Sprintf("%s/%s", st.name, tt.alg), func(t *testing.T) {
				name := fmt.Sprintf("carry-%d", tt.alg)
				old := algotest.MustPolicy(t, algo.Spec{Name: name, Algorithm: tt.alg, Limit: 10, Window: time.Hour})
				renewed := algotest.MustPolicy(t, algo.Spec{Name: name, Algorithm: tt.alg, Limit: 8, Window: time.Hour})
				key := algo.Tag(fmt.Sprintf("client-%s-%d", st.name, tt.alg))
				decide := func(p *algo.Policy) algo.Result {
					t.Helper()
					res := make([]algo.Result, 1)
					if _, err := st.store.Decide(context.Background(), []algo.Request{{Policy: p, Key: key}}, res); err != nil {
						t.Fatal(err)
					}
					return res[0]
				}
				for i := 0; i < 6; i++ {
					if r := decide(old); !r.Allowed {
						t.Fatalf("request %d under the old policy denied: %+v", i+1, r)
					}
				}
				admitted := int64(0)
				for i := 0; i < 10; i++ {
					r := decide(renewed)
					if r.Limit != 8 {
						t.Errorf("Limit under the new policy = %d, want 8", r.Limit)
					}
					if !r.Allowed {
						break
					}
					admitted++
				}
				if admitted != tt.leftOver {
					t.Errorf("admitted %d under the new policy, want %d (a fresh state would admit 8)", admitted, tt.leftOver)
				}
			})
		}
	}
}

// TestRedisRegistryGrowsWithDistinctPolicies: rebuilding the same policy
// again and again (reload after reload) keeps one id in the Redis store;
// a changed limit takes another, since a batch may carry both.
func TestRedisRegistryGrowsWithDistinctPolicies(t *testing.T) {
	srv := redistest.New(t)
	rs := newRedis(t, srv.Client(t), srv.Prefix(t))
	decide := func(p *algo.Policy) {
		t.Helper()
		res := make([]algo.Result, 1)
		if _, err := rs.Decide(context.Background(), []algo.Request{{Policy: p, Key: algo.Tag("k")}}, res); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 100; i++ {
		decide(algotest.MustPolicy(t, algo.Spec{Name: "grow", Algorithm: algo.GCRA, Limit: 10, Window: time.Minute}))
	}
	decide(algotest.MustPolicy(t, algo.Spec{Name: "grow", Algorithm: algo.GCRA, Limit: 11, Window: time.Minute}))
	rs.regMu.RLock()
	defer rs.regMu.RUnlock()
	if got, want := len(rs.policies), 2; got != want {
		t.Errorf("registry holds %d policies after 100 rebuilds of one and a changed limit, want %d", got, want)
	}
}
