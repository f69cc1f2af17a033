package redis

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// wireConn counts a connection's writes and the reads that returned
// bytes, each at least one system call, and the writes made by a caller of
// Store.Decide on the path of a decision alone (Store.alone: no queue, no
// timer, no relay). It shows go-redis its socket, so that the pool looks
// at it as it does in production.
type wireConn struct {
	net.Conn
	w *wire
}

type wire struct {
	writes, reads, byCaller atomic.Int64
}

func (c *wireConn) Write(p []byte) (int, error) {
	c.w.writes.Add(1)
	buf := make([]byte, 8<<10)
	if bytes.Contains(buf[:runtime.Stack(buf, false)], []byte("redis.(*Store).alone(")) {
		c.w.byCaller.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.w.reads.Add(1)
	}
	return n, err
}

func (c *wireConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// TestLoneDecisionIsOneWriteAndOneRead: a decision that finds nothing
// queued is written to Redis by its caller's own goroutine, with no other
// goroutine woken to carry it, in one write, and its reply comes in one
// read: at low load a decision costs the store two system calls on the
// wire and no hand-off.
func TestLoneDecisionIsOneWriteAndOneRead(t *testing.T) {
	w := &wire{}
	var d net.Dialer
	rs, _, _ := newRedisStore(t, &goredis.Options{
		MaxRetries: -1, ContextTimeoutEnabled: true, PoolSize: 8,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &wireConn{Conn: c, w: w}, nil
		},
	})
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	reqs := []algo.Request{{Policy: algotest.MustPolicy(t, algo.Spec{Name: "wire", Algorithm: algo.SlidingWindowCounter, Limit: 1 << 40, Window: time.Hour}), Key: []byte("203.0.113.7")}}
	res := make([]algo.Result, 1)
	const n = 20
	writes, reads, byCaller := w.writes.Load(), w.reads.Load(), w.byCaller.Load()
	for range n {
		if ok, err := rs.Decide(ctx, reqs, res); err != nil || !ok {
			t.Fatalf("Decide = %v, %v; want admitted", ok, err)
		}
	}
	if got := w.writes.Load() - writes; got != n {
		t.Errorf("%d writes to Redis for %d decisions, want one each", got, n)
	}
	if got := w.byCaller.Load() - byCaller; got != n {
		t.Errorf("%d of %d decisions written by their caller alone (Store.alone), want all", got, n)
	}
	if got := w.reads.Load() - reads; got != n {
		t.Errorf("%d reads from Redis for %d decisions, want one each", got, n)
	}
}
