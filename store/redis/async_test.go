package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/internal/redistest"
)

// asyncDone counts what a DecideAsync's Done is told.
type asyncDone struct {
	calls, admitted atomic.Int64
	errs            chan error
	wg              *sync.WaitGroup
}

func (d *asyncDone) Decided(admitted bool, err error) {
	if d.calls.Add(1) > 1 {
		panic("Done told twice")
	}
	if admitted {
		d.admitted.Add(1)
	}
	if err != nil && d.errs != nil {
		d.errs <- err
	}
	if d.wg != nil {
		d.wg.Done()
	}
}

// newAsyncRedis is a store on a client through proxy (or straight to srv
// when proxy is nil).
func newAsyncRedis(t *testing.T, srv *redistest.Server, proxy *redistest.LatencyProxy, budget time.Duration) *Store {
	t.Helper()
	opts, err := goredis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if proxy != nil {
		opts.Addr = proxy.Addr
	}
	opts.MaxRetries, opts.ContextTimeoutEnabled, opts.PoolSize = -1, true, 8
	client := goredis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	rs := New(client, Options{Prefix: srv.Prefix(t), Timeout: budget, Conns: 4, MaxBatch: 16})
	t.Cleanup(func() { _ = rs.Close() })
	if err := rs.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestDecideAsyncExact: asynchronous decisions, from many goroutines,
// mixed with synchronous ones on the same key, each told once, admit
// exactly the limit, whoever sends their batches.
func TestDecideAsyncExact(t *testing.T) {
	srv := redistest.New(t)
	rs := newAsyncRedis(t, srv, nil, 5*time.Second)
	const limit, goroutines, each = 150, 16, 40
	p := algotest.MustPolicy(t, algo.Spec{Name: "async-exact", Algorithm: algo.SlidingWindowCounter, Limit: limit, Window: time.Hour})
	var wg sync.WaitGroup
	var syncAdmitted atomic.Int64
	dones := make([]*asyncDone, goroutines*each)
	errs := make(chan error, len(dones))
	var decided sync.WaitGroup
	decided.Add(goroutines * each / 2)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				reqs := []algo.Request{{Policy: p, Key: []byte("198.51.100.1")}}
				res := make([]algo.Result, 1)
				if i%2 == 1 {
					ok, err := rs.Decide(context.Background(), reqs, res)
					if err != nil {
						errs <- err
					}
					if ok {
						syncAdmitted.Add(1)
					}
					continue
				}
				d := &asyncDone{errs: errs, wg: &decided}
				dones[g*each+i] = d
				if !rs.DecideAsync(reqs, res, d) {
					t.Error("DecideAsync on a standalone Redis with a budget reported false")
					decided.Done()
				}
			}
		}()
	}
	wg.Wait()
	decided.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("decision failed: %v", err)
	}
	admitted := syncAdmitted.Load()
	for _, d := range dones {
		if d != nil {
			admitted += d.admitted.Load()
		}
	}
	if admitted != limit {
		t.Errorf("%d of %d decisions admitted, want exactly the limit, %d", admitted, goroutines*each, limit)
	}
	// Nothing is told twice, late.
	time.Sleep(50 * time.Millisecond)
	for i, d := range dones {
		if d != nil && d.calls.Load() != 1 {
			t.Errorf("decision %d told %d times", i, d.calls.Load())
		}
	}
}

// TestDecideAsyncBudget: an asynchronous decision on a stalled link is
// told, once, an error wrapping context.DeadlineExceeded about its budget
// later, while its batch is still out; the store decides normally once the
// link is back, and the stalled decisions count at most once each.
func TestDecideAsyncBudget(t *testing.T) {
	srv := redistest.New(t)
	proxy := redistest.NewLatencyProxy(t, srv.Addr)
	const budget = 200 * time.Millisecond
	rs := newAsyncRedis(t, srv, proxy, budget)
	const limit = 100
	reqs := []algo.Request{{Policy: algotest.MustPolicy(t, algo.Spec{Name: "async-budget", Algorithm: algo.FixedWindow, Limit: limit, Window: time.Hour}), Key: []byte("203.0.113.10")}}
	res := make([]algo.Result, 1)
	if ok, err := rs.Decide(context.Background(), reqs, res); err != nil || !ok {
		t.Fatalf("first Decide = %v, %v; want admitted", ok, err)
	}

	proxy.Pause()
	const stalled = 20
	var told sync.WaitGroup
	told.Add(stalled)
	errs := make(chan error, stalled)
	dones := make([]*asyncDone, stalled)
	start := time.Now()
	for i := range dones {
		dones[i] = &asyncDone{errs: errs, wg: &told}
		if !rs.DecideAsync(reqs, make([]algo.Result, 1), dones[i]) {
			t.Fatal("DecideAsync reported false")
		}
	}
	told.Wait()
	elapsed := time.Since(start)
	close(errs)
	n := 0
	for err := range errs {
		n++
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a stalled decision was told %v, want an error wrapping context.DeadlineExceeded", err)
		}
	}
	if n != stalled {
		t.Errorf("%d of %d stalled decisions were told an error", n, stalled)
	}
	if elapsed > budget+time.Second {
		t.Errorf("the stalled decisions were told after %v, want about the budget (%v)", elapsed, budget)
	}
	proxy.Resume()

	failed := 0
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := rs.Decide(context.Background(), reqs, res)
		if err == nil && ok {
			break
		}
		failed++
		if time.Now().After(deadline) {
			t.Fatalf("no decision within 10s of the link's return; last: %v, %v", ok, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, d := range dones {
		if d.calls.Load() != 1 {
			t.Errorf("stalled decision %d told %d times", i, d.calls.Load())
		}
	}
	consumed := limit - res[0].Remaining
	if lo, hi := int64(2), int64(2+stalled+failed); consumed < lo || consumed > hi {
		t.Errorf("the key counts %d requests, want %d to %d: the first, the last, and at most once each %d stalled and %d failed", consumed, lo, hi, stalled, failed)
	}
}

// TestDecideAsyncAllocates: an asynchronous decision, sent alone by a
// relay, allocates nothing of its own once its store's pools are warm:
// only what go-redis allocates per call.
func TestDecideAsyncAllocates(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	srv := redistest.New(t)
	rs := newAsyncRedis(t, srv, nil, 5*time.Second)
	p := algotest.MustPolicy(t, algo.Spec{Name: "async-allocs", Algorithm: algo.SlidingWindowCounter, Limit: 1 << 30, Window: time.Hour})
	reqs := []algo.Request{{Policy: p, Key: []byte("192.0.2.1")}}
	res := make([]algo.Result, 1)
	d := &signalDone{ch: make(chan error, 1)}
	decide := func() {
		if !rs.DecideAsync(reqs, res, d) {
			t.Fatal("DecideAsync reported false")
		}
		if err := <-d.ch; err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		decide()
	}
	if got := testing.AllocsPerRun(200, decide); got > goRedisAllocs {
		t.Errorf("DecideAsync allocates %v times per call, want at most go-redis's %d", got, goRedisAllocs)
	}
}

// signalDone sends what it is told.
type signalDone struct{ ch chan error }

func (d *signalDone) Decided(admitted bool, err error) {
	if err == nil && !admitted {
		err = fmt.Errorf("denied")
	}
	d.ch <- err
}

// blockingDone signals when told, and returns only once released.
type blockingDone struct{ told, release chan struct{} }

func (d *blockingDone) Decided(bool, error) {
	close(d.told)
	<-d.release
}

// TestDecideAsyncToldWithConnectionFree: an asynchronous call is told its
// outcome once its batch's connection is free again: a Done that takes
// its time (writing to a slow client) holds up no other decision.
func TestDecideAsyncToldWithConnectionFree(t *testing.T) {
	srv := redistest.New(t)
	opts, err := goredis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxRetries, opts.ContextTimeoutEnabled, opts.PoolSize = -1, true, 4
	client := goredis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	rs := New(client, Options{Prefix: srv.Prefix(t), Timeout: time.Second, Conns: 1})
	t.Cleanup(func() { _ = rs.Close() })
	p := algotest.MustPolicy(t, algo.Spec{Name: "async-free", Algorithm: algo.FixedWindow, Limit: 100, Window: time.Hour})
	d := &blockingDone{told: make(chan struct{}), release: make(chan struct{})}
	defer close(d.release)
	if !rs.DecideAsync([]algo.Request{{Policy: p, Key: []byte("a")}}, make([]algo.Result, 1), d) {
		t.Fatal("DecideAsync reported false")
	}
	<-d.told
	// The only connection is free while d is being told.
	ok, err := rs.Decide(context.Background(), []algo.Request{{Policy: p, Key: []byte("b")}}, make([]algo.Result, 1))
	if err != nil || !ok {
		t.Errorf("Decide while an asynchronous call is told = %v, %v; want admitted", ok, err)
	}
}

// runLog records, in order, what the Dones of TestDecideAsyncRun are told
// and when the runs they were told in end.
type runLog struct {
	mu     sync.Mutex
	events []string
	runs   map[*algo.Run]int
	wg     sync.WaitGroup
}

func (l *runLog) add(e string) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// runDone is a Done that can be told within a run, and leaves a flush to
// its end.
type runDone struct {
	log *runLog
	id  int
}

func (d *runDone) Decided(admitted bool, err error) {
	// Told outside a run: no flush will come.
	d.log.add(fmt.Sprintf("decided %d alone", d.id))
	d.log.wg.Done()
}

func (d *runDone) DecidedIn(run *algo.Run, admitted bool, err error) {
	d.log.mu.Lock()
	d.log.runs[run]++
	d.log.events = append(d.log.events, fmt.Sprintf("decided %d", d.id))
	d.log.mu.Unlock()
	run.Defer(runFlush{d})
}

type runFlush struct{ d *runDone }

func (f runFlush) Flush() {
	f.d.log.add(fmt.Sprintf("flushed %d", f.d.id))
	f.d.log.wg.Done()
}

// TestDecideAsyncRun: the calls of one batch are told their outcomes in
// one run (algo.Run), every one of them before the run ends, and the run
// ends once, flushing what each deferred.
func TestDecideAsyncRun(t *testing.T) {
	srv := redistest.New(t)
	proxy := redistest.NewLatencyProxy(t, srv.Addr)
	opts, err := goredis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.Addr, opts.MaxRetries, opts.ContextTimeoutEnabled, opts.PoolSize = proxy.Addr, -1, true, 4
	client := goredis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	rs := New(client, Options{Prefix: srv.Prefix(t), Timeout: 5 * time.Second, Conns: 1, MaxBatch: 16})
	t.Cleanup(func() { _ = rs.Close() })
	if err := rs.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := algotest.MustPolicy(t, algo.Spec{Name: "async-run", Algorithm: algo.FixedWindow, Limit: 100, Window: time.Hour})
	// The first call holds the only connection, its reply held by the
	// proxy; the five after it queue meanwhile and go in one batch once
	// it is back.
	proxy.Pause()
	first := &asyncDone{wg: new(sync.WaitGroup)}
	first.wg.Add(1)
	if !rs.DecideAsync([]algo.Request{{Policy: p, Key: []byte("first")}}, make([]algo.Result, 1), first) {
		t.Fatal("DecideAsync reported false")
	}
	for deadline := time.Now().Add(5 * time.Second); rs.slots.free() > 0 || len(rs.queue) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first call was not sent")
		}
	}
	const n = 5
	log := &runLog{runs: map[*algo.Run]int{}}
	log.wg.Add(n) // done when flushed, or told alone
	for i := range n {
		d := &runDone{log: log, id: i}
		if !rs.DecideAsync([]algo.Request{{Policy: p, Key: []byte(fmt.Sprint("k", i))}}, make([]algo.Result, 1), d) {
			t.Fatal("DecideAsync reported false")
		}
	}
	proxy.Resume()
	first.wg.Wait()
	told := make(chan struct{})
	go func() { log.wg.Wait(); close(told) }()
	select {
	case <-told:
	case <-time.After(10 * time.Second):
		log.mu.Lock()
		defer log.mu.Unlock()
		t.Fatalf("not every call was told and flushed: %v", log.events)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.runs) != 1 {
		t.Fatalf("the batch's calls were told in %d runs (%v); want one", len(log.runs), log.events)
	}
	for i, e := range log.events {
		if want := i >= n; strings.HasPrefix(e, "flushed") != want {
			t.Fatalf("events %v: want every call told, then every flush", log.events)
		}
	}
}
