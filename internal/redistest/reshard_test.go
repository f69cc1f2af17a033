package redistest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestSubtractSlots(t *testing.T) {
	got := subtractSlots([]SlotRange{{0, 10}, {20, 20}}, []SlotRange{{3, 5}, {20, 20}})
	want := []SlotRange{{0, 2}, {6, 10}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("subtractSlots = %v, want %v", got, want)
	}
}

// traffic keeps reading and writing keys through a cluster client until
// stopped, and counts what failed.
type traffic struct {
	ops, errs atomic.Int64
	lastErr   atomic.Value
	stop      chan struct{}
	wg        sync.WaitGroup
}

func startTraffic(cc *redis.ClusterClient, keys []string) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	tr.wg.Add(1)
	go func() {
		defer tr.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-tr.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := cc.Incr(ctx, keys[i%len(keys)]).Err()
			cancel()
			tr.ops.Add(1)
			if err != nil {
				tr.errs.Add(1)
				tr.lastErr.Store(err.Error())
			}
		}
	}()
	return tr
}

func (tr *traffic) Stop() {
	close(tr.stop)
	tr.wg.Wait()
}

// TestMigrationByHand moves one slot key batch by key batch and checks the
// redirections a client sees in each phase.
func TestMigrationByHand(t *testing.T) {
	t.Parallel()
	c := NewClusterTopology(t, 3, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cc := c.Client(t)
	prefix := c.Prefix(t)
	var keys []string
	for i := 0; i < 30; i++ {
		key := fmt.Sprintf("{%s}:%d", prefix, i)
		keys = append(keys, key)
		if err := cc.Set(ctx, key, 0, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	slot := KeySlot(keys[0])
	from := c.MasterForSlot(t, slot)
	var to *ClusterNode
	for _, m := range c.Masters(t) {
		if m != from {
			to = m
			break
		}
	}

	tr := startTraffic(c.Client(t), keys)
	m := c.BeginMigration(t, slot, to)
	if m.From != from {
		t.Fatalf("Migration.From = %s, want %s", m.From, from)
	}
	if got := m.MoveKeys(t, 5); got != 5 {
		t.Fatalf("MoveKeys(5) = %d", got)
	}
	if got, want := m.Remaining(t), 25; got != want {
		t.Errorf("Remaining = %d, want %d", got, want)
	}
	// A moved key: From redirects with ASK, To serves it only after ASKING.
	fromC, toC := from.Client(t), to.Client(t)
	if n, err := toC.ClusterCountKeysInSlot(ctx, slot).Result(); err != nil || n != 5 {
		t.Fatalf("COUNTKEYSINSLOT on To = %d, %v; want 5", n, err)
	}
	var moved, stayed string
	for _, k := range keys {
		if exists, _ := fromC.Exists(ctx, k).Result(); exists == 1 {
			stayed = k
		} else {
			moved = k
		}
	}
	if err := fromC.Get(ctx, moved).Err(); err == nil || !strings.HasPrefix(err.Error(), "ASK ") {
		t.Errorf("GET %s on From during migration = %v, want ASK", moved, err)
	}
	if err := fromC.Get(ctx, stayed).Err(); err != nil {
		t.Errorf("GET %s (not moved yet) on From = %v, want a value", stayed, err)
	}
	if err := toC.Get(ctx, moved).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
		t.Errorf("GET %s on To without ASKING = %v, want MOVED", moved, err)
	}
	conn := toC.Conn()
	defer conn.Close()
	if err := conn.Do(ctx, "ASKING").Err(); err != nil {
		t.Fatal(err)
	}
	if err := conn.Get(ctx, moved).Err(); err != nil {
		t.Errorf("GET %s on To after ASKING = %v, want a value", moved, err)
	}

	m.Finish(t)
	tr.Stop()
	if err := fromC.Get(ctx, stayed).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
		t.Errorf("GET %s on From after the migration = %v, want MOVED", stayed, err)
	}
	if got := c.MasterForSlot(t, slot); got != to {
		t.Errorf("MasterForSlot(%d) = %s, want %s", slot, got, to)
	}
	t.Logf("traffic during the migration: %d ops, %d errors (last: %v)", tr.ops.Load(), tr.errs.Load(), tr.lastErr.Load())
	var sum int64
	for _, k := range keys {
		n, err := cc.Get(ctx, k).Int64()
		if err != nil {
			t.Fatalf("GET %s after the migration: %v", k, err)
		}
		sum += n
	}
	// A failed INCR may still have counted.
	if ok := tr.ops.Load() - tr.errs.Load(); sum < ok || sum > tr.ops.Load() {
		t.Errorf("sum of counters = %d, want between %d successful INCRs and %d sent", sum, ok, tr.ops.Load())
	}
}

// TestReshard moves 100 slots with redis-cli while a client writes.
func TestReshard(t *testing.T) {
	t.Parallel()
	c := NewClusterTopology(t, 3, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	masters := c.Masters(t)
	from, to := masters[0], masters[1]
	// Keys in from's first slots, which redis-cli moves first.
	slots := slotsOf(c.View(t, from), from.ID)
	first := slots[0].First
	var keys []string
	prefix := c.Prefix(t)
	for i := 0; len(keys) < 50; i++ {
		k := fmt.Sprintf("%s:%d", prefix, i)
		if s := KeySlot(k); s >= first && s < first+100 {
			keys = append(keys, k)
		}
	}
	tr := startTraffic(c.Client(t), keys)
	start := time.Now()
	moved := c.Reshard(t, from, to, 100, 5)
	tr.Stop()
	t.Logf("redis-cli resharding of %v took %v; traffic meanwhile: %d ops, %d errors (last: %v)",
		moved, time.Since(start), tr.ops.Load(), tr.errs.Load(), tr.lastErr.Load())
	if got, want := slotCount(moved), 100; got != want {
		t.Errorf("moved %d slots, want %d", got, want)
	}
	for _, r := range moved {
		if got := c.MasterForSlot(t, r.First); got != to {
			t.Errorf("MasterForSlot(%d) = %s, want %s", r.First, got, to)
		}
	}
	if err := from.Client(t).Get(ctx, keys[0]).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
		t.Errorf("GET %s on the old master = %v, want MOVED", keys[0], err)
	}
	for _, k := range keys {
		if got := c.MasterForKey(t, k); got != to {
			t.Errorf("MasterForKey(%s) = %s, want %s", k, got, to)
		}
		if err := c.Client(t).Get(ctx, k).Err(); err != nil {
			t.Errorf("GET %s after resharding: %v", k, err)
		}
	}

	// And back by hand, one key per MIGRATE, still under traffic.
	tr = startTraffic(c.Client(t), keys)
	start = time.Now()
	c.MoveSlots(t, moved[0], from, MoveOptions{BatchSize: 1})
	tr.Stop()
	t.Logf("moving %v back by hand took %v; traffic meanwhile: %d ops, %d errors (last: %v)",
		moved[0], time.Since(start), tr.ops.Load(), tr.errs.Load(), tr.lastErr.Load())
	for _, k := range keys {
		if got := c.MasterForKey(t, k); got != from {
			t.Errorf("MasterForKey(%s) after moving back = %s, want %s", k, got, from)
		}
	}
	if err := poll(10*time.Second, c.agreed); err != nil {
		t.Errorf("nodes disagree after MoveSlots: %v", err)
	}
}
