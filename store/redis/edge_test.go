package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/internal/redistest"
)

// TestRetryAfterSuffices: whenever a policy denies with a retry-after,
// waiting exactly that long admits the same request, if nothing else
// consumes meanwhile, in both stores, across the whole range a policy
// accepts.
func TestRetryAfterSuffices(t *testing.T) {
	t.Parallel()
	clock := algotest.NewClock(algotest.Epoch)
	stores := bothStores(t, clock)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ctx := context.Background()
	checked := map[algo.Algorithm]int{}
	for seq := 0; seq < 3000; seq++ {
		rng := rand.New(rand.NewPCG(seed, uint64(seq)))
		st := stores[seq%2]
		p := algotest.MustPolicy(t, randomSpec(rng, fmt.Sprintf("retry%d", seq)))
		clock.Set(algotest.Epoch.Add(time.Duration(rng.Int64N(int64(24 * time.Hour)))))
		key := []byte("k")
		for step := 0; step < 12; step++ {
			clock.Advance(randomGap(rng, p))
			q := algo.Request{Policy: p, Key: key, Cost: randomCost(rng, p)}
			var res [1]algo.Result
			if _, err := st.store.Decide(ctx, []algo.Request{q}, res[:]); err != nil {
				t.Fatal(err)
			}
			if res[0].Reason != algo.ReasonLimited {
				continue
			}
			if res[0].RetryAfter <= 0 {
				t.Fatalf("%s %+v cost %d: limited with RetryAfter %v", st.name, p.Spec(), q.Cost, res[0].RetryAfter)
			}
			checked[p.Spec().Algorithm]++
			clock.Advance(res[0].RetryAfter)
			var again [1]algo.Result
			if _, err := st.store.Decide(ctx, []algo.Request{q}, again[:]); err != nil {
				t.Fatal(err)
			}
			if !again[0].Allowed {
				t.Fatalf("%s %+v cost %d: denied with RetryAfter %v, and denied again after waiting it: %+v",
					st.name, p.Spec(), q.Cost, res[0].RetryAfter, again[0])
			}
		}
	}
	for _, a := range algo.Algorithms() {
		if checked[a] < 50 {
			t.Errorf("only %d retry-afters of %s checked", checked[a], a)
		}
	}
	t.Logf("retry-afters checked: %v", checked)
}

// TestHeavyGCRAIsExactAtHighRates: the debt GCRA keeps stays exact however high
// the rate, so a burst admits exactly the burst and a flood exactly the rate.
// A million decisions from one goroutine: make test runs it without the
// race detector.
func TestHeavyGCRAIsExactAtHighRates(t *testing.T) {
	race.Heavy(t)
	t.Parallel()
	clock := algotest.NewClock(algotest.Epoch.Add(3 * time.Hour))
	for _, st := range bothStores(t, clock) {
		t.Run(st.name, func(t *testing.T) {
			burst := algotest.MustPolicy(t, algo.Spec{Name: "gcra-burst-" + st.name, Algorithm: algo.GCRA, Limit: 98777, Window: time.Second, Burst: 2000})
			admitted := 0
			for i := 0; i < 2100; i++ {
				if algotest.DecideOne(t, st.store, algo.Request{Policy: burst, Key: []byte("k")}).Allowed {
					admitted++
				}
			}
			if admitted != 2000 {
				t.Errorf("one instant admitted %d of 2100, want exactly the burst 2000", admitted)
			}
		})
	}
	// A flood of one request per microsecond for a second: the memory
	// store, the reference both stores agree with (TestDifferential).
	m := algo.NewMemory(algo.MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	flood := algotest.MustPolicy(t, algo.Spec{Name: "gcra-flood", Algorithm: algo.GCRA, Limit: 98777, Window: time.Second, Burst: 2})
	admitted := 0
	for us := 0; us < 1_000_000; us++ {
		if algotest.DecideOne(t, m, algo.Request{Policy: flood, Key: []byte("k")}).Allowed {
			admitted++
		}
		clock.Advance(time.Microsecond)
	}
	if admitted < 98777 || admitted > 98777+2 {
		t.Errorf("a second of one request per µs admitted %d, want the rate 98777 plus at most the burst 2", admitted)
	}
}

// TestSlidingLogWorkIsBounded: a denial over a full log of n entries, of
// any cost, costs Redis O(log n) commands, and so does the admission that
// follows a window's expiry of all n entries.
func TestSlidingLogWorkIsBounded(t *testing.T) {
	const n = 20_000
	rs, client, srv := newRedisStore(t, nil)
	clock := algotest.NewClock(algotest.Epoch.Add(time.Hour))
	rs.clock = clock.Now
	ctx := context.Background()
	p := algotest.MustPolicy(t, algo.Spec{Name: "log", Algorithm: algo.SlidingWindowLog, Limit: n, Window: time.Hour})
	key := []byte("flooded")
	// Fill the log from concurrent callers, so batches carry it quickly.
	var wg sync.WaitGroup
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res [1]algo.Result
			for i := 0; i < n/50; i++ {
				if ok, err := rs.Decide(ctx, []algo.Request{{Policy: p, Key: key}}, res[:]); err != nil || !ok {
					t.Errorf("filling: %v, %v", ok, err)
					return
				}
			}
		}()
		clock.Advance(time.Millisecond)
	}
	wg.Wait()
	admin := srv.Client(t)
	commands := func() int64 {
		info, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "cmdstat_") && !strings.HasPrefix(line, "cmdstat_evalsha") && !strings.HasPrefix(line, "cmdstat_info") {
				total += commandCalls(info, strings.TrimPrefix(line[:strings.IndexByte(line, ':')], "cmdstat_"))
			}
		}
		return total
	}
	for _, cost := range []int64{1, n / 2, n} {
		before := commands()
		res := algotest.DecideOne(t, rs, algo.Request{Policy: p, Key: key, Cost: cost})
		used := commands() - before
		if res.Allowed || res.Reason != algo.ReasonLimited {
			t.Fatalf("cost %d over a full log: %+v, want limited", cost, res)
		}
		if used > 40 {
			t.Errorf("a denial of cost %d over %d entries ran %d commands in Redis, want O(log n)", cost, n, used)
		}
		t.Logf("denial of cost %d over %d entries: %d commands, retry after %v", cost, n, used, res.RetryAfter)
	}
	// A window later every entry has left: the next admission removes at
	// most a page of them, and still counts exactly.
	clock.Advance(time.Hour)
	before := commands()
	res := algotest.DecideOne(t, rs, algo.Request{Policy: p, Key: key, Cost: n})
	if used := commands() - before; used > 40 {
		t.Errorf("the admission after %d entries left ran %d commands, want O(log n)", n, used)
	}
	if !res.Allowed || res.Remaining != 0 {
		t.Errorf("after a window, cost %d = %+v, want allowed with 0 remaining", n, res)
	}
	if card := client.ZCard(ctx, p.StorageKey(rs.prefix, key)).Val(); card < n-100 {
		t.Errorf("the log holds %d entries: the admission removed more than a page", card)
	}
	if got := algotest.DecideOne(t, rs, algo.Request{Policy: p, Key: key}); got.Allowed {
		t.Errorf("a request past a full window = %+v, want denied", got)
	}
}

// TestSlidingLogTotalsRestart: a log whose running totals approach 2^52
// rewrites them from zero and keeps answering as the memory store does.
func TestSlidingLogTotalsRestart(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	stores := bothStores(t, clock)
	p := algotest.MustPolicy(t, algo.Spec{Name: "huge", Algorithm: algo.SlidingWindowLog, Limit: algo.MaxLimit, Window: 3 * time.Millisecond})
	ctx := context.Background()
	for i := 0; i < 40; i++ {
		clock.Advance(time.Millisecond)
		var got [2][1]algo.Result
		for s, st := range stores {
			if _, err := st.store.Decide(ctx, []algo.Request{{Policy: p, Key: []byte("k"), Cost: algo.MaxLimit / 3}}, got[s][:]); err != nil {
				t.Fatal(err)
			}
		}
		if got[0] != got[1] {
			t.Fatalf("step %d: memory %+v, redis %+v", i, got[0][0], got[1][0])
		}
	}
}

// TestExtremePoliciesLeaveExpiringKeys: decisions under random policies
// from the whole accepted range never fail in Redis, and every key they
// write has an expiry.
func TestExtremePoliciesLeaveExpiringKeys(t *testing.T) {
	rs, client, _ := newRedisStore(t, nil)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for i := 0; i < 300; i++ {
		var reqs []algo.Request
		for j := 0; j < 1+rng.IntN(3); j++ {
			s := randomSpec(rng, fmt.Sprintf("x%d-%d", i, j))
			p := algotest.MustPolicy(t, s)
			reqs = append(reqs, algo.Request{Policy: p, Key: []byte("k"), Cost: randomCost(rng, p)})
		}
		if _, err := rs.Decide(ctx, reqs, make([]algo.Result, len(reqs))); err != nil {
			t.Fatalf("decision %d %+v: %v", i, reqs, err)
		}
	}
	keys, err := client.Keys(ctx, rs.prefix+":*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys: %v, %v", keys, err)
	}
	for _, k := range keys {
		if ttl := client.PTTL(ctx, k).Val(); ttl == -1 {
			t.Errorf("key %s has no expiry", k)
		}
	}
}

// TestClusterRefundFollowsTheWrittenWindow: a request decided after the
// clock stepped back writes into the stored, later window; its refund takes
// the cost from that window, not from the one the clock shows.
func TestClusterRefundFollowsTheWrittenWindow(t *testing.T) {
	cluster := redistest.NewCluster(t)
	rs := newRedis(t, cluster.Client(t), cluster.Prefix(t))
	clock := algotest.NewClock(algotest.Epoch.Add(5*time.Minute + 10*time.Second))
	rs.clock = clock.Now
	for _, a := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			pa := algotest.MustPolicy(t, algo.Spec{Name: "a-" + a.String(), Algorithm: a, Limit: 3, Window: time.Minute})
			pb := algotest.MustPolicy(t, algo.Spec{Name: "b-" + a.String(), Algorithm: algo.FixedWindow, Limit: 1, Window: time.Minute})
			ka, kb := []byte("client-a"), []byte("global")
			algotest.DecideOne(t, rs, algo.Request{Policy: pa, Key: ka})
			algotest.DecideOne(t, rs, algo.Request{Policy: pb, Key: kb})
			clock.Advance(-50 * time.Second) // into the previous window
			res := make([]algo.Result, 2)
			ok, err := rs.Decide(context.Background(), []algo.Request{{Policy: pa, Key: ka}, {Policy: pb, Key: kb}}, res)
			if err != nil || ok {
				t.Fatalf("decision = %v, %v; want denied by b", ok, err)
			}
			if got := algotest.DecideOne(t, rs, algo.Request{Policy: pa, Key: ka}); got.Remaining != 1 {
				t.Errorf("a after the refunded decision: Remaining = %d, want 1 (one request before, this one)", got.Remaining)
			}
			clock.Advance(50 * time.Second)
		})
	}
}
