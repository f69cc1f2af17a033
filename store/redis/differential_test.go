package redis

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/race"
)

var windows = []time.Duration{
	time.Millisecond, 7 * time.Millisecond, 50 * time.Millisecond, 333 * time.Millisecond,
	time.Second, 3 * time.Second, time.Minute, time.Hour,
}

// logUniform draws from [lo, hi] with every order of magnitude as likely, so
// that the extremes of a range come up as often as its middle.
func logUniform(rng *rand.Rand, lo, hi int64) int64 {
	v := int64(math.Exp(math.Log(float64(lo)) + rng.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
	return min(max(v, lo), hi)
}

// randomSpec draws a policy: half the time everyday values, half the time
// anywhere in the range a policy accepts (limits and bursts from 1 to 2^50,
// windows from 1ms to 366 days, delays up to a minute).
func randomSpec(rng *rand.Rand, name string) algo.Spec {
	for {
		s := algo.Spec{Name: name, Algorithm: algo.Algorithms()[rng.IntN(len(algo.Algorithms()))]}
		wide := rng.IntN(2) == 0
		if wide {
			s.Limit = logUniform(rng, 1, algo.MaxLimit)
			s.Window = time.Duration(logUniform(rng, algo.MinWindow.Microseconds(), algo.MaxWindow.Microseconds())) * time.Microsecond
		} else {
			s.Limit = 1 + rng.Int64N(20)
			s.Window = windows[rng.IntN(len(windows))]
		}
		if s.Algorithm.UsesBurst() && rng.IntN(2) == 0 {
			if wide {
				s.Burst = logUniform(rng, 1, algo.MaxLimit)
			} else {
				s.Burst = 1 + rng.Int64N(30)
			}
		}
		if s.Algorithm == algo.LeakyBucket && rng.IntN(2) == 0 {
			s.Delay = time.Duration(1+rng.Int64N(algo.MaxDelay.Microseconds())) * time.Microsecond
		}
		if _, err := algo.NewPolicy(s); err == nil {
			return s
		}
	}
}

// randomCost draws a request's cost: often the policy's own (0), else up to
// a little past what the policy admits, log-uniformly when that is large.
func randomCost(rng *rand.Rand, p *algo.Policy) int64 {
	switch rng.IntN(4) {
	case 0:
		return 0
	case 1:
		return logUniform(rng, 1, min(p.MaxCost()+2, algo.MaxLimit))
	}
	return 1 + rng.Int64N(min(p.MaxCost()+2, 50))
}

// randomGap draws a time step: none, a little, or up to two windows.
func randomGap(rng *rand.Rand, p *algo.Policy) time.Duration {
	W := p.Spec().Window
	switch rng.IntN(4) {
	case 0:
		return 0
	case 1:
		return time.Duration(rng.Int64N(int64(W/4)/1000+1)) * time.Microsecond
	case 2:
		return time.Duration(logUniform(rng, 1, 2*W.Microseconds())) * time.Microsecond
	}
	return time.Duration(rng.Int64N(2*W.Microseconds()+1)) * time.Microsecond
}

// TestDifferential drives the memory store and the Redis store with the same
// random sequences (random rules, keys, costs and gaps) and requires
// identical answers, field for field: requests of any rules, and requests
// of several rules none of which is a sliding_window_log, which decide.lua
// reads in its flat layout and decides in a path of its own. It runs 200
// sequences of each; TestHeavyDifferential, 2000.
func TestDifferential(t *testing.T) {
	t.Parallel()
	differentialRuns(t, 200)
}

// TestHeavyDifferential is TestDifferential with ten times the sequences
// (about 64,000 decisions), unless -short: make test runs it without the
// race detector, which would cost it several times the CPU.
func TestHeavyDifferential(t *testing.T) {
	race.Heavy(t)
	t.Parallel()
	sequences := 2000
	if testing.Short() {
		sequences = 200
	}
	differentialRuns(t, sequences)
}

// differentialRuns runs differential of any requests and of flat ones,
// each with stores (and a Redis server) of its own.
func differentialRuns(t *testing.T, sequences int) {
	t.Run("any", func(t *testing.T) { t.Parallel(); differential(t, sequences, false) })
	t.Run("flat", func(t *testing.T) { t.Parallel(); differential(t, sequences, true) })
}

// differential is TestDifferential's run, of requests of several rules and
// no sliding_window_log if flat.
func differential(t *testing.T, sequences int, flat bool) {
	clock := algotest.NewClock(algotest.Epoch)
	stores := bothStores(t, clock)
	mem, rs := stores[0].store, stores[1].store
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ctx := context.Background()
	decisions := 0
	for seq := 0; seq < sequences; seq++ {
		rng := rand.New(rand.NewPCG(seed, uint64(seq)))
		rules := make([]*algo.Policy, 1+rng.IntN(4))
		if flat {
			rules = make([]*algo.Policy, 2+rng.IntN(4))
		}
		for i := range rules {
			s := randomSpec(rng, fmt.Sprintf("s%d-r%d", seq, i))
			for flat && s.Algorithm == algo.SlidingWindowLog {
				s = randomSpec(rng, s.Name)
			}
			rules[i] = algotest.MustPolicy(t, s)
		}
		// Start anywhere in a day, so windows are not always aligned.
		clock.Set(algotest.Epoch.Add(time.Duration(rng.Int64N(int64(24 * time.Hour)))))
		var history strings.Builder
		for stepN := 0; stepN < 16; stepN++ {
			clock.Advance(randomGap(rng, rules[rng.IntN(len(rules))]))
			n := 1 + rng.IntN(len(rules))
			if flat {
				n = 2 + rng.IntN(len(rules)-1)
			}
			reqs := make([]algo.Request, 0, n)
			for _, i := range rng.Perm(len(rules))[:n] {
				r := rules[i]
				c := randomCost(rng, r)
				reqs = append(reqs, algo.Request{Policy: r, Key: []byte(string(rune('a' + rng.IntN(3)))), Cost: c, Shadow: rng.IntN(5) == 0})
			}
			fmt.Fprintf(&history, "  t=%d", clock.Micros())
			for _, q := range reqs {
				fmt.Fprintf(&history, " %s(%+v)[%s cost %d shadow %v]", q.Policy.Spec().Name, q.Policy.Spec(), q.Key, q.Cost, q.Shadow)
			}
			history.WriteString("\n")
			gotMem := make([]algo.Result, n)
			gotRedis := make([]algo.Result, n)
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

func equalResults(a, b []algo.Result) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestBatchMatchesSequential sends batches of random requests, several on
// the same keys, through one script call each, and requires the answers the
// memory store gives deciding the same requests one after another in the
// batch's order: a batch is exactly a sequence of decisions.
func TestBatchMatchesSequential(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	stores := bothStores(t, clock)
	mem, rs := stores[0].store.(*algo.Memory), stores[1].store.(*Store)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ctx := context.Background()
	for b := 0; b < 300; b++ {
		rng := rand.New(rand.NewPCG(seed, uint64(b)))
		rules := make([]*algo.Policy, 1+rng.IntN(3))
		for i := range rules {
			rules[i] = algotest.MustPolicy(t, randomSpec(rng, fmt.Sprintf("b%d-r%d", b, i)))
		}
		clock.Set(algotest.Epoch.Add(time.Duration(rng.Int64N(int64(24 * time.Hour)))))
		var w worker
		var batch [][]algo.Request
		for c := 0; c < 1+rng.IntN(12); c++ {
			n := 1 + rng.IntN(len(rules))
			var reqs []algo.Request
			for _, i := range rng.Perm(len(rules))[:n] {
				reqs = append(reqs, algo.Request{Policy: rules[i], Key: []byte{byte('a' + rng.IntN(2))}, Cost: randomCost(rng, rules[i]), Shadow: rng.IntN(5) == 0})
			}
			cl := &call{done: make(chan struct{}, 1)}
			if err := rs.encode(ctx, cl, reqs); err != nil {
				t.Fatal(err)
			}
			cl.deadline = time.Now().Add(time.Minute)
			w.batch = append(w.batch, cl)
			batch = append(batch, reqs)
		}
		rs.run(&w, time.Time{})
		for c, reqs := range batch {
			cl := w.batch[c]
			<-cl.done
			if cl.err != nil {
				t.Fatalf("batch %d call %d: %v", b, c, cl.err)
			}
			want := make([]algo.Result, len(reqs))
			ok, err := mem.Decide(ctx, reqs, want)
			if err != nil {
				t.Fatal(err)
			}
			if ok != cl.admitted || !equalResults(want, cl.res[:len(reqs)]) {
				t.Fatalf("batch %d call %d of %d: the batch disagrees with a sequence\nsequence %v %+v\nbatch    %v %+v\nrequests %+v",
					b, c, len(batch), ok, want, cl.admitted, cl.res[:len(reqs)], reqs)
			}
		}
	}
}
