package redis

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/redistest"
)

func TestSlotMatchesRedis(t *testing.T) {
	t.Parallel()
	cluster := redistest.NewCluster(t)
	client := cluster.Client(t)
	ctx := context.Background()
	for _, tag := range []string{"a", "203.0.113.7", "2001:db8::/64", "user@example.com", string(algo.Tag(strings.Repeat("z", 100))), "123456789"} {
		want, err := client.ClusterKeySlot(ctx, "x{"+tag+"}y").Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := slot([]byte(tag)); int64(got) != want {
			t.Errorf("slot(%q) = %d, Redis says %d", tag, got, want)
		}
	}
}

// TestClusterSplitsBySlotAndRefunds runs decisions whose keys span cluster
// slots: they are admitted when every slot admits, and a denial in one slot
// leaves the other slots' state as it was.
func TestClusterSplitsBySlotAndRefunds(t *testing.T) {
	t.Parallel()
	rs, _ := newClusterStore(t)
	ctx := context.Background()
	for _, a := range algo.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			ra := algotest.MustPolicy(t, algo.Spec{Name: "a-" + a.String(), Algorithm: a, Limit: 3, Window: time.Minute})
			rb := algotest.MustPolicy(t, algo.Spec{Name: "b-" + a.String(), Algorithm: algo.FixedWindow, Limit: 1, Window: time.Minute})
			ka, kb := "client-a", "global"
			if slot([]byte(ka)) == slot([]byte(kb)) {
				t.Fatal("test keys share a slot")
			}
			both := []algo.Request{{Policy: ra, Key: []byte(ka)}, {Policy: rb, Key: []byte(kb)}}
			res := make([]algo.Result, 2)
			ok, err := rs.Decide(ctx, both, res)
			if err != nil || !ok {
				t.Fatalf("first decision = %v, %v, want admitted", ok, err)
			}
			if res[0].Remaining != 2 || res[1].Remaining != 0 {
				t.Fatalf("first decision results %+v, want 2 and 0 remaining", res)
			}
			ok, err = rs.Decide(ctx, both, res)
			if err != nil || ok {
				t.Fatalf("second decision = %v, %v, want denied by the global rule", ok, err)
			}
			if !res[0].Allowed || res[0].Remaining != 2 {
				t.Errorf("second decision: A = %+v, want allowed with 2 remaining (unconsumed)", res[0])
			}
			if got := algotest.DecideOne(t, rs, algo.Request{Policy: ra, Key: []byte(ka)}); got.Remaining != 1 {
				t.Errorf("A alone after the denied decision: Remaining = %d, want 1 (refunded)", got.Remaining)
			}
		})
	}
}

// TestClusterSameKeyIsOneCall: rules that limit the same key share a slot,
// so the SMS case (1/min + 5/h + 10/day on one phone number) is one atomic
// call in a cluster.
func TestClusterSameKeyIsOneCall(t *testing.T) {
	t.Parallel()
	rs, client := newClusterStore(t)
	ctx := context.Background()
	var reqs []algo.Request
	for _, l := range []struct {
		n int64
		w time.Duration
	}{{1, time.Minute}, {5, time.Hour}, {10, 24 * time.Hour}} {
		r := algotest.MustPolicy(t, algo.Spec{Name: fmt.Sprintf("sms-%d", l.n), Algorithm: algo.SlidingWindowLog, Limit: l.n, Window: l.w})
		reqs = append(reqs, algo.Request{Policy: r, Key: []byte("+15551234567")})
	}
	c := &call{}
	if err := rs.encode(ctx, c, reqs); err != nil || len(c.parts) != 1 {
		t.Fatalf("the SMS rules span %d slots (%v), want 1", len(c.parts), err)
	}
	// Count the script calls where they run: the decisions go through
	// each primary's own client, not the cluster client's hooks.
	scriptCalls := func() int64 {
		var mu sync.Mutex
		var n int64
		err := client.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			info, err := c.Info(ctx, "commandstats").Result()
			mu.Lock()
			n += commandCalls(info, "evalsha") + commandCalls(info, "eval")
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := scriptCalls()
	res := make([]algo.Result, 3)
	for i := 0; i < 3; i++ {
		ok, err := rs.Decide(ctx, reqs, res)
		if err != nil {
			t.Fatal(err)
		}
		if want := i == 0; ok != want {
			t.Errorf("SMS %d admitted = %v, want %v", i+1, ok, want)
		}
	}
	if got := scriptCalls() - before; got != 3 {
		t.Errorf("3 decisions made %d script calls, want 3", got)
	}
}

// TestClusterLostScripts: a primary that lost its script cache (a restart,
// a failover, SCRIPT FLUSH) answers NOSCRIPT, and the call is sent again by
// source, alone or in a pipeline of several calls to that primary; refunds
// too.
func TestClusterLostScripts(t *testing.T) {
	t.Parallel()
	rs, client := newClusterStore(t)
	ctx := context.Background()
	flush := func() {
		t.Helper()
		if err := client.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return c.ScriptFlush(ctx).Err()
		}); err != nil {
			t.Fatal(err)
		}
	}
	rule := algotest.MustPolicy(t, algo.Spec{Name: "lost", Algorithm: algo.FixedWindow, Limit: 3, Window: time.Hour})

	// Six calls on six slots of three primaries: at least one primary
	// gets a pipeline of several.
	flush()
	var calls []*slotCall
	for i := 0; i < 6; i++ {
		c := &call{}
		if err := rs.encode(ctx, c, []algo.Request{{Policy: rule, Key: []byte(fmt.Sprintf("pipelined-%d", i))}}); err != nil {
			t.Fatal(err)
		}
		w := &worker{parts: []*part{&c.parts[0]}}
		calls = append(calls, &slotCall{parts: w.parts, blob: rs.appendBatch(nil, w, 1), keys: c.parts[0].appendKeys(nil), slot: c.parts[0].slot})
	}
	settled := 0
	rs.evalSlots(ctx, rs.decideSHAArg, rs.decideSrcArg, calls, nil, func(sc *slotCall) {
		settled++
		rs.settle(sc)
		if sc.err != nil || sc.parts[0].err != nil {
			t.Errorf("slot %d: %v, %v", sc.slot, sc.err, sc.parts[0].err)
		} else if res := sc.parts[0].c.res[0]; !sc.parts[0].admitted || res.Remaining != 2 {
			t.Errorf("slot %d: admitted %v, %+v; want admitted with 2 remaining", sc.slot, sc.parts[0].admitted, res)
		}
	})
	if settled != len(calls) {
		t.Errorf("%d of %d calls settled", settled, len(calls))
	}

	// A decision across slots after a flush, and its refund after another.
	global := algotest.MustPolicy(t, algo.Spec{Name: "lost-global", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Hour})
	both := []algo.Request{{Policy: rule, Key: []byte("client-a")}, {Policy: global, Key: []byte("global")}}
	res := make([]algo.Result, 2)
	flush()
	if ok, err := rs.Decide(ctx, both, res); err != nil || !ok {
		t.Fatalf("first decision = %v, %v, want admitted", ok, err)
	}
	flush()
	if ok, err := rs.Decide(ctx, both, res); err != nil || ok {
		t.Fatalf("second decision = %v, %v, want denied by the global rule", ok, err)
	}
	flush()
	if got := algotest.DecideOne(t, rs, algo.Request{Policy: rule, Key: []byte("client-a")}); got.Remaining != 1 {
		t.Errorf("after the refund: Remaining = %d, want 1", got.Remaining)
	}
}

// TestClusterRefundThatMayHaveRunIsNotSentAgain: a refund whose reply does
// not come within its budget may still run (it was sent), so it is reported
// lost and never sent again: sending it twice would take back more than the
// denied request consumed, a fresh quota for its client.
func TestClusterRefundThatMayHaveRunIsNotSentAgain(t *testing.T) {
	cluster := redistest.NewCluster(t)
	// Deadlines on the wire, as authlimit configures its clients.
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	var mu sync.Mutex
	var lost int
	prefix := cluster.Prefix(t)
	rs := New(client, Options{Prefix: prefix, Timeout: 100 * time.Millisecond, OnRefundLost: func(n int, err error) {
		mu.Lock()
		lost += n
		mu.Unlock()
	}})
	t.Cleanup(func() { _ = rs.Close() })
	ctx := context.Background()
	// The budget of 100ms is the refund's: the set-up, which a loaded
	// machine may hold up longer, retries a warm-up (it writes nothing)
	// and decides the first request through a store of the same prefix
	// with a generous budget.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := rs.Warm(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	rule := algotest.MustPolicy(t, algo.Spec{Name: "once", Algorithm: algo.FixedWindow, Limit: 3, Window: time.Hour})
	q := algo.Request{Policy: rule, Key: []byte("client-a")}
	algotest.DecideOne(t, newRedis(t, client, prefix), q)
	// A second request, decided as a batch decides it, whose refund is then
	// owed as if another slot had denied it: 2 of 3 consumed, 1 to refund.
	c := &call{}
	if err := rs.encode(ctx, c, []algo.Request{q}); err != nil {
		t.Fatal(err)
	}
	w := &worker{parts: []*part{&c.parts[0]}}
	sc := &slotCall{parts: w.parts, blob: rs.appendBatch(nil, w, 1), keys: c.parts[0].appendKeys(nil), slot: c.parts[0].slot}
	rs.evalSlots(ctx, rs.decideSHAArg, rs.decideSrcArg, []*slotCall{sc}, nil, rs.settle)
	if sc.err != nil || !c.parts[0].admitted || c.res[0].Remaining != 1 {
		t.Fatalf("second request: %v, admitted %v, %+v; want admitted with 1 remaining", sc.err, c.parts[0].admitted, c.res[0])
	}
	refunds := rs.undo(c, nil)
	if len(refunds) != 1 {
		t.Fatalf("%d refunds owed, want 1", len(refunds))
	}

	// Keep the key's primary busy for 1.5s: the refund goes out, its budget
	// passes, and it runs once the primary is free. The primary is busy
	// once a ping goes unanswered for 250ms, too long for a loaded machine
	// alone to explain.
	node, err := client.MasterForKey(ctx, rs.slotKey(sc.slot))
	if err != nil {
		t.Fatal(err)
	}
	busy := make(chan error, 1)
	go func() {
		busy <- node.Eval(ctx, `local s = redis.call('TIME')
repeat local n = redis.call('TIME') until (n[1] - s[1]) * 1000000 + n[2] - s[2] >= tonumber(ARGV[1]) * 1000
return 1`, nil, 1500).Err()
	}()
	probe := goredis.NewClient(&goredis.Options{Addr: node.Options().Addr, ReadTimeout: 250 * time.Millisecond, MaxRetries: -1})
	defer probe.Close()
	for probe.Ping(ctx).Err() == nil {
		time.Sleep(5 * time.Millisecond) // until the primary stops answering
	}
	rs.owed.Add(1)
	rs.refundNow(refunds)
	rs.owed.Wait()
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	reported := lost
	mu.Unlock()
	if reported != 1 {
		t.Errorf("%d refunds reported lost, want 1: the refund's reply did not come within its budget", reported)
	}
	v, err := client.Get(ctx, string(c.parts[0].key(0))).Result()
	if err != nil {
		t.Fatal(err)
	}
	var window, n int64
	if _, err := fmt.Sscanf(v, "%x:%x", &window, &n); err != nil {
		t.Fatalf("state %q: %v", v, err)
	}
	if n < 1 {
		t.Errorf("count %d after one refund of the second of 2 requests, want 1 (refunded once) or 2 (not run): the refund ran twice", n)
	}
}

// TestClusterRefundFloodLeavesBatchesTheirConnections: many denials at once
// whose refunds are owed (a global rule denying, per-IP rules admitting)
// neither take the connections the batches need, nor fail the decisions
// around them, nor lose a refund: the pool is sized as authlimit sizes it
// (Conns + 4), with a pool wait as long as the budget.
func TestClusterRefundFloodLeavesBatchesTheirConnections(t *testing.T) {
	cluster := redistest.NewCluster(t)
	const conns, budget = 1, 250 * time.Millisecond
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs, ContextTimeoutEnabled: true,
		PoolSize: conns + 4, PoolTimeout: budget, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	var lost atomic.Int64
	rs := New(client, Options{Prefix: cluster.Prefix(t), Timeout: budget, Conns: conns,
		OnRefundLost: func(n int, err error) { lost.Add(int64(n)) }})
	t.Cleanup(func() { _ = rs.Close() })
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	perIP := algotest.MustPolicy(t, algo.Spec{Name: "flood-ip", Algorithm: algo.SlidingWindowLog, Limit: 1 << 20, Window: time.Hour})
	global := algotest.MustPolicy(t, algo.Spec{Name: "flood-global", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Hour})
	algotest.DecideOne(t, rs, algo.Request{Policy: global, Key: []byte("global")}) // the global rule denies from here on

	waits := client.PoolStats().WaitCount
	const denied, alone, each = 48, 8, 25
	var wg sync.WaitGroup
	var errs, admittedBoth, admittedAlone atomic.Int64
	var mu sync.Mutex
	var firstErr error
	for g := 0; g < denied+alone; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			ip := []byte(fmt.Sprintf("client-%d", g))
			reqs := []algo.Request{{Policy: perIP, Key: ip}, {Policy: global, Key: []byte("global")}}
			if g >= denied {
				reqs = reqs[:1]
			}
			res := make([]algo.Result, len(reqs))
			for i := 0; i < each; i++ {
				ok, err := rs.Decide(ctx, reqs, res)
				switch {
				case err != nil:
					errs.Add(1)
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
				case ok && len(reqs) == 2:
					admittedBoth.Add(1)
				case ok:
					admittedAlone.Add(1)
				}
			}
		}(g)
	}
	wg.Wait()
	rs.owed.Wait()
	if n := errs.Load(); n > 0 {
		t.Errorf("%d of %d decisions failed during the flood of refunds, e.g. %v", n, (denied+alone)*each, firstErr)
	}
	if n := client.PoolStats().WaitCount - waits; n > 0 {
		t.Errorf("a connection was waited for %d times: the refunds took more connections than the pool keeps beyond the batches'", n)
	}
	if n := admittedBoth.Load(); n > 0 {
		t.Errorf("%d requests admitted past a global limit already reached", n)
	}
	var counted int64
	for g := 0; g < denied+alone; g++ {
		key := perIP.AppendStorageKey(nil, rs.prefix, []byte(fmt.Sprintf("client-%d", g)))
		n, err := client.ZCount(ctx, string(key), "(-inf", "+inf").Result() // the log's entries, not its anchor at -inf
		if err != nil {
			t.Fatal(err)
		}
		counted += n
	}
	// A refund reported lost may have run: it only widens the bound.
	if lo, hi := admittedAlone.Load(), admittedAlone.Load()+lost.Load(); counted < lo || counted > hi {
		t.Errorf("the per-IP rules count %d requests, want the %d admitted alone (+ up to %d reported lost refunds): the denied requests must count nothing",
			counted, lo, lost.Load())
	}
}
