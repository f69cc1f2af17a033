package algo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
)

// TestRetryAfterSuffices: whenever a policy denies with a retry-after,
// waiting exactly that long admits the same request, if nothing else
// consumes meanwhile, in both stores, across the whole range a policy
// accepts.
func TestRetryAfterSuffices(t *testing.T) {
	clock := newFakeClock(epoch)
	stores := bothStores(t, clock)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ctx := context.Background()
	checked := map[Algorithm]int{}
	for seq := 0; seq < 3000; seq++ {
		rng := rand.New(rand.NewPCG(seed, uint64(seq)))
		st := stores[seq%2]
		p := mustPolicy(t, randomSpec(rng, fmt.Sprintf("retry%d", seq)))
		clock.Set(epoch.Add(time.Duration(rng.Int64N(int64(24 * time.Hour)))))
		key := []byte("k")
		for step := 0; step < 12; step++ {
			clock.Advance(randomGap(rng, p))
			q := Request{Policy: p, Key: key, Cost: randomCost(rng, p)}
			var res [1]Result
			if _, err := st.store.Decide(ctx, []Request{q}, res[:]); err != nil {
				t.Fatal(err)
			}
			if res[0].Reason != ReasonLimited {
				continue
			}
			if res[0].RetryAfter <= 0 {
				t.Fatalf("%s %+v cost %d: limited with RetryAfter %v", st.name, p.spec, q.Cost, res[0].RetryAfter)
			}
			checked[p.spec.Algorithm]++
			clock.Advance(res[0].RetryAfter)
			var again [1]Result
			if _, err := st.store.Decide(ctx, []Request{q}, again[:]); err != nil {
				t.Fatal(err)
			}
			if !again[0].Allowed {
				t.Fatalf("%s %+v cost %d: denied with RetryAfter %v, and denied again after waiting it: %+v",
					st.name, p.spec, q.Cost, res[0].RetryAfter, again[0])
			}
		}
	}
	for _, a := range Algorithms() {
		if checked[a] < 50 {
			t.Errorf("only %d retry-afters of %s checked", checked[a], a)
		}
	}
	t.Logf("retry-afters checked: %v", checked)
}

// TestGCRAIsExactAtHighRates: the debt GCRA keeps stays exact however high
// the rate, so a burst admits exactly the burst and a flood exactly the rate.
func TestGCRAIsExactAtHighRates(t *testing.T) {
	clock := newFakeClock(epoch.Add(3 * time.Hour))
	for _, st := range bothStores(t, clock) {
		t.Run(st.name, func(t *testing.T) {
			burst := mustPolicy(t, Spec{Name: "gcra-burst-" + st.name, Algorithm: GCRA, Limit: 98777, Window: time.Second, Burst: 2000})
			admitted := 0
			for i := 0; i < 2100; i++ {
				if decideOne(t, st.store, Request{Policy: burst, Key: []byte("k")}).Allowed {
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
	m := NewMemory(MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	flood := mustPolicy(t, Spec{Name: "gcra-flood", Algorithm: GCRA, Limit: 98777, Window: time.Second, Burst: 2})
	admitted := 0
	for us := 0; us < 1_000_000; us++ {
		if decideOne(t, m, Request{Policy: flood, Key: []byte("k")}).Allowed {
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
	clock := newFakeClock(epoch.Add(time.Hour))
	rs.clock = clock.Now
	ctx := context.Background()
	p := mustPolicy(t, Spec{Name: "log", Algorithm: SlidingWindowLog, Limit: n, Window: time.Hour})
	key := []byte("flooded")
	// Fill the log from concurrent callers, so batches carry it quickly.
	var wg sync.WaitGroup
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res [1]Result
			for i := 0; i < n/50; i++ {
				if ok, err := rs.Decide(ctx, []Request{{Policy: p, Key: key}}, res[:]); err != nil || !ok {
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
		res := decideOne(t, rs, Request{Policy: p, Key: key, Cost: cost})
		used := commands() - before
		if res.Allowed || res.Reason != ReasonLimited {
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
	res := decideOne(t, rs, Request{Policy: p, Key: key, Cost: n})
	if used := commands() - before; used > 40 {
		t.Errorf("the admission after %d entries left ran %d commands, want O(log n)", n, used)
	}
	if !res.Allowed || res.Remaining != 0 {
		t.Errorf("after a window, cost %d = %+v, want allowed with 0 remaining", n, res)
	}
	if card := client.ZCard(ctx, p.StorageKey(rs.prefix, key)).Val(); card < n-100 {
		t.Errorf("the log holds %d entries: the admission removed more than a page", card)
	}
	if got := decideOne(t, rs, Request{Policy: p, Key: key}); got.Allowed {
		t.Errorf("a request past a full window = %+v, want denied", got)
	}
}

// TestSlidingLogTotalsRestart: a log whose running totals approach 2^52
// rewrites them from zero and keeps answering as the memory store does.
func TestSlidingLogTotalsRestart(t *testing.T) {
	clock := newFakeClock(epoch)
	stores := bothStores(t, clock)
	p := mustPolicy(t, Spec{Name: "huge", Algorithm: SlidingWindowLog, Limit: MaxLimit, Window: 3 * time.Millisecond})
	ctx := context.Background()
	for i := 0; i < 40; i++ {
		clock.Advance(time.Millisecond)
		var got [2][1]Result
		for s, st := range stores {
			if _, err := st.store.Decide(ctx, []Request{{Policy: p, Key: []byte("k"), Cost: MaxLimit / 3}}, got[s][:]); err != nil {
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
		var reqs []Request
		for j := 0; j < 1+rng.IntN(3); j++ {
			s := randomSpec(rng, fmt.Sprintf("x%d-%d", i, j))
			p := mustPolicy(t, s)
			reqs = append(reqs, Request{Policy: p, Key: []byte("k"), Cost: randomCost(rng, p)})
		}
		if _, err := rs.Decide(ctx, reqs, make([]Result, len(reqs))); err != nil {
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

// TestMemoryKeepsLongLivedState: state that matters for years survives a
// sweep, so the same cost is not admitted again.
func TestMemoryKeepsLongLivedState(t *testing.T) {
	clock := newFakeClock(epoch)
	m := NewMemory(MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	for _, s := range []Spec{
		{Name: "tb", Algorithm: TokenBucket, Limit: 1, Window: MaxWindow, Burst: 10},
		{Name: "lb", Algorithm: LeakyBucket, Limit: 1, Window: MaxWindow, Burst: 10},
		{Name: "gcra", Algorithm: GCRA, Limit: 1, Window: MaxWindow, Burst: 10},
		{Name: "swc", Algorithm: SlidingWindowCounter, Limit: 10, Window: MaxWindow},
		{Name: "swl", Algorithm: SlidingWindowLog, Limit: 10, Window: MaxWindow},
	} {
		p := mustPolicy(t, s)
		if res := decideOne(t, m, Request{Policy: p, Key: []byte("k"), Cost: 10}); !res.Allowed {
			t.Fatalf("%s: first request denied: %+v", s.Name, res)
		}
		clock.Advance(time.Second)
		m.Sweep()
		if res := decideOne(t, m, Request{Policy: p, Key: []byte("k"), Cost: 10}); res.Allowed {
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
			clock := newFakeClock(epoch)
			m := NewMemory(MemoryOptions{MaxKeys: max, Clock: clock.Now, SweepInterval: -1})
			defer m.Close()
			p := mustPolicy(t, Spec{Name: "once", Algorithm: FixedWindow, Limit: 1, Window: time.Hour})
			key := func(i int) []byte { return []byte("client-" + strconv.Itoa(i)) }
			for i := 0; i < max; i++ {
				if res := decideOne(t, m, Request{Policy: p, Key: key(i)}); !res.Allowed {
					t.Fatalf("key %d: first request denied", i)
				}
			}
			for i := 0; i < max; i++ {
				if res := decideOne(t, m, Request{Policy: p, Key: key(i)}); res.Allowed {
					t.Fatalf("key %d of %d admitted twice within its hour: evicted below the bound", i, max)
				}
			}
			if got := m.Len(); got != max {
				t.Fatalf("Len = %d, want %d", got, max)
			}
			if res := decideOne(t, m, Request{Policy: p, Key: key(max)}); res.Allowed || res.Reason != ReasonLimited || res.Remaining != 0 {
				t.Errorf("a key past the bound of live states = %+v; want refused as limited", res)
			}
			if got := m.Len(); got != max {
				t.Errorf("Len = %d after one key past the bound, want %d", got, max)
			}
			if got := m.Refused(); got != 1 {
				t.Errorf("Refused = %d, want 1", got)
			}
			for i := 0; i < max; i++ {
				if decideOne(t, m, Request{Policy: p, Key: key(i)}).Allowed {
					t.Fatalf("key %d was evicted while it still limited", i)
				}
			}
			// In the next window every state is back to full quota:
			// new keys replace them.
			clock.Advance(time.Hour)
			for i := max; i < 2*max; i++ {
				if res := decideOne(t, m, Request{Policy: p, Key: key(i)}); !res.Allowed {
					t.Fatalf("new key %d refused though every state expired: %+v", i, res)
				}
			}
			if got, want := m.Evicted(), int64(max); got != want {
				t.Errorf("Evicted = %d, want %d", got, want)
			}
		})
	}
}

// TestClusterRefundFollowsTheWrittenWindow: a request decided after the
// clock stepped back writes into the stored, later window; its refund takes
// the cost from that window, not from the one the clock shows.
func TestClusterRefundFollowsTheWrittenWindow(t *testing.T) {
	cluster := redistest.NewCluster(t)
	rs := newRedis(t, cluster.Client(t), cluster.Prefix(t))
	clock := newFakeClock(epoch.Add(5*time.Minute + 10*time.Second))
	rs.clock = clock.Now
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			pa := mustPolicy(t, Spec{Name: "a-" + a.String(), Algorithm: a, Limit: 3, Window: time.Minute})
			pb := mustPolicy(t, Spec{Name: "b-" + a.String(), Algorithm: FixedWindow, Limit: 1, Window: time.Minute})
			ka, kb := []byte("client-a"), []byte("global")
			decideOne(t, rs, Request{Policy: pa, Key: ka})
			decideOne(t, rs, Request{Policy: pb, Key: kb})
			clock.Advance(-50 * time.Second) // into the previous window
			res := make([]Result, 2)
			ok, err := rs.Decide(context.Background(), []Request{{Policy: pa, Key: ka}, {Policy: pb, Key: kb}}, res)
			if err != nil || ok {
				t.Fatalf("decision = %v, %v; want denied by b", ok, err)
			}
			if got := decideOne(t, rs, Request{Policy: pa, Key: ka}); got.Remaining != 1 {
				t.Errorf("a after the refunded decision: Remaining = %d, want 1 (one request before, this one)", got.Remaining)
			}
			clock.Advance(50 * time.Second)
		})
	}
}
