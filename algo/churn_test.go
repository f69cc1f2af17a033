package algo_test

import (
	"flag"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/race"
)

var churnFor = flag.Duration("churn", 0, "run TestHeavyMemoryBoundedUnderChurn for this long instead of a few seconds' worth of churn, reporting the heap each minute (e.g. -churn 30m)")

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestHeavyMemoryBoundedUnderChurn: a full store under sustained churn (every
// request a new key, states expiring as fast as new ones come) keeps its
// heap at what it held once full. Go maps never shrink, and under churn a
// map's tables keep splitting though it holds no more entries: the shards
// rebuild their maps, so the heap follows the states, not the churn. Some
// 900,000 decisions from one goroutine: make test runs it without the race
// detector.
func TestHeavyMemoryBoundedUnderChurn(t *testing.T) {
	race.Heavy(t)
	const max = 20_000
	clock := algotest.NewClock(algotest.Epoch)
	m := algo.NewMemory(algo.MemoryOptions{MaxKeys: max, Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	p := algotest.MustPolicy(t, algo.Spec{Name: "churn", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Second})
	l := algotest.MustPolicy(t, algo.Spec{Name: "log", Algorithm: algo.SlidingWindowLog, Limit: 1, Window: time.Second})
	next := 0
	round := func() {
		// One window's worth of new keys fills the store; the next
		// window's replace them as they expire.
		for range max {
			q := algo.Request{Policy: p, Key: []byte("client-" + strconv.Itoa(next))}
			if next%4 == 0 {
				q.Policy = l
			}
			next++
			if res := algotest.DecideOne(t, m, q); !res.Allowed {
				t.Fatalf("new key %d refused: %+v (the store's states had all expired)", next, res)
			}
		}
		clock.Advance(time.Second)
	}
	for range 5 {
		round()
	}
	full := liveHeap()
	if *churnFor > 0 {
		start, report := time.Now(), time.Now()
		for time.Since(start) < *churnFor {
			round()
			if time.Since(report) >= time.Minute {
				report = time.Now()
				t.Logf("%v: %d keys churned, %d held, heap %.1f MB (%.1f MB once full)", time.Since(start).Round(time.Second), next, m.Len(), float64(liveHeap())/1e6, float64(full)/1e6)
			}
		}
	} else {
		for range 40 {
			round()
		}
	}
	after := liveHeap()
	t.Logf("%d keys churned through a store of %d: heap %.1f MB once full, %.1f MB after", next, max, float64(full)/1e6, float64(after)/1e6)
	if m.Len() > max {
		t.Errorf("Len = %d, above the bound %d", m.Len(), max)
	}
	// Allow the runtime's own noise. Without the rebuilds, the heap grew
	// by a fifth in this many rounds.
	if limit := full + full/10 + 256<<10; after > limit {
		t.Errorf("heap grew from %d to %d bytes under churn at a constant %d states; want at most %d", full, after, m.Len(), limit)
	}
}
