package algo

import "sort"

// entryLog is a sliding window log: the admitted requests of one key, oldest
// first, each with its time and the running total of costs up to and
// including it. The memory store keeps one per key; scripts/decide.lua keeps
// the same entries in a sorted set. Counting what a window holds, or finding
// the entry whose leaving frees enough, is a binary search on the totals:
// the work per decision stays logarithmic however long the log, so no
// request can make its own decision slow.
type entryLog struct {
	entries []logEntry
	head    int    // entries[:head] have left the window
	base    int64  // the running total before entries[head]
	id      uint32 // the policy's id in the memory store
}

type logEntry struct{ ts, total int64 }

// window reads the log at the window's edge (entries at or before edge have
// left): the index of the first live entry and the running total before it.
func (l *entryLog) window(edge int64) (first int, before int64) {
	live := l.entries[l.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].ts > edge })
	if i == 0 {
		return l.head, l.base
	}
	return l.head + i, live[i-1].total
}

// total is the running total of every entry.
func (l *entryLog) total() int64 {
	if len(l.entries) == l.head {
		return l.base
	}
	return l.entries[len(l.entries)-1].total
}

// newest returns the time of the latest entry, if any.
func (l *entryLog) newest() (int64, bool) {
	if len(l.entries) == l.head {
		return 0, false
	}
	return l.entries[len(l.entries)-1].ts, true
}

// freeing returns the time of the first entry from first on whose leaving,
// with all before it, frees at least need units beyond before.
func (l *entryLog) freeing(first int, before, need int64) int64 {
	live := l.entries[first:]
	i := sort.Search(len(live), func(i int) bool { return live[i].total-before >= need })
	return live[i].ts
}

// push drops the entries before first and records an admission.
func (l *entryLog) push(first int, before, ts, cost int64) {
	total := l.total()
	l.head, l.base = first, before
	if l.head == len(l.entries) {
		l.entries, l.head = l.entries[:0], 0
	} else if l.head > 32 && l.head > len(l.entries)/2 {
		n := copy(l.entries, l.entries[l.head:])
		l.entries, l.head = l.entries[:n], 0
	}
	l.entries = append(l.entries, logEntry{ts: ts, total: total + cost})
}

// decideLog computes a sliding window log's outcome at now for a request of
// the given cost. It returns the time the admission is recorded at: now, or
// the newest entry's time if the clock stepped behind it, so that entries
// stay in time order.
func (p *Policy) decideLog(l *entryLog, now, cost int64) (o outcome, first int, before, at int64) {
	W, L := p.window, p.spec.Limit
	first, before = l.window(now - W)
	n := l.total() - before
	at = now
	if ts, ok := l.newest(); ok {
		at = max(now, ts)
		if n > 0 {
			o.held.ResetAfter = micros(ts + W - now)
		}
	}
	o.held.Remaining = L - n
	switch {
	case cost > p.maxCost:
	case n+cost > L:
		// The oldest entries must leave until the request fits.
		ts := l.freeing(first, before, n+cost-L)
		o.held.RetryAfter = micros(ts + W - now)
	default:
		o.held.Allowed = true
		o.taken.Remaining = L - n - cost
		o.taken.ResetAfter = micros(at + W - now)
	}
	p.finish(&o, cost)
	return o, first, before, at
}
