package algo_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// TestMemoryKeepsLongLivedState: state that matters for years survives a
// sweep, so the same cost is not admitted again.
func TestMemoryKeepsLongLivedState(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	m := algo.NewMemory(algo.MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	for _, s := range []algo.Spec{
		{Name: "tb", Algorithm: algo.TokenBucket, Limit: 1, Window: algo.MaxWindow, Burst: 10},
		{Name: "lb", Algorithm: algo.LeakyBucket, Limit: 1, Window: algo.MaxWindow, Burst: 10},
		{Name: "gcra", Algorithm: algo.GCRA, Limit: 1, Window: algo.MaxWindow, Burst: 10},
		{Name: "swc", Algorithm: algo.SlidingWindowCounter, Limit: 10, Window: algo.MaxWindow},
		{Name: "swl", Algorithm: algo.SlidingWindowLog, Limit: 10, Window: algo.MaxWindow},
	} {
		p := algotest.MustPolicy(t, s)
		if res := algotest.DecideOne(t, m, algo.Request{Policy: p, Key: []byte("k"), Cost: 10}); !res.Allowed {
			t.Fatalf("%s: first request denied: %+v", s.Name, res)
		}
		clock.Advance(time.Second)
		m.Sweep()
		if res := algotest.DecideOne(t, m, algo.Request{Policy: p, Key: []byte("k"), Cost: 10}); res.Allowed {
			t.Errorf("%s: a sweep forgot state that matters for years: %+v", s.Name, res)
		}
	}
}

// TestMemoryEvictsOnlyWhenFull: state goes only when the store as a whole
// holds MaxKeys states, and then only state that is back to full quota: a
// new key past the bound is refused while every state still limits.
func TestMemoryEvictsOnlyWhenFull(t *testing.T) {
	for _, max := range []int{100, 1000, 20_000} {
		t.Run(strconv.Itoa(max), func(t *testing.T) {
			clock := algotest.NewClock(algotest.Epoch)
			m := algo.NewMemory(algo.MemoryOptions{MaxKeys: max, Clock: clock.Now, SweepInterval: -1})
			defer m.Close()
			p := algotest.MustPolicy(t, algo.Spec{Name: "once", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Hour})
			key := func(i int) []byte { return []byte("client-" + strconv.Itoa(i)) }
			for i := 0; i < max; i++ {
				if res := algotest.DecideOne(t, m, algo.Request{Policy: p, Key: key(i)}); !res.Allowed {
					t.Fatalf("key %d: first request denied", i)
				}
			}
			for i := 0; i < max; i++ {
				if res := algotest.DecideOne(t, m, algo.Request{Policy: p, Key: key(i)}); res.Allowed {
					t.Fatalf("key %d of %d admitted twice within its hour: evicted below the bound", i, max)
				}
			}
			if got := m.Len(); got != max {
				t.Fatalf("Len = %d, want %d", got, max)
			}
			if res := algotest.DecideOne(t, m, algo.Request{Policy: p, Key: key(max)}); res.Allowed || res.Reason != algo.ReasonLimited || res.Remaining != 0 {
				t.Errorf("a key past the bound of live states = %+v; want refused as limited", res)
			}
			if got := m.Len(); got != max {
				t.Errorf("Len = %d after one key past the bound, want %d", got, max)
			}
			if got := m.Refused(); got != 1 {
				t.Errorf("Refused = %d, want 1", got)
			}
			for i := 0; i < max; i++ {
				if algotest.DecideOne(t, m, algo.Request{Policy: p, Key: key(i)}).Allowed {
					t.Fatalf("key %d was evicted while it still limited", i)
				}
			}
			// In the next window every state is back to full quota:
			// new keys replace them.
			clock.Advance(time.Hour)
			for i := max; i < 2*max; i++ {
				if res := algotest.DecideOne(t, m, algo.Request{Policy: p, Key: key(i)}); !res.Allowed {
					t.Fatalf("new key %d refused though every state expired: %+v", i, res)
				}
			}
			if got, want := m.Evicted(), int64(max); got != want {
				t.Errorf("Evicted = %d, want %d", got, want)
			}
		})
	}
}
