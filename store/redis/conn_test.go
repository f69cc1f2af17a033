package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// directStore returns a store on a client of srv made from opts (its
// address and dialer set here), the client, and the count of connections
// dialed.
func directStore(t *testing.T, srv *redistest.Server, opts *goredis.Options, ro Options) (*Store, *goredis.Client, *atomic.Int64) {
	t.Helper()
	var dials atomic.Int64
	var d net.Dialer
	opts.Addr, opts.MaxRetries, opts.ContextTimeoutEnabled = srv.Addr, -1, true
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}
	client := goredis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	if ro.Prefix == "" {
		ro.Prefix = srv.Prefix(t)
	}
	if ro.Timeout == 0 {
		ro.Timeout = 10 * time.Second
	}
	rs := New(client, ro)
	t.Cleanup(func() { _ = rs.Close() })
	return rs, client, &dials
}

// TestDecideConnsCarryDecisions: on a standalone client, decisions go on
// the store's own connections, one per Options.Conns, dialed by Warm,
// never through go-redis's pool, and decide as go-redis's path does.
func TestDecideConnsCarryDecisions(t *testing.T) {
	srv := redistest.New(t)
	const conns = 3
	rs, client, dials := directStore(t, srv, &goredis.Options{PoolSize: 4}, Options{Conns: conns})
	ref, _, _ := directStore(t, srv, &goredis.Options{PoolSize: 4 + conns}, Options{Conns: conns})
	ref.direct = nil // go-redis's pool carries its decisions
	clock := algotest.NewClock(algotest.Epoch.Add(time.Minute))
	rs.clock, ref.clock = clock.Now, clock.Now
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ref.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := dials.Load(), int64(4+conns); got != want {
		t.Errorf("Warm dialed %d connections, want %d: the pool's and one per Conns", got, want)
	}
	before := *client.PoolStats()
	dialed := dials.Load()

	policies := []*algo.Policy{
		algotest.MustPolicy(t, algo.Spec{Name: "fw", Algorithm: algo.FixedWindow, Limit: 5, Window: time.Hour}),
		algotest.MustPolicy(t, algo.Spec{Name: "swc", Algorithm: algo.SlidingWindowCounter, Limit: 7, Window: time.Hour}),
		algotest.MustPolicy(t, algo.Spec{Name: "log", Algorithm: algo.SlidingWindowLog, Limit: 3, Window: time.Hour}),
		algotest.MustPolicy(t, algo.Spec{Name: "tb", Algorithm: algo.TokenBucket, Limit: 4, Burst: 6, Window: time.Hour}),
	}
	// One request of one rule (the one-rule layout, an integer reply when
	// admitted), and of several rules (the batch layout), until denied.
	shapes := [][]*algo.Policy{{policies[0]}, {policies[1]}, {policies[2]}, {policies[3]}, policies}
	for i, shape := range shapes {
		for n := range 9 {
			reqs := make([]algo.Request, len(shape))
			for j, p := range shape {
				reqs[j] = algo.Request{Policy: p, Key: fmt.Appendf(nil, "key-%d", i)}
			}
			got, want := make([]algo.Result, len(reqs)), make([]algo.Result, len(reqs))
			okGot, errGot := rs.Decide(ctx, reqs, got)
			okWant, errWant := ref.Decide(ctx, reqs, want)
			if errGot != nil || errWant != nil {
				t.Fatalf("shape %d, request %d: Decide = %v on the store's connections, %v through go-redis", i, n, errGot, errWant)
			}
			if okGot != okWant || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("shape %d, request %d: Decide = %v %v on the store's connections, %v %v through go-redis", i, n, okGot, got, okWant, want)
			}
		}
	}
	// Concurrent decisions, batched.
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := []algo.Request{{Policy: policies[1], Key: fmt.Appendf(nil, "many-%d", g%3)}}
			res := make([]algo.Result, 1)
			for range 50 {
				if _, err := rs.Decide(ctx, reqs, res); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d concurrent decisions failed", n)
	}
	after := *client.PoolStats()
	if after.Hits != before.Hits || after.Misses != before.Misses || after.Timeouts != before.Timeouts {
		t.Errorf("decisions took connections from go-redis's pool: hits %d → %d, misses %d → %d", before.Hits, after.Hits, before.Misses, after.Misses)
	}
	if got := dials.Load(); got != dialed {
		t.Errorf("decisions dialed %d connections, want none: Warm opened them", got-dialed)
	}
}

// TestDecideConnsRedial: a decide connection closed by Redis while idle
// (killed, or Redis restarted) is found closed before it is used, and
// redialed: no decision fails. A Redis that lost its scripts gets the
// script's source.
func TestDecideConnsRedial(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(t *testing.T, srv *redistest.Server, admin *goredis.Client)
	}{
		{"client kill", func(t *testing.T, _ *redistest.Server, admin *goredis.Client) {
			if err := admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{"restart", func(t *testing.T, srv *redistest.Server, _ *goredis.Client) {
			srv.Stop(t)
			srv.Restart(t)
		}},
		{"script flush", func(t *testing.T, _ *redistest.Server, admin *goredis.Client) {
			if err := admin.ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.New(t)
			if !srv.Owned {
				t.Skip("needs a server of its own")
			}
			rs, _, dials := directStore(t, srv, &goredis.Options{PoolSize: 6}, Options{Conns: 2})
			ctx := context.Background()
			if err := rs.Warm(ctx); err != nil {
				t.Fatal(err)
			}
			p := algotest.MustPolicy(t, algo.Spec{Name: "redial", Algorithm: algo.FixedWindow, Limit: 1 << 40, Window: time.Hour})
			reqs := []algo.Request{{Policy: p, Key: []byte("k")}}
			res := make([]algo.Result, 1)
			for range 4 {
				if _, err := rs.Decide(ctx, reqs, res); err != nil {
					t.Fatal(err)
				}
			}
			dialed := dials.Load()
			admin := srv.Client(t)
			tc.fault(t, srv, admin)
			// A connection used within idleCheck is trusted unchecked;
			// what Redis closed was left idle longer.
			time.Sleep(2 * idleCheck)
			for i := range 20 {
				if _, err := rs.Decide(ctx, reqs, res); err != nil {
					t.Fatalf("decision %d after the fault: %v", i, err)
				}
			}
			if tc.name != "script flush" && dials.Load() == dialed {
				t.Errorf("no connection was dialed after the fault")
			}
		})
	}
}

// TestDecideConnLogin: a decide connection logs in as the client does, as
// a least-privilege ACL user, in the client's database, with its name; a
// refused login is a decision never sent.
func TestDecideConnLogin(t *testing.T) {
	srv := redistest.New(t)
	prefix := srv.Prefix(t)
	user := redistest.NewACLUser(t, srv, prefix)
	opts, err := goredis.ParseURL(user.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.DB, opts.ClientName, opts.PoolSize = 3, "authlimit-login", 5
	rs, _, _ := directStore(t, srv, opts, Options{Prefix: prefix, Conns: 1})
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	p := algotest.MustPolicy(t, algo.Spec{Name: "login", Algorithm: algo.FixedWindow, Limit: 10, Window: time.Hour})
	res := make([]algo.Result, 1)
	if ok, err := rs.Decide(ctx, []algo.Request{{Policy: p, Key: []byte("k")}}, res); err != nil || !ok {
		t.Fatalf("Decide = %v, %v; want admitted", ok, err)
	}
	admin := srv.Client(t)
	list, err := admin.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " cmd=evalsha") && strings.Contains(line, " name=authlimit-login ") &&
			strings.Contains(line, " db=3 ") && strings.Contains(line, " user="+user.Name+" ") {
			found = true
		}
	}
	if !found {
		t.Errorf("no connection of user %s, database 3, named authlimit-login, last ran EVALSHA:\n%s", user.Name, list)
	}
	db3 := srv.Client(t)
	if err := db3.Do(ctx, "SELECT", 3).Err(); err != nil {
		t.Fatal(err)
	}
	keys, err := admin.Keys(ctx, prefix+":*").Result()
	if err != nil || len(keys) != 0 {
		t.Errorf("database 0 holds %q (%v), want nothing", keys, err)
	}

	opts.Password = "wrong"
	bad, _, _ := directStore(t, srv, opts, Options{Prefix: prefix, Conns: 1})
	_, err = bad.Decide(ctx, []algo.Request{{Policy: p, Key: []byte("k")}}, res)
	if !errors.Is(err, algo.ErrUnreachable) {
		t.Errorf("Decide with a wrong password = %v, want an error wrapping ErrUnreachable", err)
	}
}

// TestDecideConnUnreachable: a decision for a Redis that refuses the
// connection was never sent.
func TestDecideConnUnreachable(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	client := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })
	rs := New(client, Options{Prefix: "unreachable", Timeout: time.Second})
	t.Cleanup(func() { _ = rs.Close() })
	if rs.direct == nil {
		t.Fatal("a standalone client made no decide connections")
	}
	p := algotest.MustPolicy(t, algo.Spec{Name: "u", Algorithm: algo.FixedWindow, Limit: 10, Window: time.Hour})
	_, err = rs.Decide(context.Background(), []algo.Request{{Policy: p, Key: []byte("k")}}, make([]algo.Result, 1))
	if !errors.Is(err, algo.ErrUnreachable) {
		t.Errorf("Decide on a closed port = %v, want an error wrapping ErrUnreachable", err)
	}
}

// TestDecideConnTimeout: a decision that Redis holds past its budget fails
// with context.DeadlineExceeded, and its connection, whose reply may still
// come, is dropped: the next decision dials another and succeeds.
func TestDecideConnTimeout(t *testing.T) {
	srv := redistest.New(t)
	const budget = 100 * time.Millisecond
	rs, _, dials := directStore(t, srv, &goredis.Options{PoolSize: 5}, Options{Conns: 1, Timeout: budget})
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	p := algotest.MustPolicy(t, algo.Spec{Name: "slow", Algorithm: algo.FixedWindow, Limit: 1 << 40, Window: time.Hour})
	reqs := []algo.Request{{Policy: p, Key: []byte("k")}}
	res := make([]algo.Result, 1)
	if _, err := rs.Decide(ctx, reqs, res); err != nil {
		t.Fatal(err)
	}
	dialed := dials.Load()
	redistest.PauseClients(t, srv.Client(t), 3*budget)
	if _, err := rs.Decide(ctx, reqs, res); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Decide while Redis holds every command = %v, want an error wrapping context.DeadlineExceeded", err)
	}
	w := rs.slots.take() // the one freed last: the decision's
	dropped := w.conn == nil
	rs.slots.put(w)
	if !dropped {
		t.Errorf("the connection of the timed-out decision is kept, want it dropped")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := rs.Decide(ctx, reqs, res)
		if err == nil {
			break
		}
		// Until the pause ends a decision times out, or the redial's
		// handshake does (a decision never sent).
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, algo.ErrUnreachable) || time.Now().After(deadline) {
			t.Fatalf("Decide after the pause = %v", err)
		}
	}
	if dials.Load() == dialed {
		t.Errorf("no connection was dialed after the timeout")
	}
}

// TestDecideConnReadOnly: a Redis that became a replica (an old master
// after a failover) answers READONLY; the connection is dropped, so that
// the next decision dials afresh, and decisions succeed once the server
// is a master again.
func TestDecideConnReadOnly(t *testing.T) {
	srv := redistest.New(t)
	other := redistest.New(t)
	if !srv.Owned || !other.Owned {
		t.Skip("needs servers of its own")
	}
	rs, _, dials := directStore(t, srv, &goredis.Options{PoolSize: 5}, Options{Conns: 1})
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	p := algotest.MustPolicy(t, algo.Spec{Name: "ro", Algorithm: algo.FixedWindow, Limit: 1 << 40, Window: time.Hour})
	reqs := []algo.Request{{Policy: p, Key: []byte("k")}}
	res := make([]algo.Result, 1)
	if _, err := rs.Decide(ctx, reqs, res); err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	host, port, _ := net.SplitHostPort(other.Addr)
	if err := admin.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err() })
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for {
		_, err = rs.Decide(ctx, reqs, res)
		if err != nil && strings.Contains(err.Error(), "READONLY") || time.Now().After(deadline) {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "READONLY") {
		t.Fatalf("Decide on a replica = %v, want READONLY", err)
	}
	w := rs.slots.take() // the one freed last: the decision's
	dropped := w.conn == nil
	rs.slots.put(w)
	if !dropped {
		t.Errorf("the connection that answered READONLY is kept, want it dropped")
	}
	if err := admin.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	dialed := dials.Load()
	if _, err := rs.Decide(ctx, reqs, res); err != nil {
		t.Errorf("Decide on a master again = %v", err)
	}
	if dials.Load() == dialed {
		t.Errorf("no connection was dialed after READONLY")
	}
}

// TestDecideConnSentinelFailover: with Sentinel, the decide connections go
// to the master Sentinel names, and after a failover to the new one.
func TestDecideConnSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.NewSentinelTopology(t)
	client := s.Client(t, func(o *goredis.FailoverOptions) { o.MaxRetries, o.ContextTimeoutEnabled = -1, true })
	rs := New(client, Options{Prefix: s.Prefix(t), Timeout: time.Second, Conns: 2})
	t.Cleanup(func() { _ = rs.Close() })
	if rs.direct == nil {
		t.Fatal("a Sentinel client made no decide connections")
	}
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	p := algotest.MustPolicy(t, algo.Spec{Name: "failover", Algorithm: algo.FixedWindow, Limit: 1 << 40, Window: time.Hour})
	reqs := []algo.Request{{Policy: p, Key: []byte("k")}}
	res := make([]algo.Result, 1)
	if _, err := rs.Decide(ctx, reqs, res); err != nil {
		t.Fatal(err)
	}
	s.KillMaster(t)
	elected, _ := s.WaitFailover(t, 30*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := rs.Decide(ctx, reqs, res)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision within 30s of the failover: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	list, err := elected.Client(t).ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// EVALSHA, or EVAL: a replica does not always have the script.
	if !strings.Contains(list, "cmd=evalsha ") && !strings.Contains(list, "cmd=eval ") {
		t.Errorf("the new master %s ran no decide.lua:\n%s", elected.Addr, list)
	}
}

// TestDecideConnsLastFreedFirst: one decision after another goes on the
// connection freed last, so that at a few thousand decisions a second one
// connection carries them, used again within idleCheck, and the others
// wait; taking the connection idle the longest would use every one of
// them in turn, each past idleCheck and looked at first.
func TestDecideConnsLastFreedFirst(t *testing.T) {
	srv := redistest.New(t)
	const conns = 4
	rs, _, dials := directStore(t, srv, &goredis.Options{PoolSize: 4}, Options{Conns: conns})
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	dialed := dials.Load()
	time.Sleep(2 * idleCheck)
	start := time.Now()
	p := algotest.MustPolicy(t, algo.Spec{Name: "seq", Algorithm: algo.FixedWindow, Limit: 1000, Window: time.Hour})
	res := make([]algo.Result, 1)
	for i := range 20 {
		if ok, err := rs.Decide(ctx, []algo.Request{{Policy: p, Key: []byte("k")}}, res); err != nil || !ok {
			t.Fatalf("decision %d = %v, %v", i, ok, err)
		}
	}
	ws := rs.slots.takeAll(conns)
	used := 0
	for _, w := range ws {
		if w.conn == nil {
			t.Errorf("a worker has no connection after Warm and decisions")
			continue
		}
		if !w.conn.used.Before(start) {
			used++
		}
	}
	for _, w := range ws {
		rs.slots.put(w)
	}
	if used != 1 {
		t.Errorf("20 decisions one after another used %d of %d connections, want 1", used, conns)
	}
	if d := dials.Load() - dialed; d != 0 {
		t.Errorf("the decisions dialed %d connections, want none", d)
	}
}

// TestFreeWorkers: the worker put back last is taken first, take answers
// nil when none is free, and takeAll waits for those in use.
func TestFreeWorkers(t *testing.T) {
	f := newFreeWorkers(3)
	a, b, c := f.take(), f.take(), f.take()
	if a == nil || b == nil || c == nil || a == b || b == c || a == c {
		t.Fatalf("three takes = %p, %p, %p; want three workers", a, b, c)
	}
	if w := f.take(); w != nil || f.free() != 0 {
		t.Fatalf("a fourth take = %p with %d free, want nil and 0", w, f.free())
	}
	f.put(b)
	f.put(a)
	if w := f.take(); w != a {
		t.Errorf("take = %p, want %p, the one put back last", w, a)
	}
	f.put(a)
	got := make(chan []*worker)
	go func() { got <- f.takeAll(3) }()
	select {
	case ws := <-got:
		t.Fatalf("takeAll(3) with 2 free = %d workers, want it to wait", len(ws))
	case <-time.After(20 * time.Millisecond):
	}
	f.put(c)
	select {
	case ws := <-got:
		if len(ws) != 3 || f.free() != 0 {
			t.Errorf("takeAll(3) = %d workers, %d left free; want 3 and 0", len(ws), f.free())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("takeAll(3) still waits after the third worker was put back")
	}
}
