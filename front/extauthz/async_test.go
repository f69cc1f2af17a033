package extauthz

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/internal/redistest"
)

// dialCheck opens a connection of its own to st's Check.
func dialCheck(t *testing.T, st *stack) authv3.AuthorizationClient {
	t.Helper()
	conn, err := grpc.NewClient(st.check, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return authv3.NewAuthorizationClient(conn)
}

// checkStatus is a Check's answer as Envoy relays it: 200, or the denied
// response's status; 0 if the call failed.
func checkStatus(c authv3.AuthorizationClient, s step) int {
	resp, err := c.Check(context.Background(), checkRequest(s, false))
	if err != nil {
		return 0
	}
	if codes.Code(resp.GetStatus().GetCode()) == codes.OK {
		return 200
	}
	return int(resp.GetDeniedResponse().GetStatus().GetCode())
}

// TestCheckConcurrentExact: Checks of one client from many connections at
// once, decided as they come and answered by whoever completes their
// batches, admit exactly the limit.
func TestCheckConcurrentExact(t *testing.T) {
	st := newStack(t, backend{name: "redis", redis: redistest.New(t)}, "name=ip key=ip limit=100/1h", nil)
	const conns, perConn, each = 12, 4, 12
	var admitted, denied, other atomic.Int64
	var wg sync.WaitGroup
	for range conns {
		c := dialCheck(t, st)
		for range perConn {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					switch checkStatus(c, step{client: "198.51.100.20"}) {
					case 200:
						admitted.Add(1)
					case 429:
						denied.Add(1)
					default:
						other.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if admitted.Load() != 100 || other.Load() != 0 {
		t.Errorf("%d admitted, %d denied, %d failed of %d; want exactly 100 admitted and none failed", admitted.Load(), denied.Load(), other.Load(), conns*perConn*each)
	}
}

// TestCheckBudgetPassed: Checks whose decisions pass the store's budget
// (the link to Redis stalls) are answered 503 while the circuit is closed,
// within about the budget, and count as consumed in the local store: once
// the circuit opens, fail mode local admits only what is left.
func TestCheckBudgetPassed(t *testing.T) {
	srv := redistest.New(t)
	proxy := redistest.NewLatencyProxy(t, srv.Addr)
	const budget = 200 * time.Millisecond
	st := newStack(t, backend{name: "redis", redis: srv, proxy: proxy, budget: budget, failMode: guard.FailLocal}, "name=ip key=ip limit=5/1h", nil)
	s := step{client: "198.51.100.21"}
	if got := checkStatus(st.client, s); got != 200 {
		t.Fatalf("first Check = %d, want 200", got)
	}
	proxy.Pause()
	defer proxy.Resume()
	// The breakers open after 3 failures (newStack).
	var wg sync.WaitGroup
	got := make([]int, 3)
	start := time.Now()
	for i := range got {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = checkStatus(dialCheck(t, st), s) }()
	}
	wg.Wait()
	if elapsed := time.Since(start); elapsed > budget+2*time.Second {
		t.Errorf("the stalled Checks were answered after %v, want about the budget (%v)", elapsed, budget)
	}
	for i, g := range got {
		if g != 503 {
			t.Errorf("stalled Check %d = %d, want 503", i, g)
		}
	}
	// Local: 5, less the one admitted and the 3 that may have been.
	if got := checkStatus(st.client, s); got != 200 {
		t.Errorf("Check with the circuit open = %d, want 200 (1 left locally)", got)
	}
	if got := checkStatus(st.client, s); got != 429 {
		t.Errorf("Check with the circuit open = %d, want 429 (none left locally)", got)
	}
}

// TestCheckGracefulStopWaits: GracefulStop returns once the Checks whose
// decisions are out have been answered, and they are answered.
func TestCheckGracefulStopWaits(t *testing.T) {
	srv := redistest.New(t)
	proxy := redistest.NewLatencyProxy(t, srv.Addr)
	st := newStack(t, backend{name: "redis", redis: srv, proxy: proxy, budget: 5 * time.Second}, "name=ip key=ip limit=1000/1h", nil)
	if got := checkStatus(st.client, step{client: "198.51.100.22"}); got != 200 {
		t.Fatalf("first Check = %d, want 200", got)
	}
	// Redis answers each call late enough that every call is out and
	// waiting when GracefulStop comes, even on a loaded machine: a call
	// not yet sent by then is refused, rightly, and would fail the test.
	const delay = time.Second
	proxy.SetDelay(delay)
	const calls = 12
	var wg sync.WaitGroup
	got := make([]int, calls)
	for i := range got {
		c := dialCheck(t, st)
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = checkStatus(c, step{client: "198.51.100.22"})
		}()
	}
	time.Sleep(delay * 3 / 5) // the calls are out, waiting for Redis
	// GracefulStop closes every connection once it returns: a call it
	// had not waited for fails.
	st.grpc.GracefulStop()
	wg.Wait()
	for i, g := range got {
		if g != 200 {
			t.Errorf("Check %d in flight at GracefulStop = %d, want 200", i, g)
		}
	}
}
