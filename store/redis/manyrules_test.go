package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// TestMostRulesDecideAsMemory decides requests of MaxRules rules, every
// algorithm among them, on both stores until the tightest rule denies, then
// with that rule a shadow: decide.lua decides a request of several rules
// one rule a level deeper each, so this is its deepest request, and its
// answers must still be the memory store's.
// Without sliding_window_log, the request is read in the flat layout, whose
// one unpack and one MGET then carry the most values.
func TestMostRulesDecideAsMemory(t *testing.T) {
	var flat []algo.Algorithm
	for _, a := range algo.Algorithms() {
		if a != algo.SlidingWindowLog {
			flat = append(flat, a)
		}
	}
	t.Run("every algorithm", func(t *testing.T) { mostRules(t, algo.Algorithms()) })
	t.Run("flat", func(t *testing.T) { mostRules(t, flat) })
}

// mostRules is TestMostRulesDecideAsMemory's run over the algorithms algs.
func mostRules(t *testing.T, algs []algo.Algorithm) {
	clock := algotest.NewClock(algotest.Epoch)
	stores := bothStores(t, clock)
	mem, rs := stores[0].store, stores[1].store
	ctx := context.Background()
	reqs := make([]algo.Request, algo.MaxRules)
	for i := range reqs {
		a := algs[i%len(algs)]
		p := algotest.MustPolicy(t, algo.Spec{Name: fmt.Sprintf("many-%d", i), Algorithm: a, Limit: int64(3 + i), Window: time.Minute})
		reqs[i] = algo.Request{Policy: p, Key: []byte("198.51.100.9")}
	}
	denied := false
	for step := 0; step < 8; step++ {
		clock.Advance(time.Second)
		want, got := make([]algo.Result, len(reqs)), make([]algo.Result, len(reqs))
		okWant, err := mem.Decide(ctx, reqs, want)
		if err != nil {
			t.Fatalf("memory: %v", err)
		}
		okGot, err := rs.Decide(ctx, reqs, got)
		if err != nil {
			t.Fatalf("redis: %v", err)
		}
		if okWant != okGot || !equalResults(want, got) {
			t.Fatalf("step %d: stores disagree\nmemory %v %+v\nredis  %v %+v", step, okWant, want, okGot, got)
		}
		if !okGot {
			denied = true
			for i := range reqs {
				if !got[i].Allowed {
					reqs[i].Shadow = true
				}
			}
		}
	}
	if !denied {
		t.Fatal("no request was denied: the test never saw a denial undo the other rules")
	}
}
