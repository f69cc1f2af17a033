package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// TestExactUnderConcurrency hammers one key from 64 goroutines over several
// Redis connections: exactly Limit requests pass. The clock is pinned so
// nothing refills during the test.
func TestExactUnderConcurrency(t *testing.T) {
	const limit, goroutines, attempts = 50, 64, 8
	for _, a := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowLog, algo.TokenBucket, algo.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			rs, _, _ := newRedisStore(t, &goredis.Options{PoolSize: 8})
			rs.clock = algotest.NewClock(algotest.Epoch.Add(17 * time.Minute)).Now
			mem := algo.NewMemory(algo.MemoryOptions{Clock: rs.clock, SweepInterval: -1})
			t.Cleanup(func() { _ = mem.Close() })
			for _, st := range []namedStore{{"memory", mem}, {"redis", rs}} {
				rule := algotest.MustPolicy(t, algo.Spec{Name: "hammer", Algorithm: a, Limit: limit, Window: time.Hour})
				var admitted, denied atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, goroutines)
				for g := 0; g < goroutines; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var res [1]algo.Result
						for i := 0; i < attempts; i++ {
							ok, err := st.store.Decide(context.Background(), []algo.Request{{Policy: rule, Key: []byte("one")}}, res[:])
							if err != nil {
								errs <- err
								return
							}
							if ok {
								admitted.Add(1)
							} else {
								denied.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("%s: %v", st.name, err)
				}
				if got := admitted.Load(); got != limit {
					t.Errorf("%s: %d of %d requests admitted, want exactly %d", st.name, got, goroutines*attempts, limit)
				}
				if got := denied.Load(); got != goroutines*attempts-limit {
					t.Errorf("%s: %d denied, want %d", st.name, got, goroutines*attempts-limit)
				}
			}
		})
	}
}

// TestAllOrNothing: for every pair of algorithms, a request that rule B
// denies leaves rule A exactly as it was.
func TestAllOrNothing(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch.Add(5 * time.Minute))
	ctx := context.Background()
	for _, st := range bothStores(t, clock) {
		for _, a := range algo.Algorithms() {
			for _, b := range algo.Algorithms() {
				name := fmt.Sprintf("%s/%s+%s", st.name, a, b)
				t.Run(name, func(t *testing.T) {
					ra := algotest.MustPolicy(t, algo.Spec{Name: "a-" + a.String(), Algorithm: a, Limit: 10, Window: time.Minute})
					rb := algotest.MustPolicy(t, algo.Spec{Name: "b-" + b.String(), Algorithm: b, Limit: 1, Window: time.Minute})
					key := name // a fresh key per pair
					both := []algo.Request{{Policy: ra, Key: []byte(key)}, {Policy: rb, Key: []byte(key)}}
					res := make([]algo.Result, 2)

					ok, err := st.store.Decide(ctx, both, res)
					if err != nil || !ok {
						t.Fatalf("first decision = %v, %v (%+v), want allowed", ok, err, res)
					}
					if got, want := res[0].Remaining, int64(9); got != want {
						t.Fatalf("after one request A.Remaining = %d, want %d", got, want)
					}
					for i := 0; i < 3; i++ {
						ok, err = st.store.Decide(ctx, both, res)
						if err != nil || ok {
							t.Fatalf("decision %d = %v, %v, want denied by B", i+2, ok, err)
						}
						if !res[0].Allowed || res[1].Allowed {
							t.Errorf("decision %d: A.Allowed = %v, B.Allowed = %v; want true, false", i+2, res[0].Allowed, res[1].Allowed)
						}
						if got, want := res[0].Remaining, int64(9); got != want {
							t.Errorf("decision %d denied by B: A.Remaining = %d, want %d (unchanged)", i+2, got, want)
						}
					}
					// A alone shows it consumed nothing for the denials.
					if got, want := algotest.DecideOne(t, st.store, algo.Request{Policy: ra, Key: []byte(key)}).Remaining, int64(8); got != want {
						t.Errorf("A alone afterwards: Remaining = %d, want %d", got, want)
					}
				})
			}
		}
	}
}

// TestKeysExpire runs a mixed load with Redis TIME and checks that every key
// has a TTL no longer than its rule needs, and that none remain once the
// longest window has passed.
func TestKeysExpire(t *testing.T) {
	rs, client, _ := newRedisStore(t, nil)
	ctx := context.Background()
	const longest = 400 * time.Millisecond
	rules := []*algo.Policy{
		algotest.MustPolicy(t, algo.Spec{Name: "fw", Algorithm: algo.FixedWindow, Limit: 3, Window: longest}),
		algotest.MustPolicy(t, algo.Spec{Name: "swl", Algorithm: algo.SlidingWindowLog, Limit: 3, Window: 300 * time.Millisecond}),
		// The counter's state lasts two windows: its previous window
		// still weighs in the current one.
		algotest.MustPolicy(t, algo.Spec{Name: "swc", Algorithm: algo.SlidingWindowCounter, Limit: 3, Window: longest / 2}),
		algotest.MustPolicy(t, algo.Spec{Name: "tb", Algorithm: algo.TokenBucket, Limit: 3, Window: 300 * time.Millisecond}),
		algotest.MustPolicy(t, algo.Spec{Name: "lb", Algorithm: algo.LeakyBucket, Limit: 3, Window: 300 * time.Millisecond, Delay: 50 * time.Millisecond}),
		algotest.MustPolicy(t, algo.Spec{Name: "gcra", Algorithm: algo.GCRA, Limit: 3, Window: longest, Burst: 2}),
	}
	horizon := map[string]time.Duration{"fw": longest, "swl": 300 * time.Millisecond, "swc": longest, "tb": 300 * time.Millisecond, "lb": 350 * time.Millisecond, "gcra": longest}
	res := make([]algo.Result, 3)
	for i := 0; i < 60; i++ {
		key := strconv.Itoa(i % 4)
		reqs := []algo.Request{
			{Policy: rules[i%len(rules)], Key: []byte(key), Cost: int64(1 + i%2)},
			{Policy: rules[(i+1)%len(rules)], Key: []byte(key)},
			{Policy: rules[(i+3)%len(rules)], Key: []byte("shared")},
		}
		if _, err := rs.Decide(ctx, reqs, res); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := client.Keys(ctx, rs.prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatal("no keys written")
	}
	for _, k := range keys {
		ttl, err := client.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		rule := strings.SplitN(strings.TrimPrefix(k, rs.prefix+":"), ":", 2)[0]
		if ttl == -2 {
			continue // expired since KEYS listed it
		}
		if ttl < 0 {
			t.Errorf("key %s has no TTL (PTTL %v)", k, ttl)
		} else if ttl > horizon[rule]+time.Millisecond {
			t.Errorf("key %s has TTL %v, longer than its rule needs (%v)", k, ttl, horizon[rule])
		}
	}
	deadline := time.Now().Add(longest + 2*time.Second)
	for {
		n := 0
		iter := client.Scan(ctx, 0, rs.prefix+":*", 100).Iterator()
		for iter.Next(ctx) {
			n++
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys remain %v after the longest window", n, longest+2*time.Second)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBucketKeysLiveAFullRefill: a bucket's key lives as long as its state
// can matter, a full refill or drain from its last write, not just the time
// its state matters now. A busy client's key is then overwritten rather
// than expired and created again at every request, which costs Redis an
// expiry per request.
func TestBucketKeysLiveAFullRefill(t *testing.T) {
	rs, client, _ := newRedisStore(t, nil)
	ctx := context.Background()
	const w = 10 * time.Second
	for _, c := range []struct {
		spec    algo.Spec
		horizon time.Duration
	}{
		{algo.Spec{Name: "tb", Algorithm: algo.TokenBucket, Limit: 10, Window: w}, w},
		{algo.Spec{Name: "lb", Algorithm: algo.LeakyBucket, Limit: 10, Window: w, Delay: 2 * time.Second}, w + 2*time.Second},
		{algo.Spec{Name: "gcra", Algorithm: algo.GCRA, Limit: 10, Window: w, Burst: 5}, w / 2},
	} {
		t.Run(c.spec.Name, func(t *testing.T) {
			rule := algotest.MustPolicy(t, c.spec)
			key := rule.StorageKey(rs.prefix, []byte("client"))
			for i := 0; i < 3; i++ {
				if res := algotest.DecideOne(t, rs, algo.Request{Policy: rule, Key: []byte("client")}); !res.Allowed {
					t.Fatalf("request %d denied: %+v", i+1, res)
				}
				ttl, err := client.PTTL(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				if ttl > c.horizon || ttl < c.horizon-time.Second {
					t.Errorf("after request %d, %s has TTL %v, want its full horizon %v", i+1, key, ttl, c.horizon)
				}
			}
		})
	}
}

// roundTrips counts the commands a client sends, a pipeline counting once.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// TestOneRoundTrip proves that a decision is one command, whatever the
// number of rules: Redis counts one EVALSHA per decision, and the store
// sends nothing through go-redis.
func TestOneRoundTrip(t *testing.T) {
	rs, client, srv := newRedisStore(t, nil)
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	var rules []*algo.Policy
	for i, a := range algo.Algorithms() {
		rules = append(rules, algotest.MustPolicy(t, algo.Spec{Name: fmt.Sprintf("r%d", i), Algorithm: a, Limit: 5, Window: time.Minute}))
	}
	admin := srv.Client(t)
	stats := func() (evalsha, eval int64) {
		info, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		return commandCalls(info, "evalsha"), commandCalls(info, "eval")
	}
	hook := &roundTrips{}
	client.AddHook(hook)
	for _, n := range []int{1, 3, len(rules)} {
		sha0, eval0 := stats()
		hook.n.Store(0)
		const decisions = 10
		res := make([]algo.Result, n)
		reqs := make([]algo.Request, n)
		for i := range reqs {
			reqs[i] = algo.Request{Policy: rules[i], Key: []byte("rt")}
		}
		for i := 0; i < decisions; i++ {
			if _, err := rs.Decide(ctx, reqs, res); err != nil {
				t.Fatal(err)
			}
		}
		sha1, eval1 := stats()
		// Decisions go on the store's own connections, not through
		// go-redis (see TestLoneDecisionIsOneWriteAndOneRead).
		if got := hook.n.Load(); got != 0 {
			t.Errorf("%d rules: client sent %d commands through go-redis for %d decisions, want none", n, got, decisions)
		}
		if got := sha1 - sha0; got != decisions {
			t.Errorf("%d rules: Redis counted %d EVALSHA for %d decisions, want %d", n, got, decisions, decisions)
		}
		if got := eval1 - eval0; got != 0 {
			t.Errorf("%d rules: Redis counted %d EVAL, want 0 once the script is loaded", n, got)
		}
	}
}

// TestConcurrentDecisionsShareCalls: decisions made at once ride in shared
// script calls, so Redis runs fewer scripts than there are decisions, and
// each decision is still answered on its own.
func TestConcurrentDecisionsShareCalls(t *testing.T) {
	rs, _, srv := newRedisStore(t, &goredis.Options{PoolSize: 8})
	rs.clock = algotest.NewClock(algotest.Epoch.Add(time.Minute)).Now // nothing refills
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	rule := algotest.MustPolicy(t, algo.Spec{Name: "share", Algorithm: algo.GCRA, Limit: 1_000_000, Window: time.Hour})
	admin := srv.Client(t)
	calls := func() int64 {
		info, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		return commandCalls(info, "evalsha")
	}
	before := calls()
	const goroutines, each = 64, 50
	var wg sync.WaitGroup
	var decided atomic.Int64
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res [1]algo.Result
			for i := 0; i < each; i++ {
				key := []byte(fmt.Sprintf("c%d", g))
				if ok, err := rs.Decide(ctx, []algo.Request{{Policy: rule, Key: key}}, res[:]); err != nil || !ok {
					t.Errorf("Decide = %v, %v", ok, err)
					return
				}
				if want := int64(1_000_000 - i - 1); res[0].Remaining != want {
					t.Errorf("goroutine %d decision %d: Remaining = %d, want %d (another key's answer?)", g, i, res[0].Remaining, want)
				}
				decided.Add(1)
			}
		}()
	}
	wg.Wait()
	scripts := calls() - before
	t.Logf("%d decisions in %d script calls", decided.Load(), scripts)
	if scripts >= decided.Load() {
		t.Errorf("%d decisions took %d script calls: concurrent decisions did not share calls", decided.Load(), scripts)
	}
}

// commandCalls reads calls=N for one command from INFO commandstats.
func commandCalls(info, cmd string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// TestScriptReloadsAfterFlush: a Redis that lost its script cache (restart,
// failover, SCRIPT FLUSH) answers NOSCRIPT, and Decide falls back to EVAL.
func TestScriptReloadsAfterFlush(t *testing.T) {
	rs, client, _ := newRedisStore(t, nil)
	ctx := context.Background()
	rule := algotest.MustPolicy(t, algo.Spec{Name: "x", Algorithm: algo.FixedWindow, Limit: 2, Window: time.Minute})
	algotest.DecideOne(t, rs, algo.Request{Policy: rule, Key: []byte("k")})
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got := algotest.DecideOne(t, rs, algo.Request{Policy: rule, Key: []byte("k")}); !got.Allowed || got.Remaining != 0 {
		t.Errorf("after SCRIPT FLUSH: %+v, want allowed with 0 remaining", got)
	}
}

// TestShadowRulesCountButNeverDeny: a shadow rule's denial admits the
// request anyway; an enforcing denial consumes nothing, shadow rules
// included; an admitted request counts in every allowing shadow rule.
func TestShadowRulesCountButNeverDeny(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch.Add(time.Hour))
	ctx := context.Background()
	for _, st := range bothStores(t, clock) {
		for _, a := range algo.Algorithms() {
			t.Run(st.name+"/"+a.String(), func(t *testing.T) {
				enforce := algotest.MustPolicy(t, algo.Spec{Name: "enforce", Algorithm: a, Limit: 1, Window: time.Minute})
				shadow := algotest.MustPolicy(t, algo.Spec{Name: "shadow", Algorithm: a, Limit: 2, Window: time.Minute})
				res := make([]algo.Result, 2)
				decide := func(enforceKey, shadowKey string) bool {
					t.Helper()
					ok, err := st.store.Decide(ctx, []algo.Request{{Policy: enforce, Key: []byte(enforceKey)}, {Policy: shadow, Key: []byte(shadowKey), Shadow: true}}, res)
					if err != nil {
						t.Fatal(err)
					}
					return ok
				}
				if !decide("e1", "s") || !res[1].Allowed || res[1].Remaining != 1 {
					t.Fatalf("first request: %+v, want admitted with the shadow rule at 1 remaining", res)
				}
				if !decide("e2", "s") || res[1].Remaining != 0 {
					t.Fatalf("second request: %+v, want admitted, shadow at 0", res)
				}
				if !decide("e3", "s") || res[1].Allowed || res[1].Reason != algo.ReasonLimited {
					t.Fatalf("third request: %+v, want admitted although the shadow rule denies", res)
				}
				if decide("e3", "fresh") {
					t.Fatalf("fourth request admitted past the used-up enforcing rule: %+v", res)
				}
				if got := algotest.DecideOne(t, st.store, algo.Request{Policy: shadow, Key: []byte("fresh")}); got.Remaining != 1 {
					t.Errorf("shadow rule after an enforced denial: Remaining = %d, want 1 (nothing consumed)", got.Remaining)
				}
			})
		}
	}
}

// TestOnePolicyTwoKeys: one policy may count two keys in one decision,
// each in its own state, all or nothing, for every algorithm.
func TestOnePolicyTwoKeys(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch.Add(5 * time.Minute))
	ctx := context.Background()
	for _, st := range bothStores(t, clock) {
		for _, a := range algo.Algorithms() {
			name := fmt.Sprintf("%s/%s", st.name, a)
			t.Run(name, func(t *testing.T) {
				p := algotest.MustPolicy(t, algo.Spec{Name: "two-" + a.String(), Algorithm: a, Limit: 3, Window: time.Minute})
				k1, k2 := []byte(name+"-1"), []byte(name+"-2")
				// k2 spends 2 of its 3 alone first.
				for i := 0; i < 2; i++ {
					algotest.DecideOne(t, st.store, algo.Request{Policy: p, Key: k2})
				}
				both := []algo.Request{{Policy: p, Key: k1}, {Policy: p, Key: k2}}
				res := make([]algo.Result, 2)
				ok, err := st.store.Decide(ctx, both, res)
				if err != nil || !ok {
					t.Fatalf("first decision of both = %v, %v (%+v), want admitted", ok, err, res)
				}
				if res[0].Remaining != 2 || res[1].Remaining != 0 {
					t.Fatalf("first decision of both: remaining %d and %d, want 2 and 0", res[0].Remaining, res[1].Remaining)
				}
				ok, err = st.store.Decide(ctx, both, res)
				if err != nil || ok || !res[0].Allowed || res[1].Allowed {
					t.Fatalf("second decision of both = %v, %v (%+v), want denied by k2 alone", ok, err, res)
				}
				// The denial consumed nothing of k1.
				if got := algotest.DecideOne(t, st.store, algo.Request{Policy: p, Key: k1}).Remaining; got != 1 {
					t.Errorf("k1 alone afterwards: Remaining = %d, want 1", got)
				}
			})
		}
	}
}
