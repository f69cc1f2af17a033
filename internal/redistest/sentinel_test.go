package redistest

import (
	"context"
	"testing"
	"time"
)

// TestSentinelTopologyFailover kills the master and checks that the
// sentinels promote the replica with the data it had.
func TestSentinelTopologyFailover(t *testing.T) {
	t.Parallel()
	s := NewSentinelTopology(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	master, replica := s.Servers[0], s.Servers[1]
	if got := s.MasterAddr(t); got != master.Addr {
		t.Fatalf("MasterAddr = %s, want %s", got, master.Addr)
	}
	if got, want := len(s.SentinelAddrs()), 3; got != want {
		t.Fatalf("len(SentinelAddrs) = %d, want %d", got, want)
	}
	key := s.Prefix(t) + ":k"
	if err := s.Client(t).Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := master.Client(t).Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}

	if got := s.KillMaster(t); got != master {
		t.Fatalf("KillMaster killed %s, want %s", got.Addr, master.Addr)
	}
	elected, took := s.WaitFailover(t, 30*time.Second)
	t.Logf("sentinel failover from %s to %s took %v", master.Addr, elected.Addr, took)
	if elected != replica {
		t.Errorf("WaitFailover = %s, want the replica %s", elected.Addr, replica.Addr)
	}
	if got := s.MasterAddr(t); got != replica.Addr {
		t.Errorf("MasterAddr after failover = %s, want %s", got, replica.Addr)
	}
	if got, err := s.Client(t).Get(ctx, key).Result(); err != nil || got != "v" {
		t.Errorf("GET %s after failover = %q, %v; want v", key, got, err)
	}
}
