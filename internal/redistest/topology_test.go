package redistest

import (
	"context"
	"testing"
	"time"
)

func TestKeySlot(t *testing.T) {
	tests := []struct {
		key  string
		want int
	}{
		{"", 0},
		{"foo", 12182},
		{"123456789", 12739}, // CRC16/XMODEM check value 0x31C3, mod 16384
		{"{user1000}.following", KeySlot("user1000")},
		{"foo{}{bar}", KeySlot("foo{}{bar}")}, // empty tag: whole key
		{"foo{{bar}}zap", KeySlot("{bar")},
	}
	for _, tt := range tests {
		if got := KeySlot(tt.key); got != tt.want {
			t.Errorf("KeySlot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

func TestParseClusterNodes(t *testing.T) {
	reply := "07c3 127.0.0.1:30004@31004 slave e7d1 0 1426238317239 4 connected\n" +
		"67ed 127.0.0.1:30002@31002,host master - 0 1426238316232 2 connected 5461-10922 [42->-e7d1]\n" +
		"e7d1 127.0.0.1:30001@31001 myself,master,fail? - 0 0 1 connected 0-5460 16383\n"
	views, err := parseClusterNodes(reply)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(views), 3; got != want {
		t.Fatalf("len(views) = %d, want %d", got, want)
	}
	if v := views[0]; v.Master || v.MasterID != "e7d1" || v.Addr != "127.0.0.1:30004" {
		t.Errorf("replica line = %+v", v)
	}
	if v := views[1]; !v.Master || len(v.Slots) != 1 || v.Slots[0] != (SlotRange{5461, 10922}) || len(v.Open) != 1 {
		t.Errorf("master line = %+v", v)
	}
	if v := views[2]; !v.Myself || !v.Failed || slotCount(v.Slots) != 5462 {
		t.Errorf("myself line = %+v", v)
	}
	if got, want := ownerOf(views, 6000), "67ed"; got != want {
		t.Errorf("ownerOf(6000) = %q, want %q", got, want)
	}
	if got := ownerOf(views, 0); got != "" {
		t.Errorf("ownerOf(0) = %q, want none: its master is failed", got)
	}
}

// TestClusterTopologyFailover starts three masters with a replica each,
// kills the master of one key and checks that its replica takes over, the
// key survives, and the old master rejoins as a replica.
func TestClusterTopologyFailover(t *testing.T) {
	t.Parallel()
	c := NewClusterTopology(t, 3, 1)
	if got, want := len(c.Nodes), 6; got != want {
		t.Fatalf("len(Nodes) = %d, want %d", got, want)
	}
	if got, want := len(c.Masters(t)), 3; got != want {
		t.Fatalf("len(Masters) = %d, want %d", got, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, key := range []string{"a", "foo", "{tag}x", "authlimit:rule:1.2.3.4"} {
		n := c.Nodes[0].Client(t)
		got, err := n.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if int(got) != KeySlot(key) {
			t.Errorf("KeySlot(%q) = %d, CLUSTER KEYSLOT says %d", key, KeySlot(key), got)
		}
	}

	cc := c.Client(t)
	key := c.Prefix(t) + ":k"
	if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	old := c.MasterForKey(t, key)
	replicas := c.Replicas(t, old)
	if len(replicas) != 1 {
		t.Fatalf("Replicas(%s) = %v, want one", old, replicas)
	}
	// Make sure the replica has the key before the crash.
	if n, err := old.Client(t).Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 on %s = %d, %v", old, n, err)
	}

	c.Kill(t, old)
	successor, took := c.WaitFailover(t, old, 30*time.Second)
	t.Logf("cluster failover of %s to %s took %v", old, successor, took)
	if successor != replicas[0] {
		t.Errorf("WaitFailover = %s, want its replica %s", successor, replicas[0])
	}
	if got := c.MasterForKey(t, key); got != successor {
		t.Errorf("MasterForKey after failover = %s, want %s", got, successor)
	}
	// A fresh client: how an existing one finds the new master is for the
	// tests of authlimit to show.
	if got, err := c.Client(t).Get(ctx, key).Result(); err != nil || got != "v" {
		t.Errorf("GET %s after failover = %q, %v; want v", key, got, err)
	}

	c.Restart(t, old)
	c.WaitHealthy(t, 30*time.Second)
	if got := c.Replicas(t, successor); len(got) != 1 || got[0] != old {
		t.Errorf("Replicas(%s) after restart = %v, want the old master %s", successor, got, old)
	}
}
