package algo

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryOptions configures a Memory store. The zero value is usable.
type MemoryOptions struct {
	// MaxKeys bounds the number of (policy, key) states kept. Live state
	// is evicted only when the store as a whole holds MaxKeys states: then
	// a new key takes the place of an expired state or, failing that, of
	// the state closest to expiring among a small random sample. Default
	// DefaultMemoryMaxKeys.
	MaxKeys int
	// SweepInterval is how often expired state is removed in the
	// background. Default 10s; negative disables the sweeper (call Sweep).
	SweepInterval time.Duration
	// Clock returns the current time. Default: the wall clock read at
	// NewMemory, advanced by the monotonic clock, which costs one clock
	// read per decision instead of time.Now's two and never steps back.
	Clock func() time.Time
}

// DefaultMemoryMaxKeys is the default bound of a Memory store.
const DefaultMemoryMaxKeys = 1 << 20

// Memory is the in-memory store: goroutine-safe, sharded, bounded. It is
// the embedded store of a single instance, the local fallback when Redis
// fails, and the reference the Lua script is tested against.
type Memory struct {
	clock   func() time.Time
	seed    maphash.Seed // picks the shard, and half a state's key
	seed2   maphash.Seed // the other half
	shards  []shard
	mask    uint64
	maxKeys int64
	keys    atomic.Int64 // states held, across shards

	regMu    sync.RWMutex
	ids      map[policyKey]uint32
	policies []*Policy // by id: the latest of that identity

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type shard struct {
	mu   sync.Mutex
	m    map[stateKey]*entry  // by the hash of the memory key
	logs map[string]*entryLog // sliding window logs, by memory key
	_    [32]byte             // keep neighbouring shards' locks off one cache line
}

// stateKey is a state's key in a shard: a 128-bit hash of its memory key
// (policy id and tag), two maphashes of independent random seeds. A lookup
// by it reads the map and the state: by the memory key as a string, it read
// the string as well, one more cache miss in a store of many keys, and the
// string took memory of its own. Two memory keys share a stateKey with
// probability 2^-128, and the seeds are the store's own, so no client can
// choose keys that do.
type stateKey struct{ a, b uint64 }

// entry is a state as a shard holds it, with its policy's id, which gives
// its expiry.
type entry struct {
	state
	id uint32
}

// evictSample is how many states a full store looks at to choose a victim.
const evictSample = 8

// NewMemory returns a memory store. Close it to stop its sweeper.
func NewMemory(opts MemoryOptions) *Memory {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMemoryMaxKeys
	}
	// About 4096 states a shard, up to 64 shards: few shards keep the
	// eviction sample meaningful in a small store, many keep lock
	// contention low in a large one.
	n := 1
	for n < 64 && n*4096 < opts.MaxKeys {
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
		clock:   opts.Clock,
		seed:    maphash.MakeSeed(),
		seed2:   maphash.MakeSeed(),
		shards:  make([]shard, n),
		mask:    uint64(n - 1),
		maxKeys: int64(opts.MaxKeys),
		ids:     map[policyKey]uint32{},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	for i := range m.shards {
		m.shards[i].m = make(map[stateKey]*entry)
		m.shards[i].logs = make(map[string]*entryLog)
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

// memKey is a state's memory key: the policy's id in this store, then the
// key tag, and its hash (not for logs). It lives on the stack; the logs' map
// is read with string(k.bytes()), which does not allocate.
type memKey struct {
	b [4 + hashedTagLen + maxPlainKey]byte
	n uint8
	h stateKey
}

func (k *memKey) bytes() []byte { return k.b[:k.n] }

func (k *memKey) id() uint32 { return binary.LittleEndian.Uint32(k.b[:4]) }

// policyKey identifies a policy across rule sets: its name and algorithm,
// which Redis's keys hold too. A policy rebuilt with other limits (a rule
// set reloaded) has its predecessor's id, so its states carry over, and
// the registry grows with identities, not with reloads.
type policyKey struct {
	name string
	alg  Algorithm
}

func keyOf(p *Policy) policyKey { return policyKey{p.spec.Name, p.spec.Algorithm} }

// id returns p's id in this store, registering its identity on first use.
// The latest policy of an identity is the one its states expire by.
func (m *Memory) id(p *Policy) uint32 {
	k := keyOf(p)
	m.regMu.RLock()
	id, ok := m.ids[k]
	current := ok && m.policies[id] == p
	m.regMu.RUnlock()
	if current {
		return id
	}
	m.regMu.Lock()
	defer m.regMu.Unlock()
	if id, ok := m.ids[k]; ok {
		m.policies[id] = p
		return id
	}
	id = uint32(len(m.policies))
	m.ids[k] = id
	m.policies = append(m.policies, p)
	return id
}

// policy returns the policy of a log's memory key.
func (m *Memory) policy(k string) *Policy {
	return m.policyOf(binary.LittleEndian.Uint32([]byte(k[:4])))
}

func (m *Memory) policyOf(id uint32) *Policy {
	m.regMu.RLock()
	defer m.regMu.RUnlock()
	return m.policies[id]
}

// makeKey fills k for q and returns q's shard.
func (m *Memory) makeKey(k *memKey, q *Request) uint64 {
	binary.LittleEndian.PutUint32(k.b[:4], m.id(q.Policy))
	k.n = uint8(4 + copy(k.b[4:], q.Key))
	k.h.a = maphash.Bytes(m.seed, k.bytes())
	if q.Policy.spec.Algorithm != SlidingWindowLog {
		k.h.b = maphash.Bytes(m.seed2, k.bytes())
	}
	return k.h.a & m.mask
}

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
	now := sinceEpoch(m.clock())
	if len(reqs) == 1 {
		var k memKey
		sh := &m.shards[m.makeKey(&k, &reqs[0])]
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return m.decideIn(reqs, res, now, []*shard{sh}, []memKey{k}), nil
	}

	var keyBuf [8]memKey
	var shardBuf [8]*shard
	var orderBuf [8]uint64
	keys, shards, order := keyBuf[:0], shardBuf[:0], orderBuf[:0]
	if len(reqs) > len(keyBuf) {
		keys, shards, order = make([]memKey, 0, len(reqs)), make([]*shard, 0, len(reqs)), make([]uint64, 0, len(reqs))
	}
	for i := range reqs {
		keys = append(keys, memKey{})
		s := m.makeKey(&keys[i], &reqs[i])
		shards = append(shards, &m.shards[s])
		order = append(order, s)
	}
	// Lock every shard the decision touches, in ascending order so that
	// concurrent decisions cannot deadlock.
	slices.Sort(order)
	order = slices.Compact(order)
	for _, s := range order {
		m.shards[s].mu.Lock()
	}
	defer func() {
		for _, s := range order {
			m.shards[s].mu.Unlock()
		}
	}()
	return m.decideIn(reqs, res, now, shards, keys), nil
}

// decideIn decides reqs with their shards locked: every policy decides,
// then, all or nothing, every allowing policy consumes.
func (m *Memory) decideIn(reqs []Request, res []Result, now int64, shards []*shard, keys []memKey) bool {
	type pending struct {
		o             outcome
		e             *entry
		l             *entryLog
		first         int
		before, at    int64
		admits, isLog bool
	}
	var buf [8]pending
	ps := buf[:0]
	if len(reqs) > len(buf) {
		ps = make([]pending, 0, len(reqs))
	}
	all := true
	for i := range reqs {
		q := &reqs[i]
		sh := shards[i]
		cost := q.EffectiveCost()
		var p pending
		if q.Policy.spec.Algorithm == SlidingWindowLog {
			p.isLog = true
			p.l = sh.logs[string(keys[i].bytes())]
			var empty entryLog
			l := p.l
			if l == nil {
				l = &empty
			}
			p.o, p.first, p.before, p.at = q.Policy.decideLog(l, now, cost)
		} else if p.e = sh.m[keys[i].h]; p.e == nil {
			var absent state
			p.o = q.Policy.decide(&absent, false, now, cost)
		} else {
			p.o = q.Policy.decide(&p.e.state, true, now, cost)
		}
		p.admits = p.o.held.Allowed
		all = all && (p.admits || q.Shadow)
		ps = append(ps, p)
	}
	// All or nothing: a denial by an enforcing policy consumes nothing
	// anywhere; an admitted request counts in every policy that allows
	// it, shadow policies included. States that exist are updated before
	// new ones are inserted, so that an insertion into a full store never
	// evicts a state this decision is still writing.
	for i := range reqs {
		p := &ps[i]
		if !all || !p.admits {
			res[i] = p.o.held
			continue
		}
		res[i] = p.o.taken
		switch {
		case p.isLog && p.l != nil:
			p.l.push(p.first, p.before, p.at, reqs[i].EffectiveCost())
		case !p.isLog && p.e != nil:
			p.e.state = p.o.next
		}
	}
	if !all {
		return false
	}
	for i := range reqs {
		p := &ps[i]
		if !p.admits {
			continue
		}
		sh, k := shards[i], &keys[i]
		switch {
		case p.isLog && p.l == nil:
			l := &entryLog{}
			l.push(p.first, p.before, p.at, reqs[i].EffectiveCost())
			m.makeRoom(sh, now)
			sh.logs[string(k.bytes())] = l
		case !p.isLog && p.e == nil:
			m.makeRoom(sh, now)
			sh.m[k.h] = &entry{p.o.next, k.id()}
		}
	}
	return all
}

// checkRequests validates a decision's input for both stores.
func checkRequests(reqs []Request, res []Result) error {
	switch {
	case len(reqs) == 0:
		return invalid("no policies to decide")
	case len(reqs) > MaxRules:
		return invalid("%d policies in one decision; the maximum is %d", len(reqs), MaxRules)
	case len(res) < len(reqs):
		return invalid("%d results for %d requests", len(res), len(reqs))
	}
	for i := range reqs {
		q := &reqs[i]
		if q.Policy == nil {
			return invalid("request %d has no policy", i)
		}
		if q.Cost < 0 || q.Cost > MaxLimit {
			return invalid("policy %q: cost %d is not in 1..%d", q.Policy.spec.Name, q.Cost, int64(MaxLimit))
		}
		if !validTag(q.Key) {
			return invalid("policy %q: key %.40q is not a key tag (see AppendTag)", q.Policy.spec.Name, q.Key)
		}
		for j := range reqs[:i] {
			if reqs[j].Policy == q.Policy {
				return invalid("policy %q appears twice in one decision", q.Policy.spec.Name)
			}
		}
	}
	return nil
}

// makeRoom counts a state or log about to be added to sh and, if the store
// is full, first removes one: an expired state or log of this shard among a
// random sample (Go's map iteration starts at a random place), else the one
// closest to expiring; a shard with nothing to give takes from another.
func (m *Memory) makeRoom(sh *shard, now int64) {
	if m.keys.Add(1) > m.maxKeys {
		if !m.evictFrom(sh, now) {
			m.evictElsewhere(sh, now)
		}
	}
}

// evictFrom removes one state of sh, which the caller holds locked.
func (m *Memory) evictFrom(sh *shard, now int64) bool {
	var victim stateKey
	var victimLog string
	isLog := false
	soonest, seen := int64(0), 0
	// closer counts a candidate and reports whether it expires first so far.
	closer := func(exp int64) bool {
		first := seen == 0 || exp < soonest
		if first {
			soonest = exp
		}
		seen++
		return first
	}
	enough := func() bool { return soonest <= now || seen >= evictSample }
	for h, e := range sh.m {
		if closer(m.policyOf(e.id).expiry(&e.state)) {
			victim = h
		}
		if enough() {
			break
		}
	}
	if seen == 0 || !enough() {
		for k, l := range sh.logs {
			ts, _ := l.newest()
			if closer(ts + m.policy(k).window) {
				victimLog, isLog = k, true
			}
			if enough() {
				break
			}
		}
	}
	if seen == 0 {
		return false
	}
	if isLog {
		delete(sh.logs, victimLog)
	} else {
		delete(sh.m, victim)
	}
	m.keys.Add(-1)
	return true
}

// evictElsewhere evicts from any other shard it can lock without waiting,
// so that two inserting goroutines never wait on each other's shards.
func (m *Memory) evictElsewhere(held *shard, now int64) {
	for i := range m.shards {
		sh := &m.shards[i]
		if sh == held || !sh.mu.TryLock() {
			continue
		}
		ok := m.evictFrom(sh, now)
		sh.mu.Unlock()
		if ok {
			return
		}
	}
}

// Sweep removes expired state now.
func (m *Memory) Sweep() {
	now := sinceEpoch(m.clock())
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for h, e := range sh.m {
			if m.policyOf(e.id).expiry(&e.state) <= now {
				delete(sh.m, h)
				m.keys.Add(-1)
			}
		}
		for k, l := range sh.logs {
			if ts, ok := l.newest(); !ok || ts+m.policy(k).window <= now {
				delete(sh.logs, k)
				m.keys.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// Len returns the number of states held.
func (m *Memory) Len() int { return int(m.keys.Load()) }

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
