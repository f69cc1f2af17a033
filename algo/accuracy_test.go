package algo_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// TestSlidingCounterAccuracy replays a bursty trace through
// sliding_window_counter and through the exact sliding_window_log, and
// reports how far the estimate strays: requests it admits that the log
// denies (over-admission) and requests it denies that the log admits
// (under-admission). It asserts the exact log's guarantee and the counter's
// known bound (at most twice the limit in any span of one window).
func TestSlidingCounterAccuracy(t *testing.T) {
	const limit = 100
	window := time.Second
	clock := algotest.NewClock(algotest.Epoch)
	m := algo.NewMemory(algo.MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	counter := algotest.MustPolicy(t, algo.Spec{Name: "counter", Algorithm: algo.SlidingWindowCounter, Limit: limit, Window: window})
	exact := algotest.MustPolicy(t, algo.Spec{Name: "log", Algorithm: algo.SlidingWindowLog, Limit: limit, Window: window})

	// Bursts of 20 to 200 requests within 50 ms, 0 to 1.5 s apart, for
	// ten minutes of traffic, with a trickle in between.
	rng := rand.New(rand.NewPCG(7, 11))
	var times []int64
	at := algotest.Epoch.UnixMicro()
	end := at + (10 * time.Minute).Microseconds()
	for at < end {
		burst := 20 + rng.IntN(181)
		for i := 0; i < burst; i++ {
			times = append(times, at+rng.Int64N(50_000))
		}
		for gap := rng.Int64N(1_500_000); gap > 0; gap -= 100_000 + rng.Int64N(100_000) {
			times = append(times, at+50_000+gap)
		}
		at += 50_000 + rng.Int64N(1_500_000)
	}
	slices.Sort(times)

	ctx := context.Background()
	var over, under, admittedCounter, admittedLog int
	var counterTimes, logTimes []int64
	res := make([]algo.Result, 1)
	for _, ts := range times {
		clock.SetMicros(ts)
		c, err := m.Decide(ctx, []algo.Request{{Policy: counter, Key: []byte("k")}}, res)
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.Decide(ctx, []algo.Request{{Policy: exact, Key: []byte("k")}}, res)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case c && !l:
			over++
		case !c && l:
			under++
		}
		if c {
			admittedCounter++
			counterTimes = append(counterTimes, ts)
		}
		if l {
			admittedLog++
			logTimes = append(logTimes, ts)
		}
	}
	maxCounter := maxInSpan(counterTimes, window.Microseconds())
	maxLog := maxInSpan(logTimes, window.Microseconds())
	t.Logf("sliding_window_counter accuracy on %d bursty requests, limit %d/%v: admitted %d vs exact log %d (%+.2f%%); "+
		"over-admitted %d (%.2f%% of requests), under-admitted %d (%.2f%%); most in any %v span: counter %d, log %d",
		len(times), limit, window, admittedCounter, admittedLog,
		100*float64(admittedCounter-admittedLog)/float64(admittedLog),
		over, 100*float64(over)/float64(len(times)), under, 100*float64(under)/float64(len(times)),
		window, maxCounter, maxLog)
	if maxLog > limit {
		t.Errorf("sliding_window_log admitted %d in one window, want at most %d", maxLog, limit)
	}
	if maxCounter > 2*limit {
		t.Errorf("sliding_window_counter admitted %d in one window, beyond its bound of %d", maxCounter, 2*limit)
	}
	if admittedLog == 0 || admittedCounter == 0 {
		t.Fatalf("trace admitted nothing (counter %d, log %d)", admittedCounter, admittedLog)
	}
}

// maxInSpan returns the most timestamps (sorted) within any half-open span
// of the given length.
func maxInSpan(ts []int64, span int64) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] >= span {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}
