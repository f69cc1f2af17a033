package algo

import (
	"context"
	"fmt"
	"testing"
	"time"

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
		alg      Algorithm
		leftOver int64 // admitted under the new policy after 6 under the old
	}{
		{FixedWindow, 2},
		{SlidingWindowCounter, 2},
		{SlidingWindowLog, 2},
		{TokenBucket, 4},
		{LeakyBucket, 2},
		{GCRA, 2},
	}
	for _, tt := range tests {
		clock := newFakeClock(epoch)
		for _, st := range bothStores(t, clock) {
			t.Run(fmt.Sprintf("%s/%s", st.name, tt.alg), func(t *testing.T) {
				name := fmt.Sprintf("carry-%d", tt.alg)
				old := mustPolicy(t, Spec{Name: name, Algorithm: tt.alg, Limit: 10, Window: time.Hour})
				renewed := mustPolicy(t, Spec{Name: name, Algorithm: tt.alg, Limit: 8, Window: time.Hour})
				key := Tag(fmt.Sprintf("client-%s-%d", st.name, tt.alg))
				decide := func(p *Policy) Result {
					t.Helper()
					res := make([]Result, 1)
					if _, err := st.store.Decide(context.Background(), []Request{{Policy: p, Key: key}}, res); err != nil {
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

// TestMemoryRegistryGrowsWithIdentities: rebuilding a policy again and
// again (reload after reload) registers one identity, not one per policy.
func TestMemoryRegistryGrowsWithIdentities(t *testing.T) {
	m := NewMemory(MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	for i := 0; i < 100; i++ {
		for _, alg := range []Algorithm{FixedWindow, TokenBucket} {
			p := mustPolicy(t, Spec{Name: "grow", Algorithm: alg, Limit: int64(10 + i), Window: time.Minute})
			res := make([]Result, 1)
			if _, err := m.Decide(context.Background(), []Request{{Policy: p, Key: Tag("k")}}, res); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.regMu.RLock()
	defer m.regMu.RUnlock()
	if got, want := len(m.ids), 2; got != want {
		t.Errorf("registry holds %d identities after 100 rebuilds of 2 policies, want %d", got, want)
	}
	if got, want := len(m.policies), 2; got != want {
		t.Errorf("registry holds %d policies, want %d", got, want)
	}
}

// TestRedisRegistryGrowsWithDistinctPolicies: rebuilding the same policy
// again and again (reload after reload) keeps one id in the Redis store;
// a changed limit takes another, since a batch may carry both.
func TestRedisRegistryGrowsWithDistinctPolicies(t *testing.T) {
	srv := redistest.New(t)
	rs := newRedis(t, srv.Client(t), srv.Prefix(t))
	decide := func(p *Policy) {
		t.Helper()
		res := make([]Result, 1)
		if _, err := rs.Decide(context.Background(), []Request{{Policy: p, Key: Tag("k")}}, res); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 100; i++ {
		decide(mustPolicy(t, Spec{Name: "grow", Algorithm: GCRA, Limit: 10, Window: time.Minute}))
	}
	decide(mustPolicy(t, Spec{Name: "grow", Algorithm: GCRA, Limit: 11, Window: time.Minute}))
	rs.regMu.RLock()
	defer rs.regMu.RUnlock()
	if got, want := len(rs.policies), 2; got != want {
		t.Errorf("registry holds %d policies after 100 rebuilds of one and a changed limit, want %d", got, want)
	}
}
