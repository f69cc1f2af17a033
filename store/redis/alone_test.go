package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/redistest"
)

// TestAloneDecisionKeepsItsBudget: a request that finds nothing queued goes
// out on its caller's goroutine, and still answers within its budget when
// the link to Redis stalls, is never sent a second time, and leaves the
// store deciding normally once the link is back.
func TestAloneDecisionKeepsItsBudget(t *testing.T) {
	srv := redistest.New(t)
	proxy := redistest.NewLatencyProxy(t, srv.Addr)
	opts, err := goredis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.Addr, opts.MaxRetries, opts.ContextTimeoutEnabled, opts.PoolSize = proxy.Addr, -1, true, 6
	client := goredis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	const budget = 200 * time.Millisecond
	rs := New(client, Options{Prefix: srv.Prefix(t), Timeout: budget, Conns: 2})
	t.Cleanup(func() { _ = rs.Close() })
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	const limit = 10
	reqs := []algo.Request{{Policy: algotest.MustPolicy(t, algo.Spec{Name: "alone", Algorithm: algo.FixedWindow, Limit: limit, Window: time.Hour}), Key: []byte("203.0.113.9")}}
	res := make([]algo.Result, 1)
	if ok, err := rs.Decide(ctx, reqs, res); err != nil || !ok {
		t.Fatalf("first Decide = %v, %v; want admitted", ok, err)
	}

	proxy.Pause()
	start := time.Now()
	_, err = rs.Decide(ctx, reqs, res)
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Decide on a stalled link = %v, want an error wrapping context.DeadlineExceeded", err)
	}
	// A loaded machine may be late to run the caller, never by a budget
	// of Redis's making.
	if elapsed > budget+time.Second {
		t.Errorf("Decide on a stalled link took %v, want about the budget (%v)", elapsed, budget)
	}
	proxy.Resume()

	// The stalled request reaches Redis once the link is back, or never;
	// every attempt that failed meanwhile may have run once too.
	failed := 0
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := rs.Decide(ctx, reqs, res)
		if err == nil && ok {
			break
		}
		failed++
		if time.Now().After(deadline) {
			t.Fatalf("no decision within 10s of the link's return; last: %v, %v", ok, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	consumed := limit - res[0].Remaining
	if lo, hi := int64(2), int64(3+failed); consumed < lo || consumed > hi {
		t.Errorf("the key counts %d requests, want %d to %d: the first, the last, and at most once each the stalled one and %d failed attempts", consumed, lo, hi, failed)
	}
}
