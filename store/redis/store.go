// Package redis is the Redis store: it decides the policies of package
// algo in Redis, standalone, Sentinel or Cluster, with the Lua scripts of
// package scripts, and keeps the meaning of algo's memory store, which its
// tests hold it to. It batches concurrent decisions into one script call per
// connection (or per Cluster primary), keeps its own connections for them,
// splits a Cluster decision by hash slot and refunds what one slot consumed
// when another denied.
package redis

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/scripts"
)

// Store is the Redis store. Concurrent decisions share the wire: each
// Decide queues its request; up to Conns batches are on the wire at once,
// each carrying whatever was queued when it left, in one call of
// scripts/decide.lua. A caller that finds nothing queued and a connection
// free skips the queue and its timer: it sends its request (with whatever
// was queued meanwhile) and reads the reply on its own goroutine, so at low
// load a request goes out at once, alone, with no hand-off between
// goroutines. A caller that finds a connection free behind a queue sends
// the batch itself, its own request among the others; at
// high load one write and one read carry many requests, and Redis runs one
// script for all of them, each request still decided all or nothing,
// atomically, since Redis runs a script without interleaving other
// commands. What is left queued when a batch returns goes out with the next
// caller, or with a relay goroutine.
//
// Redis Cluster runs a script only on keys of one hash slot. All keys of one
// policy and key share a slot, and so do all policies that limit the same
// key (see AppendStorageKey): 1/min + 5/h + 10/day on one phone number is
// one atomic call in a cluster too. A batch goes out as one call per slot,
// all pipelined. A request whose keys span slots (a per-IP policy with a
// global one, say) is decided by one call per slot; if one slot denies while
// another admitted, scripts/refund.lua takes the admitted slots' consumption
// back, so the request still consumes nothing; in the moment between the
// two, another request may see the briefly consumed quota. Only a cluster
// client (*goredis.ClusterClient) is split.
type Store struct {
	client  goredis.UniversalClient
	cluster *goredis.ClusterClient // nil unless client is one
	direct  *decideDialer          // the decide connections' maker; nil: go-redis's pool carries decisions
	prefix  string
	timeout time.Duration
	conns   int
	batch   int
	onLost  func(n int, err error)

	decideSHA, refundSHA string
	decideSHAArg         any             // decideSHA as a command argument, boxed once
	decideSrcArg         any             // scripts.Decide, the same
	decided              func(*slotCall) // settleSlot, bound once
	probe                *algo.Policy    // Warm's decision: cost 2 under a limit of 1
	seq                  atomic.Uint64   // request ids, from a random start

	regMu    sync.RWMutex
	ids      map[wireKey]uint16
	policies []*algo.Policy // by id

	nodeMu    sync.RWMutex
	nodes     map[string]int // cluster primary address → shard number
	nodeAddrs []string       // by shard number
	slotKeys  *slotKeys
	// The cluster's node clients by address, and when they were listed
	// (see nodeByAddr).
	nodeClients   map[string]*goredis.Client
	nodeClientsAt time.Time

	queue   chan *call
	slots   *freeWorkers  // one per connection that may carry a batch
	kick    chan struct{} // wakes the relay: calls are queued
	refunds chan []refund
	refundN chan struct{}  // callers applying refunds now (see refundNow)
	owed    sync.WaitGroup // refunds queued or being applied
	calls   sync.Pool
	tells   sync.Pool // *tellRun, for free
	stop    chan struct{}
	wg      sync.WaitGroup
	closed  sync.Once

	// clock, when set, pins the scripts' time. Only tests set it;
	// production always lets the scripts read Redis TIME.
	clock func() time.Time
	// general, when set, sends every call as a batch, never in
	// decide.lua's one-rule layout: the previous release's script reads
	// only the batch. Only tests set it.
	general bool
}

// Options configures a Store.
type Options struct {
	// Prefix starts every key, followed by a colon. Required.
	Prefix string
	// Timeout is the budget of one decision: a Decide not answered within
	// it returns an error wrapping context.DeadlineExceeded, however far
	// the batch it rides in has got. Zero leaves only ctx's deadline.
	Timeout time.Duration
	// Conns is how many batches may be on the wire at once, each on a
	// connection of its own. On a standalone or Sentinel client
	// (*goredis.Client) the store dials those connections itself, with the
	// client's dialer, credentials, database and name, and keeps them;
	// the client's pool serves Warm, Ping and probes. On a cluster each
	// batch holds pooled connections while it is out: the client's pool
	// should hold at least Conns + 4 connections per node (refunds take up
	// to 3, pings the rest). Default DefaultConns.
	Conns int
	// MaxBatch bounds the requests of one script call. Default 128.
	MaxBatch int
	// OnRefundLost is told about refunds that could not be sent after
	// retries, or that were sent and not answered, and so are not sent
	// again (Redis Cluster only): n rules may still count a request that
	// was denied. Default: nothing.
	OnRefundLost func(n int, err error)
}

// The capabilities the guard and the engine find by type assertion.
var (
	_ algo.Decider     = (*Store)(nil)
	_ algo.Resetter    = (*Store)(nil)
	_ guard.Store      = (*Store)(nil)
	_ guard.Sharded    = (*Store)(nil)
	_ guard.Prober     = (*Store)(nil)
	_ guard.Warmer     = (*Store)(nil)
	_ guard.AsyncStore = (*Store)(nil)
)

// DefaultConns is the default of Options.Conns.
const DefaultConns = 4

var (
	// errBudget is the error of a decision whose budget passed.
	errBudget = fmt.Errorf("redis decide: budget passed: %w", context.DeadlineExceeded)
	errClosed = fmt.Errorf("redis decide: %w", algo.ErrClosed)
)

// New returns a store that keeps its state in client under keys that
// start with opts.Prefix and a colon, and starts its workers. Call Warm
// before serving, and Close when done.
func New(client goredis.UniversalClient, opts Options) *Store {
	if opts.Conns <= 0 {
		opts.Conns = DefaultConns
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 128
	}
	if opts.OnRefundLost == nil {
		opts.OnRefundLost = func(int, error) {}
	}
	r := &Store{
		client:    client,
		prefix:    opts.Prefix,
		timeout:   opts.Timeout,
		conns:     opts.Conns,
		batch:     opts.MaxBatch,
		onLost:    opts.OnRefundLost,
		decideSHA: digest(scripts.Decide),
		refundSHA: digest(scripts.Refund),
		ids:       map[wireKey]uint16{},
		nodes:     map[string]int{},
		queue:     make(chan *call, 64*opts.MaxBatch),
		slots:     newFreeWorkers(opts.Conns),
		kick:      make(chan struct{}, 1),
		refunds:   make(chan []refund, 1024),
		refundN:   make(chan struct{}, refundConns),
		stop:      make(chan struct{}),
	}
	r.decideSHAArg, r.decideSrcArg, r.decided = r.decideSHA, scripts.Decide, r.settleSlot
	r.cluster, _ = client.(*goredis.ClusterClient)
	r.direct = newDecideDialer(client, r.decideSHA, scripts.Decide)
	r.probe, _ = algo.NewPolicy(algo.Spec{Name: "authlimit-probe", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Second})
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	r.seq.Store(binary.LittleEndian.Uint64(b[:]) >> 12)
	r.tells.New = func() any { return new(tellRun) }
	r.calls.New = func() any {
		c := &call{done: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
		c.timer.Stop()
		return c
	}
	// A relay per connection: calls queued by DecideAsync have no caller
	// waiting to send them, and as many batches may be on the wire at
	// once as when callers send.
	r.wg.Add(r.conns)
	for range r.conns {
		go r.relay()
	}
	if r.cluster != nil {
		r.wg.Add(1)
		go r.refundLoop()
	}
	return r
}

func digest(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// Warm makes the store ready to decide without delay: it loads the scripts
// into Redis (every primary, for a cluster) and opens every connection the
// client's pool may hold (that of every primary), so that the first burst
// of requests neither dials nor falls back from EVALSHA to EVAL; then it
// makes one decision that reads a key under the prefix and writes nothing,
// within the budget, to learn whether decisions can be made: a replica, a
// user denied the prefix, or a link slower than the budget fail it. Decide
// works without Warm.
func (r *Store) Warm(ctx context.Context) error {
	if r.cluster != nil {
		err := r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			if err := loadScripts(ctx, c); err != nil {
				return err
			}
			return r.fillPool(ctx, c)
		})
		if err != nil {
			return err
		}
	} else {
		c, ok := r.client.(*goredis.Client)
		if !ok {
			return fmt.Errorf("redis warm: unsupported client %T", r.client)
		}
		if err := loadScripts(ctx, c); err != nil {
			return err
		}
		if err := r.fillPool(ctx, c); err != nil {
			return err
		}
		if err := r.openDecideConns(ctx); err != nil {
			return err
		}
	}
	return r.probeDecision(ctx)
}

// loadScripts loads decide.lua and refund.lua into one Redis node.
func loadScripts(ctx context.Context, c *goredis.Client) error {
	for _, src := range []string{scripts.Decide, scripts.Refund} {
		if err := c.ScriptLoad(ctx, src).Err(); err != nil {
			return fmt.Errorf("load script: %w", err)
		}
	}
	return nil
}

// fillPool holds every connection a client's pool may open, each pinged,
// so the pool has dialed them all; then gives them back to it, idle. A
// full pool never dials again unless a connection breaks.
func (r *Store) fillPool(ctx context.Context, c *goredis.Client) error {
	n := c.Options().PoolSize
	held := make([]*goredis.Conn, 0, n)
	defer func() {
		for _, cn := range held {
			_ = cn.Close()
		}
	}()
	for i := 0; i < n; i++ {
		cn := c.Conn()
		held = append(held, cn)
		if err := cn.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("open connections: %w", err)
		}
	}
	return nil
}

// probeDecision decides one request that costs more than its policy ever
// admits: the script reads the policy's key, under the prefix, and writes
// nothing.
func (r *Store) probeDecision(ctx context.Context) error {
	ctx, cancel := r.withinBudget(ctx)
	defer cancel()
	if r.cluster != nil {
		sc, err := r.probeCall(ctx, []byte("probe"))
		if err != nil {
			return err
		}
		r.evalSlots(ctx, r.decideSHAArg, r.decideSrcArg, []*slotCall{sc}, nil, func(*slotCall) {})
		if sc.err != nil {
			return fmt.Errorf("probe decision: %w", sc.err)
		}
		return nil
	}
	c := &call{}
	if err := r.encode(ctx, c, []algo.Request{{Policy: r.probe, Key: []byte("probe"), Cost: 2}}); err != nil {
		return err
	}
	w := &worker{parts: []*part{&c.parts[0]}}
	w.blob = r.appendBatch(nil, w, 0)
	if err := r.evalRaw(ctx, w); err != nil {
		return fmt.Errorf("probe decision: %w", err)
	}
	return r.parseReply(w.body, w.parts, false)
}

// withinBudget returns ctx bounded by the decision budget, so that a probe
// decision fails on a link too slow for decisions, as they would.
func (r *Store) withinBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); !ok || r.timeout > 0 && time.Until(d) > r.timeout {
		return context.WithTimeout(ctx, r.timeout)
	}
	return ctx, func() {}
}

// probeCall is a cluster call of the probe decision on key's slot.
func (r *Store) probeCall(ctx context.Context, key []byte) (*slotCall, error) {
	c := &call{}
	if err := r.encode(ctx, c, []algo.Request{{Policy: r.probe, Key: key, Cost: 2}}); err != nil {
		return nil, err
	}
	w := &worker{parts: []*part{&c.parts[0]}}
	return &slotCall{blob: r.appendBatch(nil, w, scripts.FlagRefundTokens), keys: c.parts[0].appendKeys(nil), slot: c.parts[0].slot}, nil
}

// Ping reports whether Redis answers (every primary, for a cluster).
func (r *Store) Ping(ctx context.Context) error {
	if r.cluster != nil {
		return r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return c.Ping(ctx).Err()
		})
	}
	return r.client.Ping(ctx).Err()
}

// Close stops the relay; decisions still queued fail with ErrClosed. It
// closes the decide connections, once the batches on them are back, and
// not the client. It is safe to call more than once.
func (r *Store) Close() error {
	r.closed.Do(func() { close(r.stop) })
	r.wg.Wait()
	for done := false; !done; {
		select {
		case c := <-r.queue:
			r.complete(c, errClosed)
		default:
			done = true
		}
	}
	ws := r.slots.takeAll(r.conns)
	for _, w := range ws {
		w.dropConn() // and none is dialed again: the store is stopped
	}
	for _, w := range ws {
		r.slots.put(w)
	}
	return nil
}

// wireKey is what a policy sends the scripts (see appendParams), with its
// name: policies alike in it share an id. It is not the policy's identity
// (its name and algorithm, under which its state is kept): a policy rebuilt
// unchanged (a rule set reloaded) keeps its id, and the registry grows with
// the distinct policies a process has decided, not with reloads; a policy
// rebuilt with a new limit keeps its identity and its state but gets an id
// of its own, since a batch may hold a request decided under the old and
// one under the new.
type wireKey struct {
	name   string
	params algo.Params
}

func wireKeyOf(p *algo.Policy) wireKey { return wireKey{p.Name(), p.Params()} }

// id returns p's id in this store, registering it on first use.
func (r *Store) id(p *algo.Policy) (uint16, error) {
	k := wireKeyOf(p)
	r.regMu.RLock()
	id, ok := r.ids[k]
	r.regMu.RUnlock()
	if ok {
		return id, nil
	}
	r.regMu.Lock()
	defer r.regMu.Unlock()
	if id, ok := r.ids[k]; ok {
		return id, nil
	}
	if len(r.policies) > 0xffff {
		return 0, fmt.Errorf("redis decide: more than %d policies", 0xffff)
	}
	id = uint16(len(r.policies))
	r.ids[k] = id
	r.policies = append(r.policies, p)
	return id, nil
}

func (r *Store) policy(id uint16) *algo.Policy {
	r.regMu.RLock()
	defer r.regMu.RUnlock()
	return r.policies[id]
}

// Decide evaluates reqs as one request: every policy that is not a shadow
// admits it and then every allowing policy consumes its cost, or nothing is
// consumed anywhere. It writes one Result per request into res, which must
// be at least as long as reqs, and reports whether the request is admitted.
// Each policy may appear once. An error means no decision is known: Redis
// failed, or the budget or ctx's deadline passed first (the request may
// still be decided, and consume, in Redis), or the requests were invalid
// (wrapping ErrInvalid); res is then undefined.
func (r *Store) Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error) {
	if err := algo.CheckRequests(reqs, res); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("redis decide: %w", err)
	}
	c := r.calls.Get().(*call)
	if err := r.encode(ctx, c, reqs); err != nil {
		r.calls.Put(c)
		return false, err
	}
	c.async, c.out = nil, nil
	wait := r.timeout
	if d, ok := ctx.Deadline(); ok && (wait == 0 || time.Until(d) < wait) {
		wait = time.Until(d)
	}
	c.deadline = time.Now().Add(wait)
	select {
	case <-r.stop:
		r.calls.Put(c)
		return false, errClosed
	default:
	}
	if len(r.queue) == 0 {
		if w := r.slots.take(); w != nil {
			// Nothing waits and a connection is free: this goroutine
			// sends and reads itself, with no queue, no timer and no
			// other goroutine woken. The connection's deadline is the
			// budget (ctx's deadline included; a ctx cancelled without
			// one is seen when the reply is back).
			r.alone(w, c)
			return r.finish(c, reqs, res)
		}
	}
	c.timer.Reset(wait)
	select {
	case r.queue <- c:
	default:
		// More is queued than every connection can carry in a budget.
		c.timer.Stop()
		r.calls.Put(c)
		return false, errBudget
	}
	r.lead(c.deadline)
	select {
	case <-c.done:
		c.timer.Stop()
	case <-c.timer.C:
		if c.abandon() {
			return false, errBudget
		}
		<-c.done
	case <-ctx.Done():
		c.timer.Stop()
		if c.abandon() {
			return false, fmt.Errorf("redis decide: %w", ctx.Err())
		}
		<-c.done
	}
	return r.finish(c, reqs, res)
}

// finish hands a done call's outcome to its caller, applies its refunds
// (cluster), and puts it back in the pool.
func (r *Store) finish(c *call, reqs []algo.Request, res []algo.Result) (bool, error) {
	defer r.calls.Put(c)
	if len(c.lost) > 0 {
		r.refundNow(c.lost)
	}
	if c.err != nil {
		return false, c.err
	}
	copy(res, c.res[:len(reqs)])
	return c.admitted, nil
}

// DecideAsync decides reqs as Decide does, without holding its caller:
// it queues the call, wakes a relay if a connection is free, and returns;
// d is told the outcome, once, on the goroutine that completes the call
// (whoever sends its batch, or the timer of its budget, which then wraps
// context.DeadlineExceeded), maybe before DecideAsync returns. res must
// stay untouched until then; reqs are encoded before it returns. The
// store's budget bounds the call: no context reaches it. It reports
// false, having done nothing, when it cannot decide without holding its
// caller (a Redis Cluster, or no budget): decide with Decide then.
func (r *Store) DecideAsync(reqs []algo.Request, res []algo.Result, d algo.Done) bool {
	if r.cluster != nil || r.timeout <= 0 {
		return false
	}
	if err := algo.CheckRequests(reqs, res); err != nil {
		d.Decided(false, err)
		return true
	}
	c := r.calls.Get().(*call)
	if err := r.encode(context.Background(), c, reqs); err != nil {
		r.calls.Put(c)
		d.Decided(false, err)
		return true
	}
	c.async, c.out = d, res
	c.deadline = time.Now().Add(r.timeout)
	select {
	case <-r.stop:
		r.calls.Put(c)
		d.Decided(false, errClosed)
		return true
	default:
	}
	if c.expiry == nil {
		// Made once per pooled call: its function finds the call's
		// Done in the call.
		c.expiry = time.AfterFunc(time.Hour, func() { r.expire(c) })
	}
	c.refs.Store(2)
	c.expiry.Reset(r.timeout)
	select {
	case r.queue <- c:
	default:
		// More is queued than every connection can carry in a budget.
		c.state.Store(callDone)
		r.release(c, c.expiry.Stop())
		d.Decided(false, errBudget)
		return true
	}
	if r.slots.free() > 0 {
		// A connection is free: a relay sends. Otherwise whoever frees
		// one hands the queue on (handOn).
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	return true
}

// expire gives up an asynchronous call whose budget passed, unless it was
// completed first: then it lets go of the call (see release). An
// abandoned call is put back by its batch, as a caller's is.
func (r *Store) expire(c *call) {
	d := c.async
	if c.abandon() {
		d.Decided(false, errBudget)
		return
	}
	if c.refs.Add(-1) == 0 {
		c.async, c.out = nil, nil
		r.calls.Put(c)
	}
}

// Reset deletes the state of each request's policy for its key, as if it
// had never been decided. Each key is deleted on its own, so that a Redis
// Cluster client sends each to the primary of its slot.
func (r *Store) Reset(ctx context.Context, reqs []algo.Request) error {
	for i := range reqs {
		q := &reqs[i]
		if q.Policy == nil || !algo.ValidTag(q.Key) {
			return fmt.Errorf("redis reset: request %d: %w", i, algo.ErrInvalid)
		}
		ctx, cancel := r.budget(ctx)
		err := r.client.Del(ctx, q.Policy.StorageKey(r.prefix, q.Key)).Err()
		cancel()
		if err != nil {
			return fmt.Errorf("redis reset %s: %w", q.Policy.Name(), err)
		}
	}
	return nil
}

// budget bounds ctx by the store's budget, if it has one.
func (r *Store) budget(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.timeout > 0 {
		return context.WithTimeout(ctx, r.timeout)
	}
	return context.WithCancel(ctx)
}
