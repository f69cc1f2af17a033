package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSentinelTopologyFailover kills the master while a client writes and
// its replica lags, and checks that the sentinels promote the replica with
// every write the master acknowledged.
func TestSentinelTopologyFailover(t *testing.T) {
	t.Parallel()
	s := NewSentinelTopology(t, WithDebugCommand())
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
	// A writer that pipelines INCRs and a large SET to the master until the
	// kill ends it, remembering the highest count the master acknowledged.
	writer := master.Client(t)
	bulk := strings.Repeat("x", 8<<10)
	acked := make(chan int64, 1)
	go func() {
		var high int64
		defer func() { acked <- high }()
		for {
			cmds, err := writer.Pipelined(ctx, func(p redis.Pipeliner) error {
				for range 16 {
					p.Incr(ctx, key)
				}
				p.Set(ctx, key+":bulk", bulk, 0)
				return nil
			})
			for _, c := range cmds {
				if c, ok := c.(*redis.IntCmd); !ok {
					continue
				} else if n, err := c.Result(); err == nil && n > high {
					high = n
				}
			}
			if err != nil {
				return
			}
		}
	}()
	waitCount(t, master.Client(t), key, 1000)
	// The replica stops reading for a second, so the replication stream the
	// master owes it outgrows the sockets' buffers and waits in the master.
	slept := make(chan error, 1)
	go func() { slept <- replica.Client(t).Do(ctx, "DEBUG", "SLEEP", 1).Err() }()
	time.Sleep(400 * time.Millisecond)

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
	if err := <-slept; err != nil {
		t.Fatalf("DEBUG SLEEP on the replica: %v", err)
	}
	high := <-acked
	got, err := s.Client(t).Get(ctx, key).Int64()
	if err != nil || got < high {
		t.Errorf("GET %s after failover = %d, %v; the old master acknowledged %d", key, got, err, high)
	}
	t.Logf("the old master acknowledged %d increments; the new master holds %d", high, got)
}

// waitCount waits until the counter at key reaches n.
func waitCount(t *testing.T, c *redis.Client, key string, n int64) {
	t.Helper()
	err := poll(10*time.Second, func() error {
		got, err := c.Get(context.Background(), key).Int64()
		if err != nil || got < n {
			return fmt.Errorf("%s = %d, %v; want %d", key, got, err, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
