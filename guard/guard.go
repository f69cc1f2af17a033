// Package guard decides with a store it does not trust to answer: a Guard
// implements the same Decide as the stores it wraps, and adds what a
// network store needs. It keeps a circuit breaker per shard of the store
// (one for a single Redis, one per primary of a Redis Cluster), probes an
// open circuit in the background until the shard answers again, answers
// with the fail mode while a circuit is open, keeps a local store in step
// with the shared one so that the local fallback never hands out a fresh
// quota, and remembers denials so that a flood from one client stays off the
// store.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/ruleset"
)

// Store decides the policies of one request atomically (the Redis store of
// package store/redis and algo.Memory are two). An error means no decision
// is known.
type Store interface {
	Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error)
}

// Sharded is a store made of parts that fail apart, such as the primaries
// of a Redis Cluster: Shards appends the parts a decision needs, each once.
type Sharded interface {
	Shards(dst []int, reqs []algo.Request) []int
}

// Prober is a store that can be asked whether a shard answers again.
type Prober interface {
	Probe(ctx context.Context, shard int) error
}

// Warmer is a store that gets ready to decide without delay (scripts
// loaded, connections open).
type Warmer interface {
	Warm(ctx context.Context) error
}

// FailMode is what answers while a store's circuit is open.
type FailMode uint8

// The fail modes.
const (
	FailLocal  FailMode = iota // decide with the local store
	FailOpen                   // allow
	FailClosed                 // answer 503
)

func (m FailMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return "local"
}

// ParseFailMode reads open, closed or local.
func ParseFailMode(s string) (FailMode, error) {
	for _, m := range []FailMode{FailOpen, FailClosed, FailLocal} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown fail mode %q (want open, closed or local)", s)
}

// The outcomes of Decide that are not a store's decision.
var (
	// ErrUnavailable: no decision could be made; answer 503. Decide
	// returns it with fail mode closed, and when a call that was sent
	// fails or passes its budget while the circuit is closed: the store
	// is believed healthy, the request may have been decided there, and a
	// fail mode must not admit a request whose decision merely failed, or
	// a client could gain by making its own decision slow.
	ErrUnavailable = errors.New("store unavailable")
	// ErrFailedOpen: the store cannot decide and the fail mode is open:
	// admit, with no counts to report.
	ErrFailedOpen = errors.New("store unavailable: failing open")
)

// Options configure a Guard. The caller gives every value; the defaults
// live with the configuration that reads them.
type Options struct {
	// Store decides. Required.
	Store Store
	// Remote marks Store as one that can fail (Redis): decisions go
	// through breakers and, when they are open, the fail mode. A store
	// that is not remote (the embedded memory store) is called directly.
	Remote bool
	// FailMode answers while a circuit is open.
	FailMode FailMode
	// Local is the fallback store for FailLocal, usually algo.Memory. It
	// records every admission Store makes, so it continues from what
	// this replica admitted rather than from nothing.
	Local Store
	// Rules holds the rule set in force, read once per decision: the
	// deny cache keeps its denials under the numbers the set gives its
	// policies, and forgets them all when a new set comes in (the old
	// limits decided them). A policy the set does not know is decided
	// without the deny cache. Default: none is known.
	Rules *ruleset.Holder
	// LocalDivisor is the number of replicas deciding locally at once: in
	// Local, every request costs LocalDivisor times its cost, so that each
	// replica admits at most its share of every policy and together they
	// admit at most the policy (see Guard.localRequests).
	LocalDivisor int
	// BreakerFailures consecutive failed calls open a shard's circuit.
	BreakerFailures int
	// BreakerBackoff is the time between probes of an open circuit at
	// first; it doubles per failed probe up to BreakerMaxBackoff.
	BreakerBackoff, BreakerMaxBackoff time.Duration
	// ProbeTimeout bounds one probe.
	ProbeTimeout time.Duration
	// DenyCacheSize bounds the deny cache; 0 disables it.
	DenyCacheSize int
	// Registry receives the guard's metrics.
	Registry prometheus.Registerer
	// Logger logs circuit changes.
	Logger *slog.Logger
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
}

// scratch is the memory one remote decision works in, pooled: arrays on the
// stack would escape to the heap through the calls on stores' interfaces.
type scratch struct {
	shards, ok [8]int
	reqs       [8]algo.Request
	res        [8]algo.Result
}

// Guard decides through a store that may fail. Build it with New; call
// Start before serving and Close when done.
type Guard struct {
	store    Store
	remote   bool
	sharded  Sharded
	prober   Prober
	failMode FailMode
	local    Store
	divisor  int64
	// never admits nothing: the local store asks it in place of a policy
	// that already admits the largest cost, for a request too costly for
	// a replica's share of that policy (see localRequests).
	never   *algo.Policy
	rules   *ruleset.Holder
	seen    atomic.Pointer[ruleset.Set] // the set the deny cache's denials are under
	denies  *denyCache
	metrics *metrics
	log     *slog.Logger
	clock   func() time.Time

	breakers *breakers
	scratch  sync.Pool // *scratch
	pending  sync.Pool // *pending
}

// New validates opts and returns a Guard.
func New(opts Options) (*Guard, error) {
	var errs []error
	if opts.Store == nil {
		errs = append(errs, errors.New("guard: no store"))
	}
	if opts.Remote && opts.FailMode == FailLocal && opts.Local == nil {
		errs = append(errs, errors.New("guard: fail mode local needs a local store"))
	}
	if opts.Remote && (opts.BreakerFailures < 1 || opts.BreakerBackoff <= 0 || opts.BreakerMaxBackoff < opts.BreakerBackoff || opts.ProbeTimeout <= 0) {
		errs = append(errs, fmt.Errorf("guard: breaker settings %d, %v, %v, %v are out of range", opts.BreakerFailures, opts.BreakerBackoff, opts.BreakerMaxBackoff, opts.ProbeTimeout))
	}
	if opts.LocalDivisor < 1 {
		opts.LocalDivisor = 1
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	g := &Guard{
		store:    opts.Store,
		remote:   opts.Remote,
		failMode: opts.FailMode,
		local:    opts.Local,
		divisor:  int64(opts.LocalDivisor),
		rules:    opts.Rules,
		log:      opts.Logger,
		clock:    opts.Clock,
	}
	g.scratch.New = func() any { return new(scratch) }
	g.sharded, _ = opts.Store.(Sharded)
	g.prober, _ = opts.Store.(Prober)
	never, err := algo.NewPolicy(algo.Spec{Name: "never", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Second})
	if err != nil {
		errs = append(errs, fmt.Errorf("guard: the policy that admits nothing: %w", err))
	}
	g.never = never
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if g.metrics, err = newMetrics(opts.Registry); err != nil {
		return nil, err
	}
	if opts.DenyCacheSize > 0 {
		g.denies = newDenyCache(opts.DenyCacheSize)
	}
	g.breakers = newBreakers(opts.BreakerFailures, opts.BreakerBackoff, opts.BreakerMaxBackoff, opts.ProbeTimeout, g)
	return g, nil
}

// Start gets a remote store ready (see Warmer) and starts probing. If the
// store is not ready, every circuit starts open: decisions take the fail
// mode until a probe succeeds. It returns the store's error, for the
// caller to report; it is no reason to stop.
func (g *Guard) Start(ctx context.Context) error {
	if !g.remote {
		return nil
	}
	var err error
	if w, ok := g.store.(Warmer); ok {
		err = w.Warm(ctx)
	}
	if err != nil {
		g.breakers.openAll()
	}
	g.breakers.start()
	return err
}

// Close stops probing.
func (g *Guard) Close() { g.breakers.stop() }

// Decide decides reqs as the store does, with the store's results, or, when
// the store cannot answer, with the fail mode: the local store's results,
// ErrFailedOpen or ErrUnavailable. An error wrapping algo.ErrInvalid means
// the requests were invalid.
func (g *Guard) Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error) {
	return g.decide(ctx, reqs, res, true)
}

// DecideWhole decides reqs as Decide does, but answers with every
// policy's state, never one that was not read (algo.Result.NotDecided):
// the deny cache answers a request of one policy, whose state it holds,
// and leaves one of several to the store. It is for a front that reports
// every policy's count (Envoy's rate-limit service answers each
// descriptor's limit and remaining).
func (g *Guard) DecideWhole(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error) {
	return g.decide(ctx, reqs, res, len(reqs) == 1)
}

// decide is Decide, the deny cache asked only when cached.
func (g *Guard) decide(ctx context.Context, reqs []algo.Request, res []algo.Result, cached bool) (bool, error) {
	now := g.clock()
	set := g.ruleSet()
	if cached && g.fromDenyCache(set, reqs, res, now) {
		return false, nil
	}
	if !g.remote {
		return g.decideHere(ctx, set, reqs, res, now)
	}

	sc := g.scratch.Get().(*scratch)
	defer g.scratch.Put(sc)
	shards := g.shardsOf(sc, reqs)
	if !g.breakers.allow(shards) {
		return g.failMode.decide(g, ctx, sc, reqs, res)
	}
	start := time.Now()
	ok, err := g.store.Decide(ctx, reqs, res)
	return g.settle(ctx, sc, set, shards, reqs, res, now, start, ok, err)
}

// ruleSet returns the rule set in force, nil without one. The first
// decision under a new set empties the deny cache: the previous limits
// decided its denials.
func (g *Guard) ruleSet() *ruleset.Set {
	if g.rules == nil || g.denies == nil {
		return nil
	}
	set := g.rules.Load()
	if seen := g.seen.Load(); seen != set && g.seen.CompareAndSwap(seen, set) && seen != nil {
		g.denies.clear()
	}
	return set
}

// decideHere decides with a store in this process (the embedded one),
// which never fails for want of a connection: no breaker, no fail mode.
func (g *Guard) decideHere(ctx context.Context, set *ruleset.Set, reqs []algo.Request, res []algo.Result, now time.Time) (bool, error) {
	start := time.Now()
	ok, err := g.store.Decide(ctx, reqs, res)
	g.metrics.primaryLatency.Observe(time.Since(start).Seconds())
	if err == nil {
		g.remember(set, reqs, res, now)
	}
	return ok, err
}

// shardsOf returns the shards reqs are decided on, in sc's memory: the
// store's, or the one shard of a store that has no others.
func (g *Guard) shardsOf(sc *scratch, reqs []algo.Request) []int {
	if g.sharded != nil {
		return g.sharded.Shards(sc.shards[:0], reqs)
	}
	return append(sc.shards[:0], 0)
}

// settle takes the store's answer to a remote decision through the
// breakers, the deny cache, the local store and the fail mode.
func (g *Guard) settle(ctx context.Context, sc *scratch, set *ruleset.Set, shards []int, reqs []algo.Request, res []algo.Result, now, start time.Time, ok bool, err error) (bool, error) {
	g.metrics.primaryLatency.Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
		g.breakers.success(shards)
		g.remember(set, reqs, res, now)
		if ok {
			g.mirror(ctx, sc, reqs)
		}
		return ok, nil
	case errors.Is(err, algo.ErrInvalid):
		return false, err
	}
	g.log.Debug("store failed", "err", err)
	// A decision that failed on some shards only counts against those.
	var se *algo.ShardError
	if errors.As(err, &se) {
		ok := sc.ok[:0]
		for _, s := range shards {
			if !slices.Contains(se.Shards, s) {
				ok = append(ok, s)
			}
		}
		g.breakers.success(ok)
		shards = se.Shards
	}
	switch {
	case errors.Is(err, algo.ErrUnreachable):
		// Nothing was sent, so nothing was decided or consumed, and no
		// client can cause this: the store is down. Open the circuit now
		// and answer with the fail mode.
		g.metrics.unreachable.Inc()
		g.breakers.trip(shards)
		return g.failMode.decide(g, ctx, sc, reqs, res)
	case errors.Is(err, context.DeadlineExceeded):
		g.metrics.timeouts.Inc()
		// The call may still have been decided, and consumed, in the
		// store: count it as consumed locally, so the fallback does not
		// admit what the store may have admitted.
		g.mirror(ctx, sc, reqs)
	default:
		g.metrics.errors.Inc()
	}
	g.breakers.failure(shards)
	g.metrics.unavailable.Inc()
	return false, ErrUnavailable
}

// decide answers with the fail mode.
func (m FailMode) decide(g *Guard, ctx context.Context, sc *scratch, reqs []algo.Request, res []algo.Result) (bool, error) {
	g.metrics.failMode[m].Inc()
	switch m {
	case FailOpen:
		return true, ErrFailedOpen
	case FailClosed:
		return false, ErrUnavailable
	}
	local := g.localRequests(sc.reqs[:0], reqs, false)
	start := time.Now()
	ok, err := g.local.Decide(ctx, local, res)
	g.metrics.localLatency.Observe(time.Since(start).Seconds())
	if err == nil && g.divisor > 1 {
		// Report the replica's share in the request's own units.
		for i := range reqs {
			r := &res[i]
			r.Limit = reqs[i].Policy.Capacity() / g.divisor
			r.Remaining /= g.divisor
		}
	}
	return ok, err
}

// localRequests returns reqs as the local store decides them. With a
// divisor R, a request of cost c costs c·R there: a replica then admits at
// most 1/R of what the policy admits, for every algorithm, limit and cost,
// and R replicas together at most the policy, exactly; a limit below R
// admits nothing locally. (Dividing the limit instead rounds: a limit of 3
// shared by 4 became 1 each, and a cost above the share had to be charged
// the share.) A cost whose c·R is more than the policy ever admits is too
// high on this replica; mirror, which records what the store admitted,
// charges it the whole share instead.
func (g *Guard) localRequests(dst, reqs []algo.Request, mirror bool) []algo.Request {
	for _, q := range reqs {
		if g.divisor > 1 {
			p, c := q.Policy, q.EffectiveCost()
			switch {
			case c <= p.MaxCost()/g.divisor:
				q.Cost = c * g.divisor
			case mirror:
				q.Cost = p.MaxCost()
			case p.MaxCost() < algo.MaxLimit:
				q.Cost = p.MaxCost() + 1 // cost too high, and nothing consumed
			default:
				q.Policy, q.Cost = g.never, 2
			}
		}
		dst = append(dst, q)
	}
	return dst
}

// mirror records in the local store a request the store admitted (or may
// have), so that the local store, should it decide, continues from there.
// A request the local store would deny leaves it as it is: full.
func (g *Guard) mirror(ctx context.Context, sc *scratch, reqs []algo.Request) {
	if g.failMode != FailLocal {
		return
	}
	local := g.localRequests(sc.reqs[:0], reqs, true)
	res := sc.res[:]
	if len(local) > len(res) {
		res = make([]algo.Result, len(local))
	}
	_, _ = g.local.Decide(ctx, local, res)
}

// Ready reports whether decisions come from the store, and if not, what
// answers instead. A guard whose fail mode is closed is not ready while
// every known shard's circuit is open: it could only answer 503.
func (g *Guard) Ready() (ready bool, detail string) {
	if !g.remote {
		return true, "ready"
	}
	open, known := g.breakers.openShards()
	switch {
	case open == 0:
		return true, "ready"
	case g.failMode == FailClosed && open >= known:
		return false, "not ready: the store does not answer; fail mode closed answers 503"
	case g.failMode == FailClosed:
		return true, fmt.Sprintf("degraded: %d of %d store shards do not answer; their requests get 503", open, known)
	}
	return true, fmt.Sprintf("degraded: %d of %d store shards do not answer; deciding their requests with fail mode %s", open, known, g.failMode)
}

// fromDenyCache answers from the deny cache when an enforcing policy's key
// was denied moments ago and cannot pass yet. Only the cached policy's
// answer is known; the others consumed nothing, and are reported as not
// decided (algo.Result.NotDecided): their state was not read.
func (g *Guard) fromDenyCache(set *ruleset.Set, reqs []algo.Request, res []algo.Result, now time.Time) bool {
	if set == nil {
		return false
	}
	hit := -1
	for i := range reqs {
		q := &reqs[i]
		if q.Shadow {
			continue
		}
		id, known := set.Index(q.Policy)
		if !known {
			continue
		}
		if r, ok := g.denies.get(uint32(id), q.Key, q.EffectiveCost(), now); ok {
			res[i], hit = r, i
			break
		}
	}
	if hit < 0 {
		return false
	}
	g.metrics.denyCacheHits.Inc()
	for i := range reqs {
		if i != hit {
			res[i] = algo.Result{Allowed: true, Limit: reqs[i].Policy.Capacity(), NotDecided: true}
		}
	}
	return true
}

// remember puts the store's waiting-cures denials in the deny cache.
func (g *Guard) remember(set *ruleset.Set, reqs []algo.Request, res []algo.Result, now time.Time) {
	if set == nil {
		return
	}
	for i := range reqs {
		q := &reqs[i]
		if q.Shadow || res[i].Reason != algo.ReasonLimited {
			continue
		}
		if id, known := set.Index(q.Policy); known {
			g.denies.put(uint32(id), q.Key, q.EffectiveCost(), res[i], now)
		}
	}
}

// circuitChanged reports a shard's circuit change. A store that comes back
// may have lost its state (a restart, a failover): the deny cache forgets
// what it remembered of it.
func (g *Guard) circuitChanged(shard int, from, to state) {
	g.metrics.circuitChanges[to].Inc()
	if to == stateClosed && g.denies != nil {
		g.denies.clear()
	}
	level := slog.LevelWarn
	if to == stateClosed {
		level = slog.LevelInfo
	}
	g.log.Log(context.Background(), level, "store circuit "+to.String(), "shard", shard, "from", from.String(), "fail_mode", g.failMode.String())
}

var _ Store = (*Guard)(nil)

// Peek reports what the store would decide for reqs, consuming nothing
// (see algo.Peek): it asks the store itself, past the deny cache and the
// circuits, and its error is the store's. It decides nothing, so it counts
// in no metric.
func (g *Guard) Peek(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error) {
	return algo.Peek(ctx, g.store, reqs, res)
}

// Reset forgets the state of each request's policy for its key, in the
// store and in the local store of fail mode local, and empties the deny
// cache, which would otherwise still deny what was forgotten.
func (g *Guard) Reset(ctx context.Context, reqs []algo.Request) error {
	if g.denies != nil {
		defer g.denies.clear()
	}
	for _, s := range []Store{g.store, g.local} {
		if s == nil {
			continue
		}
		r, ok := s.(algo.Resetter)
		if !ok {
			return fmt.Errorf("guard: the store %T cannot reset", s)
		}
		if err := r.Reset(ctx, reqs); err != nil {
			return err
		}
	}
	return nil
}

// AsyncStore is a store that decides without holding its caller
// (the Redis store): see store/redis's Store.DecideAsync.
type AsyncStore interface {
	DecideAsync(reqs []algo.Request, res []algo.Result, d algo.Done) bool
}

var _ algo.RunDone = (*pending)(nil)

// pending is a DecideAsync on its way through the store, pooled.
type pending struct {
	g          *Guard
	sc         *scratch
	set        *ruleset.Set
	shards     []int
	reqs       []algo.Request
	res        []algo.Result
	now, start time.Time
	d          algo.Done
}

// DecideAsync decides reqs as Decide does, telling d the outcome once,
// maybe before it returns; res must stay untouched until then. What needs
// no wait (the deny cache, a store that is not remote, an open circuit's
// fail mode) is decided on the caller's goroutine; a remote store that
// can (see AsyncStore) decides on the goroutine that completes the call.
// It reports false, having done nothing, when the decision would hold
// the caller: decide with Decide then.
func (g *Guard) DecideAsync(reqs []algo.Request, res []algo.Result, d algo.Done) bool {
	return g.decideAsync(reqs, res, d, true)
}

// DecideWholeAsync decides reqs as DecideAsync does, with every policy's
// state, as DecideWhole does.
func (g *Guard) DecideWholeAsync(reqs []algo.Request, res []algo.Result, d algo.Done) bool {
	return g.decideAsync(reqs, res, d, len(reqs) == 1)
}

// decideAsync is DecideAsync, the deny cache asked only when cached.
func (g *Guard) decideAsync(reqs []algo.Request, res []algo.Result, d algo.Done, cached bool) bool {
	as, async := g.store.(AsyncStore)
	if g.remote && !async {
		return false
	}
	now := g.clock()
	set := g.ruleSet()
	if cached && g.fromDenyCache(set, reqs, res, now) {
		d.Decided(false, nil)
		return true
	}
	ctx := context.Background()
	if !g.remote {
		d.Decided(g.decideHere(ctx, set, reqs, res, now))
		return true
	}
	sc := g.scratch.Get().(*scratch)
	shards := g.shardsOf(sc, reqs)
	if !g.breakers.allow(shards) {
		ok, err := g.failMode.decide(g, ctx, sc, reqs, res)
		g.scratch.Put(sc)
		d.Decided(ok, err)
		return true
	}
	p, _ := g.pending.Get().(*pending)
	if p == nil {
		p = &pending{g: g}
	}
	p.sc, p.set, p.shards, p.reqs, p.res, p.now, p.start, p.d = sc, set, shards, reqs, res, now, time.Now(), d
	if !as.DecideAsync(reqs, res, p) {
		*p = pending{g: g}
		g.pending.Put(p)
		g.scratch.Put(sc)
		return false
	}
	return true
}

// Decided settles the store's answer as Decide does, and tells the
// caller's Done.
// A panic is the caller's error, as Decide's would be its caller's.
func (p *pending) Decided(ok bool, err error) { p.DecidedIn(nil, ok, err) }

// DecidedIn is Decided within a run, which the caller's Done is told
// within too if it can be (see algo.Run).
func (p *pending) DecidedIn(run *algo.Run, ok bool, err error) {
	g, sc, d := p.g, p.sc, p.d
	told := false
	defer func() {
		if r := recover(); r != nil && !told {
			d.Decided(false, fmt.Errorf("guard: panic: %v", r))
		}
	}()
	ok, err = g.settle(context.Background(), sc, p.set, p.shards, p.reqs, p.res, p.now, p.start, ok, err)
	*p = pending{g: g}
	g.pending.Put(p)
	g.scratch.Put(sc)
	told = true
	algo.Tell(d, run, ok, err)
}
