// Package membudget bounds the memory that clients make authlimit hold
// for requests it has not finished reading or answering, across every
// connection of every port together: header blocks and gRPC messages
// that are still arriving, the streams they open, the buffers a request
// is read into. A per-connection bound alone lets a client multiply it by
// the connections it opens; a process-wide one does not.
//
// Each connection is a Holder. It takes bytes before it holds them, and
// gives them back when it lets go of them. Beyond the budget, the holder
// of the most bytes is evicted (its evict function closes its
// connection) when its bytes cover the request for room, so that the
// client whose request waits for room, a proxy's small auth request as a
// rule, is served, and the one hoarding is cut off; when no holder holds
// that much, the request for room is refused. A client that holds many
// unfinished requests, or large ones, is the one that goes.
package membudget

import (
	"sync"
	"sync/atomic"
)

// Budget is a process-wide bound on held bytes. A nil *Budget bounds
// nothing.
type Budget struct {
	limit int64
	used  atomic.Int64
	// evicting is the bytes of evicted holders not yet given back: they
	// are on their way out, and room already promised to others.
	evicting atomic.Int64
	peak     atomic.Int64

	evictions atomic.Int64
	evicted   atomic.Int64 // bytes the evicted held
	refusals  atomic.Int64

	mu      sync.Mutex
	holders map[*Holder]struct{}
}

// New returns a budget of limit bytes (limit ≤ 0: no budget, and New
// returns nil).
func New(limit int64) *Budget {
	if limit <= 0 {
		return nil
	}
	return &Budget{limit: limit, holders: map[*Holder]struct{}{}}
}

// Holder is one connection's share of a budget. Take and Give may be
// called from any goroutine.
type Holder struct {
	b       *Budget
	held    atomic.Int64
	evict   func()
	evicted atomic.Bool
	// pending is the part of held counted in b.evicting.
	pending atomic.Int64
	closed  atomic.Bool
}

// Holder returns a holder in b for one connection. evict, called at most
// once and never while the budget's own lock is released to the caller,
// must end the connection's unfinished requests without blocking (close
// its socket, say); the connection then gives back what it held, and
// Closes the holder. A nil budget returns a nil *Holder, which takes
// everything.
func (b *Budget) Holder(evict func()) *Holder {
	if b == nil {
		return nil
	}
	h := &Holder{b: b, evict: evict}
	b.mu.Lock()
	b.holders[h] = struct{}{}
	b.mu.Unlock()
	return h
}

// SmallTake is the most bytes a Take may have of the room an eviction
// under way promises: an auth request's. The bytes of an evicted
// connection are still held until it has closed; a small request is let
// in meanwhile, a larger one waits until they are given back.
const SmallTake = 64 << 10

// Take reserves n bytes for h, and reports whether it may hold them. A
// holder that was evicted takes nothing more.
func (h *Holder) Take(n int64) bool {
	if h == nil || n <= 0 {
		return true
	}
	if h.evicted.Load() || h.closed.Load() {
		return false
	}
	b := h.b
	// Without evictions under way, a take that fits needs no lock. The
	// room evictions promise is handed out under the lock alone (see
	// makeRoom): a take that read it here could miss the bytes another
	// take was given from the same eviction, and both would have them.
	if used := b.used.Add(n); used <= b.limit && b.evicting.Load() == 0 {
		b.notePeak(used)
		return h.hold(n)
	}
	b.used.Add(-n)
	return h.makeRoom(n)
}

// room reports whether used bytes, n of them just taken, fit: the bytes
// of evictions under way count for a large take, not for a small one.
func (b *Budget) room(used, n int64) bool {
	if n <= SmallTake {
		used -= b.evicting.Load()
	}
	return used <= b.limit
}

// hold adds n bytes, already counted in b.used, to what h holds; if h
// closed meanwhile, it gives them back (Close gave back what it found).
func (h *Holder) hold(n int64) bool {
	h.held.Add(n)
	if h.closed.Load() {
		h.Give(n)
		return false
	}
	return true
}

func (b *Budget) notePeak(used int64) {
	for {
		p := b.peak.Load()
		if used <= p || b.peak.CompareAndSwap(p, used) {
			return
		}
	}
}

// makeRoom evicts the holder of the most bytes, if it holds at least n,
// and then lets h hold n bytes, unless h was that holder.
func (h *Holder) makeRoom(n int64) bool {
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	// Another eviction may have made room meanwhile.
	if used := b.used.Add(n); b.room(used, n) {
		b.notePeak(used)
		return h.hold(n)
	}
	b.used.Add(-n)
	if n > SmallTake && b.evicting.Load() > 0 {
		// Room is on its way: a large take waits for it rather than
		// evict another.
		b.refusals.Add(1)
		return false
	}
	var victim *Holder
	var most int64
	for v := range b.holders {
		if held := v.held.Load(); held > most && !v.evicted.Load() {
			victim, most = v, held
		}
	}
	if victim == nil || most < n {
		b.refusals.Add(1)
		return false
	}
	b.evictLocked(victim, most)
	if victim == h {
		// The one asking holds the most: it goes.
		b.refusals.Add(1)
		return false
	}
	b.notePeak(b.used.Add(n))
	return h.hold(n)
}

// evictLocked evicts v, which holds held bytes (b.mu held).
func (b *Budget) evictLocked(v *Holder, held int64) {
	v.evicted.Store(true)
	v.pending.Store(held)
	b.evicting.Add(held)
	b.evictions.Add(1)
	b.evicted.Add(held)
	v.evict()
}

// Give gives back n bytes h took. Once h is closed, what it held was
// given back already: Give then gives nothing.
func (h *Holder) Give(n int64) {
	if h == nil || n <= 0 {
		return
	}
	for {
		held := h.held.Load()
		m := min(n, held)
		if m <= 0 {
			return
		}
		if h.held.CompareAndSwap(held, held-m) {
			// The room an eviction promised goes before the bytes do:
			// the other way round, a take between the two would count
			// the same bytes free twice.
			if h.evicted.Load() {
				h.settle(m)
			}
			h.b.used.Add(-m)
			return
		}
	}
}

// settle takes up to n of what h gave back off b.evicting.
func (h *Holder) settle(n int64) {
	for {
		p := h.pending.Load()
		m := min(p, n)
		if m <= 0 {
			return
		}
		if h.pending.CompareAndSwap(p, p-m) {
			h.b.evicting.Add(-m)
			return
		}
	}
}

// Close gives back everything h still holds and leaves the budget: once
// its connection has closed.
func (h *Holder) Close() {
	if h == nil {
		return
	}
	b := h.b
	if h.closed.Swap(true) {
		return
	}
	b.mu.Lock()
	delete(b.holders, h)
	b.mu.Unlock()
	// As in Give: the promised room first, then the bytes.
	if p := h.pending.Swap(0); p > 0 {
		b.evicting.Add(-p)
	}
	n := h.held.Swap(0)
	b.used.Add(-n)
}

// Held is the bytes h holds.
func (h *Holder) Held() int64 {
	if h == nil {
		return 0
	}
	return h.held.Load()
}

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}

// Used is the bytes held now, by every holder together.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Peak is the most bytes held at once since New.
func (b *Budget) Peak() int64 {
	if b == nil {
		return 0
	}
	return b.peak.Load()
}

// Evictions is the number of holders evicted to make room.
func (b *Budget) Evictions() int64 {
	if b == nil {
		return 0
	}
	return b.evictions.Load()
}

// EvictedBytes is the bytes the evicted holders held, all together.
func (b *Budget) EvictedBytes() int64 {
	if b == nil {
		return 0
	}
	return b.evicted.Load()
}

// Refusals is the number of Takes refused: no holder held enough to
// evict.
func (b *Budget) Refusals() int64 {
	if b == nil {
		return 0
	}
	return b.refusals.Load()
}
