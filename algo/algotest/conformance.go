package algotest

import (
	"context"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
)

const ms = time.Millisecond

// step is one request in a scenario: at a time after epoch, for a key, with a
// cost, and the answer expected.
type step struct {
	at   time.Duration
	key  string // default "k"
	cost int64
	want algo.Result
}

func allow(remaining int64, reset time.Duration) algo.Result {
	return algo.Result{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

func deny(remaining int64, reset, retry time.Duration) algo.Result {
	return algo.Result{Reason: algo.ReasonLimited, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
}

func tooCostly(remaining int64, reset time.Duration) algo.Result {
	return algo.Result{Reason: algo.ReasonCostTooHigh, Remaining: remaining, ResetAfter: reset}
}

func delayed(r algo.Result, d time.Duration) algo.Result {
	r.Delay = d
	return r
}

// conformance is worked by hand from each algorithm's definition; the same
// table runs against every store.
var conformance = []struct {
	name  string
	spec  algo.Spec
	steps []step
}{
	{"fixed_window", algo.Spec{Algorithm: algo.FixedWindow, Limit: 3, Window: time.Second}, []step{
		{at: 0, cost: 1, want: allow(2, 1000*ms)},
		{at: 100 * ms, cost: 2, want: allow(0, 900*ms)},
		{at: 200 * ms, cost: 1, want: deny(0, 800*ms, 800*ms)},
		{at: 999 * ms, cost: 1, want: deny(0, 1*ms, 1*ms)},
		{at: 500 * ms, key: "other", cost: 3, want: allow(0, 500*ms)},
		{at: 1000 * ms, cost: 1, want: allow(2, 1000*ms)},
		{at: 1500 * ms, cost: 4, want: tooCostly(2, 500*ms)},
		{at: 1500 * ms, cost: 3, want: deny(2, 500*ms, 500*ms)},
		// The clock steps back into the previous window: the later
		// window's count still holds.
		{at: 900 * ms, cost: 3, want: deny(2, 1100*ms, 1100*ms)},
		{at: 5000 * ms, cost: 4, want: tooCostly(3, 0)},
	}},
	{"sliding_window_log", algo.Spec{Algorithm: algo.SlidingWindowLog, Limit: 3, Window: time.Second}, []step{
		{at: 0, cost: 1, want: allow(2, 1000*ms)},
		{at: 300 * ms, cost: 1, want: allow(1, 1000*ms)},
		{at: 600 * ms, cost: 1, want: allow(0, 1000*ms)},
		{at: 900 * ms, cost: 1, want: deny(0, 700*ms, 100*ms)},
		{at: 999 * ms, cost: 2, want: deny(0, 601*ms, 301*ms)},
		{at: 1000 * ms, cost: 1, want: allow(0, 1000*ms)},
		{at: 1000 * ms, cost: 4, want: tooCostly(0, 1000*ms)},
		{at: 1000 * ms, key: "other", cost: 3, want: allow(0, 1000*ms)},
		{at: 2600 * ms, cost: 3, want: allow(0, 1000*ms)},
		{at: 2700 * ms, cost: 1, want: deny(0, 900*ms, 900*ms)},
	}},
	{"sliding_window_log_weighted", algo.Spec{Algorithm: algo.SlidingWindowLog, Limit: 10, Window: time.Second}, []step{
		{at: 0, cost: 6, want: allow(4, 1000*ms)},
		{at: 0, cost: 3, want: allow(1, 1000*ms)},
		{at: 400 * ms, cost: 1, want: allow(0, 1000*ms)},
		// Needs 5 units freed: the 6 admitted at 0 leave at 1000.
		{at: 500 * ms, cost: 5, want: deny(0, 900*ms, 500*ms)},
		{at: 1000 * ms, cost: 5, want: allow(4, 1000*ms)},
	}},
	{"sliding_window_counter", algo.Spec{Algorithm: algo.SlidingWindowCounter, Limit: 10, Window: time.Second}, []step{
		{at: 0, cost: 5, want: allow(5, 2000*ms)},
		{at: 500 * ms, cost: 5, want: allow(0, 1500*ms)},
		{at: 600 * ms, cost: 1, want: deny(0, 1400*ms, 500*ms)},
		// prev 10 weighs 10·0.9 = 9.
		{at: 1100 * ms, cost: 1, want: allow(0, 1900*ms)},
		{at: 1100 * ms, cost: 1, want: deny(0, 1900*ms, 100*ms)},
		{at: 1200 * ms, cost: 1, want: allow(0, 1800*ms)},
		{at: 3500 * ms, cost: 10, want: allow(0, 1500*ms)},
		{at: 3500 * ms, cost: 11, want: tooCostly(0, 1500*ms)},
		{at: 4250 * ms, key: "other", cost: 2, want: allow(8, 1750*ms)},
	}},
	{"token_bucket", algo.Spec{Algorithm: algo.TokenBucket, Limit: 2, Window: time.Second, Burst: 4}, []step{
		{at: 0, cost: 4, want: allow(0, 2000*ms)},
		{at: 0, cost: 1, want: deny(0, 2000*ms, 500*ms)},
		{at: 250 * ms, cost: 1, want: deny(0, 1750*ms, 250*ms)},
		{at: 500 * ms, cost: 1, want: allow(0, 2000*ms)},
		// 1.25 s refill 2.5 tokens; half a token is kept.
		{at: 1750 * ms, cost: 2, want: allow(0, 1750*ms)},
		{at: 1750 * ms, cost: 5, want: tooCostly(0, 1750*ms)},
		{at: 2000 * ms, cost: 1, want: allow(0, 2000*ms)},
		{at: 10000 * ms, cost: 1, want: allow(3, 500*ms)},
	}},
	{"token_bucket_fractional", algo.Spec{Algorithm: algo.TokenBucket, Limit: 3, Window: time.Second, Burst: 1}, []step{
		{at: 0, cost: 1, want: allow(0, 333334*time.Microsecond)},
		// A third of a second refills 0.999999 of a token: not enough.
		{at: 333333 * time.Microsecond, cost: 1, want: deny(0, 1*time.Microsecond, 1*time.Microsecond)},
		{at: 333334 * time.Microsecond, cost: 1, want: allow(0, 333334*time.Microsecond)},
	}},
	{"leaky_bucket", algo.Spec{Algorithm: algo.LeakyBucket, Limit: 2, Window: time.Second, Burst: 2}, []step{
		{at: 0, cost: 2, want: allow(0, 1000*ms)},
		{at: 0, cost: 1, want: deny(0, 1000*ms, 500*ms)},
		{at: 500 * ms, cost: 1, want: allow(0, 1000*ms)},
		{at: 2000 * ms, cost: 3, want: tooCostly(2, 0)},
		{at: 2000 * ms, cost: 1, want: allow(1, 500*ms)},
	}},
	{"leaky_bucket_shaping", algo.Spec{Algorithm: algo.LeakyBucket, Limit: 2, Window: time.Second, Burst: 1, Delay: time.Second}, []step{
		{at: 0, cost: 1, want: allow(0, 500*ms)},
		{at: 0, cost: 1, want: delayed(allow(0, 1000*ms), 500*ms)},
		{at: 0, cost: 1, want: delayed(allow(0, 1500*ms), 1000*ms)},
		{at: 0, cost: 1, want: deny(0, 1500*ms, 500*ms)},
		{at: 250 * ms, cost: 1, want: deny(0, 1250*ms, 250*ms)},
		{at: 500 * ms, cost: 1, want: delayed(allow(0, 1500*ms), 1000*ms)},
		{at: 500 * ms, cost: 4, want: tooCostly(0, 1500*ms)},
		{at: 5000 * ms, cost: 3, want: delayed(allow(0, 1500*ms), 1000*ms)},
	}},
	{"gcra", algo.Spec{Algorithm: algo.GCRA, Limit: 10, Window: time.Second, Burst: 2}, []step{
		{at: 0, cost: 1, want: allow(1, 100*ms)},
		{at: 0, cost: 1, want: allow(0, 200*ms)},
		{at: 0, cost: 1, want: deny(0, 200*ms, 100*ms)},
		{at: 150 * ms, cost: 1, want: allow(0, 150*ms)},
		{at: 150 * ms, cost: 3, want: tooCostly(0, 150*ms)},
		{at: 1000 * ms, cost: 2, want: allow(0, 200*ms)},
		{at: 1000 * ms, key: "other", cost: 1, want: allow(1, 100*ms)},
	}},
}

// Conformance holds a store to the hand-worked table: each rule alone in
// its request, and beside a rule that always admits, before or after it
// (for the Redis store, the flat layout, or the batch beside a
// sliding_window_log): the other rule changes nothing of its answers.
// open returns the store, reading clock, for one case; its policy names
// start with store.
func Conformance(t *testing.T, store string, open func(t *testing.T, clock *Clock) algo.Decider) {
	roomy := MustPolicy(t, algo.Spec{Name: "conformance-roomy", Algorithm: algo.TokenBucket, Limit: 1 << 40, Window: time.Second, Burst: 1 << 40})
	for _, tc := range conformance {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewClock(Epoch)
			d := open(t, clock)
			for _, beside := range []string{"alone", "before", "after"} {
				t.Run(beside, func(t *testing.T) {
					conform(t, d, clock, tc.name+"-"+store+"-"+beside, tc.spec, tc.steps, beside, roomy)
				})
			}
		})
	}
}

// conform runs steps against spec on one store: alone in each request, or
// with roomy before or after it.
func conform(t *testing.T, d algo.Decider, clock *Clock, name string, spec algo.Spec, steps []step, beside string, roomy *algo.Policy) {
	t.Helper()
	spec.Name = name
	rule := MustPolicy(t, spec)
	for i, s := range steps {
		clock.Set(Epoch.Add(s.at))
		key := s.key
		if key == "" {
			key = "k"
		}
		req := algo.Request{Policy: rule, Key: []byte(key), Cost: s.cost}
		var got algo.Result
		if beside == "alone" {
			got = DecideOne(t, d, req)
		} else {
			reqs, at := []algo.Request{req, {Policy: roomy, Key: []byte(key)}}, 0
			if beside == "before" {
				reqs, at = []algo.Request{reqs[1], req}, 1
			}
			res := make([]algo.Result, 2)
			ok, err := d.Decide(context.Background(), reqs, res)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if ok != res[at].Allowed || !res[1-at].Allowed {
				t.Fatalf("step %d: Decide = %v with %+v", i, ok, res)
			}
			got = res[at]
		}
		want := s.want
		want.Limit = rule.Capacity()
		if got != want {
			t.Errorf("step %d (at %v, key %q, cost %d):\n got %+v\nwant %+v", i, s.at, key, s.cost, got, want)
		}
	}
}
