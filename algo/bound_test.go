package algo_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// TestFullMemoryNeverHandsOutFreshQuota: a client that floods a full store
// with new keys neither resets its own exhausted state nor evicts anyone's
// live state: new keys are refused, denied as limited, and counted, until
// states are back to full quota.
func TestFullMemoryNeverHandsOutFreshQuota(t *testing.T) {
	for _, a := range algo.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			clock := algotest.NewClock(algotest.Epoch)
			const max = 2000
			m := algo.NewMemory(algo.MemoryOptions{MaxKeys: max, Clock: clock.Now, SweepInterval: -1})
			defer m.Close()
			login := algotest.MustPolicy(t, algo.Spec{Name: "login", Algorithm: a, Limit: 3, Window: 10 * time.Minute})
			other := algotest.MustPolicy(t, algo.Spec{Name: "other", Algorithm: algo.FixedWindow, Limit: 100, Window: time.Hour})
			victim := []byte("victim")
			for i := range 3 {
				if res := algotest.DecideOne(t, m, algo.Request{Policy: login, Key: victim}); !res.Allowed {
					t.Fatalf("login %d denied: %+v", i+1, res)
				}
			}
			refused := 0
			for i := range 3 * max {
				res := algotest.DecideOne(t, m, algo.Request{Policy: other, Key: []byte("flood-" + strconv.Itoa(i))})
				if !res.Allowed {
					refused++
					if res.Reason != algo.ReasonLimited || res.RetryAfter <= 0 {
						t.Fatalf("refused new key: %+v; want limited with a Retry-After", res)
					}
				}
				if i%500 == 0 {
					clock.Advance(time.Second)
				}
			}
			if got := m.Len(); got > max {
				t.Errorf("Len = %d, above the bound %d", got, max)
			}
			if refused == 0 || m.Refused() != int64(refused) {
				t.Errorf("refused %d new keys, Refused() = %d; want the same, above 0", refused, m.Refused())
			}
			if res := algotest.DecideOne(t, m, algo.Request{Policy: login, Key: victim}); res.Allowed {
				t.Fatalf("the exhausted login passed again after a flood of %d new keys", 3*max)
			}
			// Once states are back to full quota, new keys take their
			// places.
			clock.Advance(time.Hour)
			if res := algotest.DecideOne(t, m, algo.Request{Policy: other, Key: []byte("late")}); !res.Allowed {
				t.Errorf("a new key after the flood's states expired was refused: %+v", res)
			}
			if m.Evicted() == 0 {
				t.Errorf("Evicted() = 0 after a new key took an expired state's place")
			}
		})
	}
}

// TestFullMemoryUnderConcurrency: goroutines deciding several policies at
// once (across shards) on a full store, while time passes, never push it
// past its bound, never lose count of what it holds, and never deadlock;
// a state exhausted before stays exhausted.
func TestFullMemoryUnderConcurrency(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	const max = 1000
	m := algo.NewMemory(algo.MemoryOptions{MaxKeys: max, Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	var ps []*algo.Policy
	for i, a := range algo.Algorithms() {
		ps = append(ps, algotest.MustPolicy(t, algo.Spec{Name: "p" + strconv.Itoa(i), Algorithm: a, Limit: 2, Window: time.Duration(i+1) * time.Second}))
	}
	held := algotest.MustPolicy(t, algo.Spec{Name: "held", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Hour})
	if res := algotest.DecideOne(t, m, algo.Request{Policy: held, Key: []byte("victim")}); !res.Allowed {
		t.Fatal("first request denied")
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]algo.Result, 3)
			for i := range 3000 {
				k := []byte("g" + strconv.Itoa(g) + "-" + strconv.Itoa(i))
				reqs := []algo.Request{{Policy: ps[i%len(ps)], Key: k}, {Policy: ps[(i+1)%len(ps)], Key: k}, {Policy: ps[(i+3)%len(ps)], Key: k, Shadow: i%2 == 0}}
				if _, err := m.Decide(context.Background(), reqs, res); err != nil {
					t.Error(err)
					return
				}
				if n := m.Len(); n > max {
					t.Errorf("Len = %d, above the bound %d", n, max)
					return
				}
				if g == 0 && i%100 == 0 {
					clock.Advance(time.Second)
				}
			}
		}()
	}
	wg.Wait()
	held2 := 0
	heap, states := m.ShardCounts()
	for i := range heap {
		if heap[i] != states[i] {
			t.Errorf("shard %d: %d expiry items for %d states", i, heap[i], states[i])
		}
		held2 += states[i]
	}
	if held2 != m.Len() {
		t.Errorf("Len = %d, but the shards hold %d", m.Len(), held2)
	}
	if m.Refused() == 0 || m.Evicted() == 0 {
		t.Errorf("Refused = %d, Evicted = %d; the test should have filled the store and let states expire", m.Refused(), m.Evicted())
	}
	if res := algotest.DecideOne(t, m, algo.Request{Policy: held, Key: []byte("victim")}); res.Allowed {
		t.Errorf("an exhausted state was evicted while it still limited")
	}
}
