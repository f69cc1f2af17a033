package algo

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryOptions configures a Memory store. The zero value is usable.
type MemoryOptions struct {
	// MaxKeys bounds the number of (policy, key) states kept. When the
	// store as a whole holds MaxKeys states, a new key takes the place of
	// a state that is back to full quota (expired: it reads the same as no
	// state), and if there is none, the new key is refused: its decision
	// is denied as limited, with RetryAfter until the soonest state known
	// to expire does, and Refused counts it. A state that still limits is
	// never evicted, so a full store never hands anyone a fresh quota.
	// Default DefaultMemoryMaxKeys.
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
	refused atomic.Int64 // new keys refused by a full store
	evicted atomic.Int64 // expired states removed to make room

	regMu    sync.RWMutex
	ids      map[Identity]uint32
	policies []*Policy // by id: the latest of that identity

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type shard struct {
	mu   sync.Mutex
	m    map[stateKey]*entry    // by the hash of the memory key
	logs map[stateKey]*entryLog // sliding window logs, likewise
	// exp holds every state and log of the shard once, as a min-heap by
	// expiry. An item's time is never later than its state's expiry as
	// long as the clock does not step back (a decision only pushes a
	// state's expiry later); an item found due whose state is not yet
	// expired is put back at the state's expiry. Finding expired state is
	// then logarithmic, not a scan of the shard.
	exp []expiring
	// deleted counts the states and logs removed since the maps were
	// last rebuilt: Go maps never shrink, and under churn their tables
	// keep splitting though the number of states stays bounded.
	deleted int
	_       [32]byte // keep neighbouring shards' locks off one cache line
}

// expiring is an item of a shard's expiry heap: a state's or log's key and
// a time no later than its expiry.
type expiring struct {
	at int64
	h  stateKey
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
		ids:     map[Identity]uint32{},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	for i := range m.shards {
		m.shards[i].m = make(map[stateKey]*entry)
		m.shards[i].logs = make(map[stateKey]*entryLog)
	}
	if opts.SweepInterval > 0 {
		go m.sweepEvery(opts.SweepInterval)
	} else {
		close(m.done)
	}
	return m
}

// memKey is a state's memory key: the policy's id in this store, then the
// key tag, and its hash. It lives on the stack.
type memKey struct {
	b [4 + hashedTagLen + maxPlainKey]byte
	n uint8
	h stateKey
}

func (k *memKey) bytes() []byte { return k.b[:k.n] }

func (k *memKey) id() uint32 { return binary.LittleEndian.Uint32(k.b[:4]) }

// id returns p's id in this store, registering its identity on first use:
// a policy rebuilt with other limits (a rule set reloaded) has its
// predecessor's id, so its states carry over, and the registry grows with
// identities, not with reloads. The latest policy of an identity is the one
// its states expire by.
func (m *Memory) id(p *Policy) uint32 {
	k := p.Identity()
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
	k.h.b = maphash.Bytes(m.seed2, k.bytes())
	return k.h.a & m.mask
}

// Decide implements the decision for the memory store: see the Redis
// store's Decide for the contract, which both stores share.
func (m *Memory) Decide(ctx context.Context, reqs []Request, res []Result) (bool, error) {
	if err := CheckRequests(reqs, res); err != nil {
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
	now := SinceEpoch(m.clock())
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
			p.l = sh.logs[keys[i].h]
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
	// A full store may have no room for the new states an admission
	// needs: then the request is refused before anything is consumed.
	// Room is made only by removing expired states, never one of this
	// decision's own, which it is about to write.
	if all {
		reserved := 0
		for i := range reqs {
			p := &ps[i]
			if !p.admits || p.e != nil || p.l != nil {
				continue
			}
			ok, soonest := m.reserve(shards[i], now, keys)
			switch {
			case ok:
				reserved++
			case reqs[i].Shadow:
				// An advisory policy's state is not kept; it
				// limits no one.
				p.admits = false
			default:
				m.keys.Add(-int64(reserved))
				p.admits, all = false, false
				p.o.held.Allowed, p.o.held.Reason, p.o.held.Remaining = false, ReasonLimited, 0
				wait := soonest - now
				if soonest == math.MaxInt64 {
					wait = refusedWait // no expiry known: the shards were busy
				}
				p.o.held.RetryAfter = micros(max(wait, 1))
			}
			if !all {
				break
			}
		}
	}
	// All or nothing: a denial by an enforcing policy consumes nothing
	// anywhere; an admitted request counts in every policy that allows
	// it, shadow policies included.
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
			l := &entryLog{id: k.id()}
			l.push(p.first, p.before, p.at, reqs[i].EffectiveCost())
			sh.logs[k.h] = l
			sh.push(expiring{p.at + reqs[i].Policy.window, k.h})
		case !p.isLog && p.e == nil:
			e := &entry{p.o.next, k.id()}
			sh.m[k.h] = e
			sh.push(expiring{reqs[i].Policy.expiry(&e.state), k.h})
		}
	}
	return all
}

// CheckRequests validates a decision's input for both stores.
func CheckRequests(reqs []Request, res []Result) error {
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
		if !ValidTag(q.Key) {
			return invalid("policy %q: key %.40q is not a key tag (see AppendTag)", q.Policy.spec.Name, q.Key)
		}
		// A policy may count several keys in one decision (two of
		// Envoy's descriptors under one limit), but one key once: the
		// stores read each key's state once per decision.
		for j := range reqs[:i] {
			if reqs[j].Policy == q.Policy && string(reqs[j].Key) == string(q.Key) {
				return invalid("policy %q asked twice for one key in one decision", q.Policy.spec.Name)
			}
		}
	}
	return nil
}

// refusedWait is the RetryAfter of a refused new key when the store knows of
// no state about to expire, in microseconds.
const refusedWait = 1_000_000

// reserve counts a state or log about to be added to sh. A full store
// first removes an expired one, from sh or from another shard it can lock
// without waiting (so that two inserting goroutines never wait on each
// other's shards), but none of busy, the keys of the decision asking. If
// nothing is expired, it counts a refusal and reports false, and the
// soonest expiry it saw.
func (m *Memory) reserve(sh *shard, now int64, busy []memKey) (bool, int64) {
	for n := m.keys.Load(); n < m.maxKeys; n = m.keys.Load() {
		if m.keys.CompareAndSwap(n, n+1) {
			return true, 0
		}
	}
	// The count stays: a removed state's place passes to the new one, so
	// that the count never exceeds the bound, even for a moment.
	soonest, ok := m.dropExpired(sh, now, busy, false)
	for i := 0; !ok && i < len(m.shards); i++ {
		o := &m.shards[i]
		if o == sh || !o.mu.TryLock() {
			continue
		}
		var at int64
		at, ok = m.dropExpired(o, now, busy, false)
		o.mu.Unlock()
		soonest = min(soonest, at)
	}
	if ok {
		m.evicted.Add(1)
		return true, 0
	}
	m.refused.Add(1)
	return false, soonest
}

// dropExpired removes one expired state or log of sh, which the caller
// holds locked, other than busy's, and uncounts it if uncount. It reports
// whether it did; if not, the soonest time one of sh's states may expire.
func (m *Memory) dropExpired(sh *shard, now int64, busy []memKey, uncount bool) (int64, bool) {
	var asideBuf [8]expiring
	aside := asideBuf[:0]
	defer func() {
		for _, it := range aside {
			sh.push(it)
		}
	}()
	for len(sh.exp) > 0 {
		it := sh.exp[0]
		if it.at > now {
			return it.at, false
		}
		if slices.ContainsFunc(busy, func(k memKey) bool { return k.h == it.h }) {
			aside = append(aside, sh.pop())
			continue
		}
		if e := sh.m[it.h]; e != nil {
			if at := m.policyOf(e.id).expiry(&e.state); at > now {
				sh.exp[0].at = at
				sh.down(0)
				continue
			}
			delete(sh.m, it.h)
		} else if l := sh.logs[it.h]; l != nil {
			if ts, ok := l.newest(); ok && ts+m.policyOf(l.id).window > now {
				sh.exp[0].at = ts + m.policyOf(l.id).window
				sh.down(0)
				continue
			}
			delete(sh.logs, it.h)
		} else {
			sh.pop() // no state of its own: cannot happen, counts nothing
			continue
		}
		sh.pop()
		if uncount {
			m.keys.Add(-1)
		}
		sh.deleted++
		if n := len(sh.m) + len(sh.logs); sh.deleted > max(2*n, 1024) {
			sh.rebuild()
		}
		return 0, true
	}
	return math.MaxInt64, false
}

// rebuild copies sh's maps into new ones sized to what they hold, so that
// a shard's memory follows its states, not the churn it has seen.
// (maps.Clone would not: it copies the tables as they are.)
func (sh *shard) rebuild() {
	m := make(map[stateKey]*entry, len(sh.m))
	maps.Copy(m, sh.m)
	logs := make(map[stateKey]*entryLog, len(sh.logs))
	maps.Copy(logs, sh.logs)
	sh.m, sh.logs, sh.deleted = m, logs, 0
}

// push adds it to sh's expiry heap.
func (sh *shard) push(it expiring) {
	sh.exp = append(sh.exp, it)
	for i := len(sh.exp) - 1; i > 0; {
		parent := (i - 1) / 2
		if sh.exp[parent].at <= sh.exp[i].at {
			break
		}
		sh.exp[parent], sh.exp[i] = sh.exp[i], sh.exp[parent]
		i = parent
	}
}

// pop removes and returns the heap's first item.
func (sh *shard) pop() expiring {
	it := sh.exp[0]
	last := len(sh.exp) - 1
	sh.exp[0] = sh.exp[last]
	sh.exp = sh.exp[:last]
	sh.down(0)
	return it
}

// down moves item i of the heap down to its place.
func (sh *shard) down(i int) {
	h := sh.exp
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1].at < h[c].at {
			c++
		}
		if h[i].at <= h[c].at {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// Sweep removes expired state now.
func (m *Memory) Sweep() {
	now := SinceEpoch(m.clock())
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for {
			if _, ok := m.dropExpired(sh, now, nil, true); !ok {
				break
			}
		}
		sh.mu.Unlock()
	}
}

// Refused returns how many new keys a full store has refused.
func (m *Memory) Refused() int64 { return m.refused.Load() }

// Evicted returns how many expired states a full store has removed to make
// room for new keys (the sweeper's removals are not counted).
func (m *Memory) Evicted() int64 { return m.evicted.Load() }

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
