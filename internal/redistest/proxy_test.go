package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestLatencyProxyRoundTrip(t *testing.T) {
	t.Parallel()
	srv := NewLocal(t)
	p := NewLatencyProxy(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: p.Addr, PoolSize: 1, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil { // handshake before timing
		t.Fatal(err)
	}
	for _, d := range []time.Duration{5 * time.Millisecond, 60 * time.Millisecond, 0} {
		// The same open connection carries on at the new delay.
		p.SetDelay(d)
		var rtts []time.Duration
		for i := 0; i < 7; i++ {
			start := time.Now()
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			rtts = append(rtts, time.Since(start))
		}
		slices.Sort(rtts)
		median := rtts[len(rtts)/2]
		t.Logf("delay %v: PING round trips %v, median %v", d, rtts, median)
		// Each direction waits at least d, so 2d is a hard floor; the
		// ceiling, on the fastest round trip, leaves room for a busy
		// machine under -race (60ms applied twice in a direction still fails).
		if rtts[0] < 2*d || rtts[0] > 2*d+50*time.Millisecond {
			t.Errorf("delay %v: round trips %v, want about %v", d, rtts, 2*d)
		}
	}
	if got := OpenConns(t, p.Addr); got != 1 {
		t.Errorf("OpenConns(proxy) = %d, want the client's one", got)
	}
	if got := p.Conns(); got != 1 {
		t.Errorf("Conns = %d, want 1", got)
	}
}

// TestLatencyProxyThroughput sends chunks faster than the delay and checks
// they are not delivered one per delay.
func TestLatencyProxyThroughput(t *testing.T) {
	t.Parallel()
	srv := NewLocal(t)
	p := NewLatencyProxy(t, srv.Addr)
	const d, n, gap = 60 * time.Millisecond, 20, 3 * time.Millisecond
	p.SetDelay(d)
	conn, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	var written time.Duration
	for i := 0; i < n; i++ {
		if i > 0 {
			time.Sleep(gap) // separate chunks, not a readiness wait
		}
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
		written = time.Since(start)
	}
	r := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for i := 0; i < n; i++ {
		line, err := r.ReadString('\n')
		if err != nil || line != "+PONG\r\n" {
			t.Fatalf("reply %d = %q, %v", i, line, err)
		}
	}
	took := time.Since(start)
	t.Logf("%d PINGs %v apart through a %v proxy: written in %v, all answered after %v", n, gap, d, written, took)
	// The last reply is due 2d after the last write; one chunk per delay
	// would take n×d.
	if took < written+2*d || took > written+2*d+100*time.Millisecond {
		t.Errorf("took %v, want about %v; one chunk per delay would take %v", took, written+2*d, n*d)
	}
}

// TestLatencyProxyPauseAndCloseAll is not parallel: it counts the
// process's goroutines.
func TestLatencyProxyPauseAndCloseAll(t *testing.T) {
	srv := NewLocal(t) // its process waiter lives until cleanup
	before := SnapshotGoroutines()
	p := NewLatencyProxy(t, srv.Addr)
	conn, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	if err := pingRW(conn, r, time.Second); err != nil {
		t.Fatalf("PING = %v", err)
	}

	p.Pause()
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := r.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read while paused = %v, want a timeout", err)
	}
	p.Resume()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("read after Resume = %q, %v; want the held +PONG", line, err)
	}

	p.CloseAll()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatalf("read after CloseAll succeeded")
	}
	if err := poll(5*time.Second, func() error {
		if n := p.Conns(); n != 0 {
			return fmt.Errorf("Conns after CloseAll = %d, want 0", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	WaitConns(t, p.Addr, 0, 5*time.Second)
	// The proxy still accepts.
	again, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := pingRW(again, bufio.NewReader(again), time.Second); err != nil {
		t.Errorf("PING on a new connection after CloseAll = %v", err)
	}
	if got := OpenConns(t, p.Addr); got != 1 {
		t.Errorf("OpenConns(proxy) = %d, want 1", got)
	}
	again.Close()
	p.Close()
	before.WaitBack(t, 5*time.Second)
}

// pingRW sends PING on conn and reads +PONG from r within timeout.
func pingRW(conn net.Conn, r *bufio.Reader, timeout time.Duration) error {
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return errors.New(strings.TrimSpace(line))
	}
	return nil
}

// TestDialViaCluster puts a proxy in front of every node of a cluster and
// checks that a cluster client, which learns the nodes' real addresses
// from CLUSTER SLOTS, still goes through them.
func TestDialViaCluster(t *testing.T) {
	t.Parallel()
	c := NewClusterTopology(t, 3, 0)
	var proxies []*LatencyProxy
	for _, n := range c.Nodes {
		p := NewLatencyProxy(t, n.Addr)
		p.SetDelay(20 * time.Millisecond)
		proxies = append(proxies, p)
	}
	cc := c.Client(t, func(o *redis.ClusterOptions) { o.Dialer = DialVia(proxies...) })
	ctx := context.Background()
	prefix := c.Prefix(t)
	for i := 0; i < 5; i++ {
		key := fmt.Sprintf("%s:%d", prefix, i)
		start := time.Now()
		if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 40*time.Millisecond {
			t.Errorf("SET %s took %v, want at least the proxies' 2×20ms", key, took)
		}
	}
	// The proxies live in this process too: every connection to a node
	// must be a proxy's. The client may open one in the background (its
	// state reload), whose socket exists a moment before its proxy counts
	// it: the two counts must meet, and a direct connection keeps them
	// apart.
	for i, n := range c.Nodes {
		var got, want int
		err := poll(5*time.Second, func() error {
			if got, want = OpenConns(t, n.Addr), proxies[i].Conns(); got != want {
				return fmt.Errorf("%d open, %d of its proxy", got, want)
			}
			return nil
		})
		if err != nil {
			t.Errorf("OpenConns(%s) = %d, want the %d of its proxy: none direct", n, got, want)
		}
	}
}
