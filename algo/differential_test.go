package algo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var windows = []time.Duration{
	time.Millisecond, 7 * time.Millisecond, 50 * time.Millisecond, 333 * time.Millisecond,
	time.Second, 3 * time.Second, time.Minute, time.Hour,
}

func randomSpec(rng *rand.Rand, name string) Spec {
	for {
		s := Spec{
			Name:      name,
			Algorithm: Algorithms()[rng.IntN(len(Algorithms()))],
			Limit:     1 + rng.Int64N(20),
			Window:    windows[rng.IntN(len(windows))],
		}
		if s.Algorithm.usesBurst() && rng.IntN(2) == 0 {
			s.Burst = 1 + rng.Int64N(30)
		}
		if s.Algorithm == LeakyBucket && rng.IntN(2) == 0 {
			s.Delay = time.Duration(1+rng.Int64N(2000)) * time.Millisecond
		}
		if _, err := NewRule(s); err == nil {
			return s
		}
	}
}

// TestDifferential drives the memory store and the Redis store with the same
// random sequences (random rules, keys, costs and gaps) and requires
// identical answers, field for field.
func TestDifferential(t *testing.T) {
	sequences := 2000
	if testing.Short() {
		sequences = 200
	}
	clock := newFakeClock(epoch)
	stores := bothStores(t, clock)
	mem, rs := stores[0].store, stores[1].store
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ctx := context.Background()
	decisions := 0
	for seq := 0; seq < sequences; seq++ {
		rng := rand.New(rand.NewPCG(seed, uint64(seq)))
		rules := make([]*Rule, 1+rng.IntN(4))
		for i := range rules {
			rules[i] = mustRule(t, randomSpec(rng, fmt.Sprintf("s%d-r%d", seq, i)))
		}
		// Start anywhere in a day, so windows are not always aligned.
		clock.Set(epoch.Add(time.Duration(rng.Int64N(int64(24 * time.Hour)))))
		var history strings.Builder
		for stepN := 0; stepN < 16; stepN++ {
			r0 := rules[rng.IntN(len(rules))]
			switch rng.IntN(4) {
			case 0: // same instant
			case 1:
				clock.Advance(time.Duration(rng.Int64N(int64(r0.spec.Window/4) + 1)))
			default:
				clock.Advance(time.Duration(rng.Int64N(int64(2*r0.spec.Window) + 1)))
			}
			n := 1 + rng.IntN(len(rules))
			reqs := make([]Request, 0, n)
			for _, i := range rng.Perm(len(rules))[:n] {
				r := rules[i]
				c := int64(0)
				if rng.IntN(3) > 0 {
					c = 1 + rng.Int64N(r.MaxCost()+2)
				}
				reqs = append(reqs, Request{Rule: r, Key: string(rune('a' + rng.IntN(3))), Cost: c, Shadow: rng.IntN(5) == 0})
			}
			fmt.Fprintf(&history, "  t=%d", clock.Micros())
			for _, q := range reqs {
				fmt.Fprintf(&history, " %s(%+v)[%s cost %d shadow %v]", q.Rule.spec.Name, q.Rule.spec, q.Key, q.Cost, q.Shadow)
			}
			history.WriteString("\n")
			gotMem := make([]Result, n)
			gotRedis := make([]Result, n)
			okMem, err := mem.Decide(ctx, reqs, gotMem)
			if err != nil {
				t.Fatalf("memory: %v", err)
			}
			okRedis, err := rs.Decide(ctx, reqs, gotRedis)
			if err != nil {
				t.Fatalf("redis: %v", err)
			}
			decisions++
			if okMem != okRedis || !equalResults(gotMem, gotRedis) {
				t.Fatalf("sequence %d step %d: stores disagree\nmemory %v %+v\nredis  %v %+v\nhistory:\n%s",
					seq, stepN, okMem, gotMem, okRedis, gotRedis, history.String())
			}
			okAll := true
			for i, r := range gotMem {
				okAll = okAll && (r.Allowed || reqs[i].Shadow)
			}
			if okAll != okMem {
				t.Fatalf("sequence %d step %d: Decide = %v, but the results say %v", seq, stepN, okMem, okAll)
			}
		}
	}
	t.Logf("%d decisions identical across %d sequences", decisions, sequences)
}

func equalResults(a, b []Result) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
