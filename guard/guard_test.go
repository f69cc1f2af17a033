package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/ruleset"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

// flaky is a store in front of a memory store whose shards the test breaks:
// a broken shard fails calls with the error given, and probes of it fail.
// It stands for Redis only in how it fails; the guard's decisions against
// real Redis are tested in cmd/authlimit and e2e.
type flaky struct {
	mem    *algo.Memory
	mu     sync.Mutex
	broken map[int]error
	calls  int
	probes int

	probeTakes        time.Duration // how long a probe takes
	inFlight, maxBusy int           // probes under way, and the most at once
}

func (f *flaky) shard(q *algo.Request) int { return int(q.Key[0]) % 2 }

func (f *flaky) Shards(dst []int, reqs []algo.Request) []int {
	for i := range reqs {
		s := f.shard(&reqs[i])
		found := false
		for _, d := range dst {
			found = found || d == s
		}
		if !found {
			dst = append(dst, s)
		}
	}
	return dst
}

func (f *flaky) Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error) {
	f.mu.Lock()
	f.calls++
	var err error
	var failed []int
	for i := range reqs {
		if e := f.broken[f.shard(&reqs[i])]; e != nil {
			err = e
			failed = append(failed, f.shard(&reqs[i]))
		}
	}
	f.mu.Unlock()
	if err != nil {
		return false, &algo.ShardError{Shards: failed, Err: err}
	}
	return f.mem.Decide(ctx, reqs, res)
}

func (f *flaky) Probe(_ context.Context, shard int) error {
	f.mu.Lock()
	f.probes++
	f.inFlight++
	f.maxBusy = max(f.maxBusy, f.inFlight)
	takes := f.probeTakes
	f.mu.Unlock()
	time.Sleep(takes)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	return f.broken[shard]
}

func (f *flaky) breakShard(s int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.broken, s)
	} else {
		f.broken[s] = err
	}
}

var (
	errTimeout = fmt.Errorf("redis decide: %w", context.DeadlineExceeded)
	errDown    = fmt.Errorf("redis decide: %w: refused", algo.ErrUnreachable)
)

// asyncFlaky is flaky deciding asynchronously, as the Redis store does: the
// outcome is told on a goroutine of its own.
type asyncFlaky struct{ *flaky }

func (f asyncFlaky) DecideAsync(reqs []algo.Request, res []algo.Result, d algo.Done) bool {
	go func() { d.Decided(f.Decide(context.Background(), reqs, res)) }()
	return true
}

// doneChan is a Done that sends what it is told.
type doneChan chan [2]any

func (c doneChan) Decided(ok bool, err error) { c <- [2]any{ok, err} }

type fixture struct {
	async    bool // decide with DecideAsync, the store with asyncFlaky
	startErr error
	g        *Guard
	store    *flaky
	local    *algo.Memory
	reg      *prometheus.Registry
	p        *algo.Policy
	rules    *ruleset.Holder
}

func newFixture(t *testing.T, mode FailMode, opts ...func(*Options)) *fixture {
	t.Helper()
	return buildFixture(t, false, mode, opts...)
}

// modes are the ways a fixture decides: Decide, and DecideAsync on a
// store that decides asynchronously.
var modes = []struct {
	name  string
	async bool
}{{"sync", false}, {"async", true}}

func buildFixture(t *testing.T, async bool, mode FailMode, opts ...func(*Options)) *fixture {
	t.Helper()
	mem := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	local := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close(); _ = local.Close() })
	p, err := algo.NewPolicy(algo.Spec{Name: "p", Algorithm: algo.FixedWindow, Limit: 10, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{async: async, store: &flaky{mem: mem, broken: map[int]error{}}, local: local, reg: prometheus.NewRegistry(), p: p,
		rules: rulesettest.Holder(t, nil, p)}
	var store Store = f.store
	if async {
		store = asyncFlaky{f.store}
	}
	o := Options{
		Store: store, Remote: true, FailMode: mode, Local: local, Rules: f.rules, LocalDivisor: 2,
		BreakerFailures: 3, BreakerBackoff: 10 * time.Millisecond, BreakerMaxBackoff: 40 * time.Millisecond,
		ProbeTimeout: time.Second, DenyCacheSize: 100, Registry: f.reg,
	}
	for _, fn := range opts {
		fn(&o)
	}
	if f.g, err = New(o); err != nil {
		t.Fatal(err)
	}
	f.startErr = f.g.Start(context.Background())
	t.Cleanup(f.g.Close)
	return f
}

// key 'a' is shard 1, 'b' shard 0.
func (f *fixture) decide(t *testing.T, key string) (algo.Result, bool, error) {
	t.Helper()
	var res [1]algo.Result
	reqs := []algo.Request{{Policy: f.p, Key: []byte(key)}}
	if f.async {
		c := make(doneChan, 2)
		if !f.g.DecideAsync(reqs, res[:], c) {
			t.Fatal("DecideAsync reported false")
		}
		out := <-c
		select {
		case again := <-c:
			t.Fatalf("DecideAsync told twice: %v, then %v", out, again)
		case <-time.After(time.Millisecond):
		}
		err, _ := out[1].(error)
		return res[0], out[0].(bool), err
	}
	ok, err := f.g.Decide(context.Background(), reqs, res[:])
	return res[0], ok, err
}

// admitted decides n requests of key and counts those admitted.
func (f *fixture) admitted(t *testing.T, key string, n int) int {
	t.Helper()
	got := 0
	for i := 0; i < n; i++ {
		if _, ok, err := f.decide(t, key); err == nil && ok {
			got++
		}
	}
	return got
}

func (f *fixture) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			label := mf.GetName()
			for _, l := range m.Label {
				label += "{" + l.GetName() + "=\"" + l.GetValue() + "\"}"
			}
			if label == name {
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				}
			}
		}
	}
	return 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s after 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestTimeoutsNeverAdmitWhileClosed: a call that passed its budget may have
// been decided in the store; while the circuit is closed, its request is
// answered ErrUnavailable in every fail mode, and counted as consumed in
// the local store. Only once the circuit opens does the fail mode answer.
func TestTimeoutsNeverAdmitWhileClosed(t *testing.T) {
	for _, m := range modes {
		for _, mode := range []FailMode{FailLocal, FailOpen, FailClosed} {
			t.Run(m.name+"/"+mode.String(), func(t *testing.T) {
				testTimeoutsNeverAdmitWhileClosed(t, buildFixture(t, m.async, mode), mode)
			})
		}
	}
}

func testTimeoutsNeverAdmitWhileClosed(t *testing.T, f *fixture, mode FailMode) {
	{
		{
			f.store.breakShard(1, errTimeout)
			for i := 0; i < 3; i++ {
				if _, ok, err := f.decide(t, "a"); ok || !errors.Is(err, ErrUnavailable) {
					t.Fatalf("timeout %d with the circuit closed = %v, %v; want ErrUnavailable", i+1, ok, err)
				}
			}
			res, ok, err := f.decide(t, "a")
			switch mode {
			case FailLocal:
				// Limit 10 divided by 2; the 3 timed-out requests count.
				if err != nil || !ok || res.Remaining != 5-3-1 {
					t.Errorf("fail mode local after the circuit opened = %+v, %v, %v; want admitted with 1 left", res, ok, err)
				}
			case FailOpen:
				if !ok || !errors.Is(err, ErrFailedOpen) {
					t.Errorf("fail mode open = %v, %v", ok, err)
				}
			case FailClosed:
				if ok || !errors.Is(err, ErrUnavailable) {
					t.Errorf("fail mode closed = %v, %v", ok, err)
				}
			}
			if got := f.metric(t, `authlimit_store_errors_total{kind="timeout"}`); got != 3 {
				t.Errorf("timeouts counted %v, want 3", got)
			}
		}
	}
}

// TestUnreachableOpensAtOnce: a call that was never sent (the store is
// down) opens its shard's circuit at once and takes the fail mode.
func TestUnreachableOpensAtOnce(t *testing.T) {
	f := newFixture(t, FailOpen)
	f.store.breakShard(1, errDown)
	if _, ok, err := f.decide(t, "a"); !ok || !errors.Is(err, ErrFailedOpen) {
		t.Fatalf("unreachable store, fail mode open = %v, %v; want failed open", ok, err)
	}
	calls := f.store.calls
	if _, _, err := f.decide(t, "a"); !errors.Is(err, ErrFailedOpen) {
		t.Fatal(err)
	}
	if f.store.calls != calls {
		t.Errorf("the open circuit still called the store")
	}
	if ready, detail := f.g.Ready(); !ready || !strings.Contains(detail, "degraded") {
		t.Errorf("Ready = %v %q, want ready but degraded", ready, detail)
	}
}

// TestShardsFailApart: one shard's open circuit sends only its own
// requests to the fail mode; the other shard keeps deciding in the store.
func TestShardsFailApart(t *testing.T) {
	f := newFixture(t, FailClosed)
	f.store.breakShard(1, errDown)
	if _, _, err := f.decide(t, "a"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("broken shard: %v", err)
	}
	for i := 0; i < 5; i++ {
		res, ok, err := f.decide(t, "b")
		if err != nil || !ok || res.Remaining != int64(10-i-1) {
			t.Fatalf("healthy shard, request %d = %+v, %v, %v; want the store's answer", i+1, res, ok, err)
		}
	}
	if ready, _ := f.g.Ready(); !ready {
		t.Errorf("fail mode closed with one of two shards down: not ready, want ready (degraded)")
	}
	// Each shard's circuit shows apart.
	for shard, want := range map[string]float64{"1": 2, "0": 0, "all": 0} {
		if got := f.metric(t, `authlimit_circuit_state{shard="`+shard+`"}`); got != want {
			t.Errorf("authlimit_circuit_state{shard=%q} = %v, want %v", shard, got, want)
		}
	}
	// A request that needs both shards takes the fail mode.
	p2, _ := algo.NewPolicy(algo.Spec{Name: "q", Algorithm: algo.FixedWindow, Limit: 10, Window: time.Hour})
	var res [2]algo.Result
	if _, err := f.g.Decide(context.Background(), []algo.Request{{Policy: f.p, Key: []byte("b")}, {Policy: p2, Key: []byte("a")}}, res[:]); !errors.Is(err, ErrUnavailable) {
		t.Errorf("a request spanning the broken shard = %v, want ErrUnavailable", err)
	}
}

// TestProbeClosesTheCircuitWithoutTraffic: an open circuit closes by
// itself once its shard answers a probe, with no request arriving, and the
// state gauge follows; probes back off and never run two at a time.
func TestProbeClosesTheCircuitWithoutTraffic(t *testing.T) {
	f := newFixture(t, FailLocal)
	f.store.breakShard(1, errDown)
	f.decide(t, "a")
	if got := f.metric(t, `authlimit_circuit_state{shard="1"}`); got != 2 {
		t.Fatalf("circuit state %v after an unreachable store, want 2 (open)", got)
	}
	time.Sleep(200 * time.Millisecond)
	f.store.mu.Lock()
	probes := f.store.probes
	f.store.mu.Unlock()
	// Backoff 10, 20, 40, 40, ... ms: about 6 probes in 200ms, not 20
	// (a loaded machine may run fewer, never more).
	if probes < 1 || probes > 10 {
		t.Errorf("%d probes in 200ms with backoff 10ms to 40ms", probes)
	}
	start := time.Now()
	f.store.breakShard(1, nil)
	waitFor(t, "closed", func() bool { return f.metric(t, `authlimit_circuit_state{shard="1"}`) == 0 })
	// Within the longest backoff (40ms) on a quiet machine; the bound
	// leaves a loaded one room and still tells a probe from no probe.
	if took := time.Since(start); took > time.Second {
		t.Errorf("the circuit closed %v after the store answered again, want within about the longest backoff", took)
	}
	if _, ok, err := f.decide(t, "a"); err != nil || !ok {
		t.Errorf("after the circuit closed: %v, %v", ok, err)
	}
	if ready, detail := f.g.Ready(); !ready || detail != "ready" {
		t.Errorf("Ready = %v %q", ready, detail)
	}
}

// TestOneProbeAtATime: however many circuits are open and however slow
// their probes, a replica has at most one probe under way, so a store that
// comes back is not met by a flood.
func TestOneProbeAtATime(t *testing.T) {
	f := newFixture(t, FailLocal)
	f.store.mu.Lock()
	f.store.probeTakes = 15 * time.Millisecond // longer than the first backoffs
	f.store.mu.Unlock()
	f.store.breakShard(0, errDown)
	f.store.breakShard(1, errDown)
	f.decide(t, "a") // shard 1
	f.decide(t, "b") // shard 0
	waitFor(t, "several probes", func() bool {
		f.store.mu.Lock()
		defer f.store.mu.Unlock()
		return f.store.probes >= 6
	})
	f.store.mu.Lock()
	busy := f.store.maxBusy
	f.store.mu.Unlock()
	if busy != 1 {
		t.Errorf("%d probes under way at once, want 1", busy)
	}
}

// TestReadyAgreesWithDecisions: with fail mode closed, the guard is not
// ready exactly while its decisions would be 503s.
func TestReadyAgreesWithDecisions(t *testing.T) {
	f := newFixture(t, FailClosed)
	if ready, _ := f.g.Ready(); !ready {
		t.Fatal("not ready with the store up")
	}
	f.store.breakShard(1, errDown)
	f.decide(t, "a")
	if ready, detail := f.g.Ready(); ready {
		t.Errorf("ready (%q) while every known shard answers 503", detail)
	}
	f.store.breakShard(1, nil)
	waitFor(t, "ready", func() bool { ready, _ := f.g.Ready(); return ready })
	if _, ok, err := f.decide(t, "a"); err != nil || !ok {
		t.Errorf("ready, but the decision was %v, %v", ok, err)
	}
}

// TestStartWithTheStoreDown: a store that cannot get ready at start leaves
// every circuit open until a probe succeeds.
func TestStartWithTheStoreDown(t *testing.T) {
	f := newFixture(t, FailClosed, func(o *Options) {
		o.Store = &warmer{flaky: &flaky{mem: algo.NewMemory(algo.MemoryOptions{}), broken: map[int]error{}}, err: errDown}
	})
	if !errors.Is(f.startErr, algo.ErrUnreachable) {
		t.Errorf("Start = %v, want the store's error", f.startErr)
	}
	if ready, _ := f.g.Ready(); ready {
		t.Error("ready with a store that did not warm up")
	}
	if _, _, err := f.decide(t, "b"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("decision before the store warmed up = %v, want ErrUnavailable", err)
	}
	if got := f.metric(t, `authlimit_circuit_state{shard="all"}`); got != 2 {
		t.Errorf(`authlimit_circuit_state{shard="all"} = %v before the store warmed up, want 2 (open)`, got)
	}
	w := f.g.store.(*warmer)
	w.mu.Lock()
	w.err = nil
	w.mu.Unlock()
	waitFor(t, "ready", func() bool { ready, _ := f.g.Ready(); return ready })
	if got := f.metric(t, `authlimit_circuit_state{shard="all"}`); got != 0 {
		t.Errorf(`authlimit_circuit_state{shard="all"} = %v once ready, want 0`, got)
	}
}

type warmer struct {
	*flaky
	mu  sync.Mutex
	err error
}

func (w *warmer) Warm(context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// TestMirrorKeepsTheFallbackInStep: admissions the store makes are recorded
// locally, so an outage does not hand out a fresh local quota.
func TestMirrorKeepsTheFallbackInStep(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { testMirrorKeepsTheFallbackInStep(t, buildFixture(t, m.async, FailLocal)) })
	}
}

func testMirrorKeepsTheFallbackInStep(t *testing.T, f *fixture) {
	for i := 0; i < 4; i++ {
		if _, ok, err := f.decide(t, "a"); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	f.store.breakShard(1, errDown)
	// Local limit 10/2 = 5; 4 already admitted by the store.
	if got := f.admitted(t, "a", 5); got != 1 {
		t.Errorf("the local fallback admitted %d after the store admitted 4 of its 5, want 1", got)
	}
}

// TestDenyCacheKeepsFloodsOffTheStore: a denial that waiting cures is
// answered from the cache until its retry-after passes.
func TestDenyCacheKeepsFloodsOffTheStore(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	f := newFixture(t, FailLocal, func(o *Options) {
		o.Clock = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	})
	for i := 0; i < 10; i++ {
		f.decide(t, "b")
	}
	calls := f.store.calls
	for i := 0; i < 20; i++ {
		res, ok, err := f.decide(t, "b")
		if err != nil || ok || res.RetryAfter <= 0 {
			t.Fatalf("flood: %+v %v %v", res, ok, err)
		}
	}
	if got := f.store.calls - calls; got != 1 {
		t.Errorf("20 denied requests reached the store %d times, want 1 (the first)", got)
	}
	if got := testutil.ToFloat64(f.g.metrics.denyCacheHits); got != 19 {
		t.Errorf("deny cache hits %v, want 19", got)
	}
}

// TestShardErrorsTripOnlyTheirShards: a request spanning two shards that
// fails on one opens only that one's circuit.
func TestShardErrorsTripOnlyTheirShards(t *testing.T) {
	f := newFixture(t, FailClosed)
	f.store.breakShard(1, errDown)
	p2, _ := algo.NewPolicy(algo.Spec{Name: "q", Algorithm: algo.FixedWindow, Limit: 10, Window: time.Hour})
	var res [2]algo.Result
	if _, err := f.g.Decide(context.Background(), []algo.Request{{Policy: f.p, Key: []byte("b")}, {Policy: p2, Key: []byte("a")}}, res[:]); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a request failing on one of its shards = %v, want the fail mode (closed)", err)
	}
	if _, ok, err := f.decide(t, "b"); err != nil || !ok {
		t.Errorf("the shard that answered: %v, %v; want its circuit still closed", ok, err)
	}
	if open, known := f.g.breakers.openShards(); open != 1 || known != 2 {
		t.Errorf("%d of %d circuits open, want 1 of 2", open, known)
	}
}

// TestDenyCacheTellsKeysOfOneHashApart: the deny cache finds a denial by
// its key's hash, and answers it only for its own key: a denial in the slot
// another key's hash looks in (two keys of one hash) is no answer for it.
func TestDenyCacheTellsKeysOfOneHashApart(t *testing.T) {
	c := newDenyCache(100)
	now := time.Unix(1000, 0)
	denied := algo.Result{Reason: algo.ReasonLimited, Limit: 5, RetryAfter: time.Minute, ResetAfter: time.Minute}
	a, b := []byte("198.51.100.1"), []byte("198.51.100.2")
	c.put(1, a, 1, denied, now)
	if _, ok := c.get(1, a, 1, now); !ok {
		t.Fatal("the denial is not cached")
	}
	for _, other := range []struct {
		id  uint32
		tag []byte
	}{{1, b}, {2, a}} {
		var ka, ko denyKey
		sha, ha := c.key(&ka, 1, a)
		sho, ho := c.key(&ko, other.id, other.tag)
		d := sha.m[ha]
		delete(sha.m, ha)
		sho.m[ho] = d
		if _, ok := c.get(other.id, other.tag, 1, now); ok {
			t.Errorf("policy %d key %s: answered with the denial of policy 1 key %s", other.id, other.tag, a)
		}
		delete(sho.m, ho)
		sha.m[ha] = d
	}
}

// runStore is a store that tells each asynchronous outcome within a run
// of its own, as the Redis store tells a batch's, and records it.
type runStore struct {
	*flaky
	runs chan *algo.Run
}

func (s runStore) DecideAsync(reqs []algo.Request, res []algo.Result, d algo.Done) bool {
	go func() {
		run := new(algo.Run)
		s.runs <- run
		ok, err := s.Decide(context.Background(), reqs, res)
		algo.Tell(d, run, ok, err)
		run.End()
	}()
	return true
}

// runDoneChan is a doneChan that can be told within a run: it sends the
// run it was told within.
type runDoneChan struct {
	doneChan
	runs chan *algo.Run
}

func (c runDoneChan) DecidedIn(run *algo.Run, ok bool, err error) {
	c.runs <- run
	c.doneChan <- [2]any{ok, err}
}

// TestDecideAsyncWithinRun: an outcome the store tells within a run is
// told to the caller within that run, if the caller's Done can be; any
// other Done is told as Decided tells it.
func TestDecideAsyncWithinRun(t *testing.T) {
	var rs runStore
	f := newFixture(t, FailClosed, func(o *Options) {
		rs = runStore{o.Store.(*flaky), make(chan *algo.Run, 2)}
		o.Store = rs
	})
	g := f.g
	reqs := []algo.Request{{Policy: f.p, Key: []byte("a")}}
	var res [1]algo.Result

	d := runDoneChan{make(doneChan, 1), make(chan *algo.Run, 1)}
	if !g.DecideAsync(reqs, res[:], d) {
		t.Fatal("DecideAsync reported false")
	}
	if out := <-d.doneChan; out[0] != true || out[1] != nil {
		t.Fatalf("told %v; want admitted, no error", out)
	}
	if got, want := <-d.runs, <-rs.runs; got != want {
		t.Error("the caller was told within another run than the store's")
	}

	plain := make(doneChan, 1)
	if !g.DecideAsync(reqs, res[:], plain) {
		t.Fatal("DecideAsync reported false")
	}
	<-rs.runs
	if out := <-plain; out[0] != true || out[1] != nil {
		t.Fatalf("a plain Done was told %v; want admitted, no error", out)
	}
}
