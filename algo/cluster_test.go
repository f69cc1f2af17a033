package algo

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/internal/redistest"
)

func TestSlotMatchesRedis(t *testing.T) {
	cluster := redistest.NewCluster(t)
	client := cluster.Client(t)
	ctx := context.Background()
	for _, tag := range []string{"a", "203.0.113.7", "2001:db8::/64", "user@example.com", string(Tag(strings.Repeat("z", 100))), "123456789"} {
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
	rs, _ := newClusterStore(t)
	ctx := context.Background()
	for _, a := range Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			ra := mustPolicy(t, Spec{Name: "a-" + a.String(), Algorithm: a, Limit: 3, Window: time.Minute})
			rb := mustPolicy(t, Spec{Name: "b-" + a.String(), Algorithm: FixedWindow, Limit: 1, Window: time.Minute})
			ka, kb := "client-a", "global"
			if slot([]byte(ka)) == slot([]byte(kb)) {
				t.Fatal("test keys share a slot")
			}
			both := []Request{{Policy: ra, Key: []byte(ka)}, {Policy: rb, Key: []byte(kb)}}
			res := make([]Result, 2)
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
			rs.owed.Wait()
			if got := decideOne(t, rs, Request{Policy: ra, Key: []byte(ka)}); got.Remaining != 1 {
				t.Errorf("A alone after the denied decision: Remaining = %d, want 1 (refunded)", got.Remaining)
			}
		})
	}
}

// TestClusterSameKeyIsOneCall: rules that limit the same key share a slot,
// so the SMS case (1/min + 5/h + 10/day on one phone number) is one atomic
// call in a cluster.
func TestClusterSameKeyIsOneCall(t *testing.T) {
	rs, client := newClusterStore(t)
	ctx := context.Background()
	var reqs []Request
	for _, l := range []struct {
		n int64
		w time.Duration
	}{{1, time.Minute}, {5, time.Hour}, {10, 24 * time.Hour}} {
		r := mustPolicy(t, Spec{Name: fmt.Sprintf("sms-%d", l.n), Algorithm: SlidingWindowLog, Limit: l.n, Window: l.w})
		reqs = append(reqs, Request{Policy: r, Key: []byte("+15551234567")})
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
		err := client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
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
	res := make([]Result, 3)
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
	rs, client := newClusterStore(t)
	ctx := context.Background()
	flush := func() {
		t.Helper()
		if err := client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.ScriptFlush(ctx).Err()
		}); err != nil {
			t.Fatal(err)
		}
	}
	rule := mustPolicy(t, Spec{Name: "lost", Algorithm: FixedWindow, Limit: 3, Window: time.Hour})

	// Six calls on six slots of three primaries: at least one primary
	// gets a pipeline of several.
	flush()
	var calls []*slotCall
	for i := 0; i < 6; i++ {
		c := &call{}
		if err := rs.encode(ctx, c, []Request{{Policy: rule, Key: []byte(fmt.Sprintf("pipelined-%d", i))}}); err != nil {
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
	global := mustPolicy(t, Spec{Name: "lost-global", Algorithm: FixedWindow, Limit: 1, Window: time.Hour})
	both := []Request{{Policy: rule, Key: []byte("client-a")}, {Policy: global, Key: []byte("global")}}
	res := make([]Result, 2)
	flush()
	if ok, err := rs.Decide(ctx, both, res); err != nil || !ok {
		t.Fatalf("first decision = %v, %v, want admitted", ok, err)
	}
	flush()
	if ok, err := rs.Decide(ctx, both, res); err != nil || ok {
		t.Fatalf("second decision = %v, %v, want denied by the global rule", ok, err)
	}
	rs.owed.Wait()
	flush()
	if got := decideOne(t, rs, Request{Policy: rule, Key: []byte("client-a")}); got.Remaining != 1 {
		t.Errorf("after the refund: Remaining = %d, want 1", got.Remaining)
	}
}
