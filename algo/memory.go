package algo

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"time"
)

// MemoryOptions configures a Memory store. The zero value is usable.
type MemoryOptions struct {
	// MaxKeys bounds the number of (rule, key) states kept; when full, a
	// new key evicts the state closest to expiring among a small random
	// sample. Default 1,048,576.
	MaxKeys int
	// Shards is the number of independently locked parts, rounded up to a
	// power of two. Default 64.
	Shards int
	// SweepInterval is how often expired state is removed in the
	// background. Default 10s; negative disables the sweeper (call Sweep).
	SweepInterval time.Duration
	// Clock returns the current time. Default: the wall clock read at
	// NewMemory, advanced by the monotonic clock, which costs one clock
	// read per decision instead of time.Now's two and never steps back.
	Clock func() time.Time
}

// Memory is the in-memory store: goroutine-safe, sharded, bounded. It is
// the embedded store of a single instance, the local fallback when Redis
// fails, and the reference the Lua script is tested against.
type Memory struct {
	clock    func() time.Time
	seed     maphash.Seed
	shards   []shard
	mask     uint64
	perShard int

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type shard struct {
	mu sync.Mutex
	m  map[memKey]*state
	_  [40]byte // keep neighbouring shards' locks off one cache line
}

type memKey struct {
	rule *Rule
	key  string
}

// evictSample is how many states a full shard looks at to choose a victim.
const evictSample = 8

// maxRulesPerDecision bounds the rules in one decision for both stores.
const maxRulesPerDecision = 64

// NewMemory returns a memory store. Close it to stop its sweeper.
func NewMemory(opts MemoryOptions) *Memory {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = 1 << 20
	}
	if opts.Shards <= 0 {
		opts.Shards = 64
	}
	n := 1
	for n < opts.Shards {
		n <<= 1
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = 10 * time.Second
	}
	if opts.Clock == nil {
		start := time.Now()
		opts.Clock = func() time.Time { return start.Add(time.Since(start)) }
	}
	m := &Memory{
		clock:    opts.Clock,
		seed:     maphash.MakeSeed(),
		shards:   make([]shard, n),
		mask:     uint64(n - 1),
		perShard: max(opts.MaxKeys/n, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for i := range m.shards {
		m.shards[i].m = make(map[memKey]*state)
	}
	if opts.SweepInterval > 0 {
		go m.sweepEvery(opts.SweepInterval)
	} else {
		close(m.done)
	}
	return m
}

// ErrClosed is returned by a store used after Close.
var ErrClosed = errors.New("store closed")

// Decide implements the decision for the memory store: see Redis.Decide
// for the contract, which both stores share.
func (m *Memory) Decide(ctx context.Context, reqs []Request, res []Result) (bool, error) {
	if err := checkRequests(reqs, res); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	select {
	case <-m.stop:
		return false, ErrClosed
	default:
	}
	now := m.clock().UnixMicro()
	if len(reqs) == 1 {
		return m.decideOne(reqs[0], &res[0], now), nil
	}

	// Lock every shard the decision touches, in ascending order so that
	// concurrent decisions cannot deadlock.
	var keyBuf [8]memKey
	var shardBuf, orderBuf [8]uint64
	keys, shards := keyBuf[:0], shardBuf[:0]
	for _, q := range reqs {
		k := memKey{q.Rule, memoryTag(q.Key)}
		keys = append(keys, k)
		shards = append(shards, maphash.String(m.seed, k.key)&m.mask)
	}
	order := append(orderBuf[:0], shards...)
	slices.Sort(order)
	order = slices.Compact(order)
	for _, i := range order {
		m.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range order {
			m.shards[i].mu.Unlock()
		}
	}()

	var outBuf [8]outcome
	var stateBuf [8]*state
	out, states := outBuf[:0], stateBuf[:0]
	if len(reqs) > len(outBuf) {
		out, states = make([]outcome, 0, len(reqs)), make([]*state, 0, len(reqs))
	}
	all := true
	for i, q := range reqs {
		s := m.shards[shards[i]].m[keys[i]]
		var o outcome
		if s == nil {
			var absent state
			o = q.Rule.decide(&absent, now, q.EffectiveCost())
		} else {
			o = q.Rule.decide(s, now, q.EffectiveCost())
		}
		out, states = append(out, o), append(states, s)
		all = all && (o.held.Allowed || q.Shadow)
	}
	for i, q := range reqs {
		// All or nothing: a denial by an enforcing rule consumes
		// nothing anywhere; a request admitted counts in every rule
		// that allows it, shadow rules included.
		if !all || !out[i].held.Allowed {
			res[i] = out[i].held
			continue
		}
		s := states[i]
		if s == nil {
			s = m.shards[shards[i]].insert(keys[i], m.perShard, now)
		}
		q.Rule.commit(s, out[i].next, now, q.EffectiveCost())
		res[i] = out[i].taken
	}
	return all, nil
}

// decideOne is Decide for the common single rule: one shard, one lock.
func (m *Memory) decideOne(q Request, res *Result, now int64) bool {
	k := memKey{q.Rule, memoryTag(q.Key)}
	sh := &m.shards[maphash.String(m.seed, k.key)&m.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.m[k]
	var o outcome
	if s == nil {
		var absent state
		o = q.Rule.decide(&absent, now, q.EffectiveCost())
	} else {
		o = q.Rule.decide(s, now, q.EffectiveCost())
	}
	if !o.held.Allowed {
		*res = o.held
		return q.Shadow
	}
	if s == nil {
		s = sh.insert(k, m.perShard, now)
	}
	q.Rule.commit(s, o.next, now, q.EffectiveCost())
	*res = o.taken
	return true
}

// memoryTag is keyTag without the cost of hashing keys that need none: the
// memory store has no hash slots, only a bound on key length.
func memoryTag(key string) string {
	if plainKey(key) {
		return key
	}
	return keyTag(key)
}

// checkRequests validates a decision's input for both stores.
func checkRequests(reqs []Request, res []Result) error {
	switch {
	case len(reqs) == 0:
		return invalid("no rules to decide")
	case len(reqs) > maxRulesPerDecision:
		return invalid("%d rules in one decision; the maximum is %d", len(reqs), maxRulesPerDecision)
	case len(res) < len(reqs):
		return invalid("%d results for %d requests", len(res), len(reqs))
	}
	for i, q := range reqs {
		if q.Rule == nil {
			return invalid("request %d has no rule", i)
		}
		if q.Cost < 0 || q.Cost > MaxLimit {
			return fmt.Errorf("rule %q: cost: %w", q.Rule.spec.Name, invalid("%d is not in 1..%d", q.Cost, int64(MaxLimit)))
		}
		for _, p := range reqs[:i] {
			if p.Rule == q.Rule {
				return invalid("rule %q appears twice in one decision", q.Rule.spec.Name)
			}
		}
	}
	return nil
}

// insert adds an empty state for k, first making room within limit: it
// drops expired states among a random sample, or else the one closest to
// expiring. Go's map iteration starts at a random place, which makes the
// sample random.
func (sh *shard) insert(k memKey, limit int, now int64) *state {
	if len(sh.m) >= limit {
		var victim memKey
		soonest, seen := int64(0), 0
		for k, s := range sh.m {
			if s.expires <= now {
				delete(sh.m, k)
			} else if seen == 0 || s.expires < soonest {
				victim, soonest = k, s.expires
			}
			if seen++; seen == evictSample {
				break
			}
		}
		if len(sh.m) >= limit {
			delete(sh.m, victim)
		}
	}
	s := new(state)
	sh.m[k] = s
	return s
}

// Sweep removes expired state now.
func (m *Memory) Sweep() {
	now := m.clock().UnixMicro()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, s := range sh.m {
			if s.expires <= now {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// Len returns the number of states held.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

func (m *Memory) sweepEvery(interval time.Duration) {
	defer close(m.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Sweep()
		}
	}
}

// Ping reports whether the store can decide; a memory store always can
// until it is closed.
func (m *Memory) Ping(context.Context) error {
	select {
	case <-m.stop:
		return ErrClosed
	default:
		return nil
	}
}

// Close stops the sweeper. It is safe to call more than once.
func (m *Memory) Close() error {
	m.closeOnce.Do(func() { close(m.stop) })
	<-m.done
	return nil
}
