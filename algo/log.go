package algo

// entryLog is the memory store's sliding window log: admitted requests
// ordered by time, oldest first, the in-memory twin of the Redis sorted set.
type entryLog struct {
	entries []logEntry
	head    int // entries[:head] have left the window
}

type logEntry struct{ ts, cost int64 }

// push records an admission. Clocks normally move forward, so this appends;
// an entry from a clock that stepped back is inserted in order, as the
// sorted set would.
func (l *entryLog) push(ts, cost int64) {
	l.entries = append(l.entries, logEntry{ts, cost})
	for i := len(l.entries) - 1; i > l.head && l.entries[i-1].ts > ts; i-- {
		l.entries[i], l.entries[i-1] = l.entries[i-1], l.entries[i]
	}
}

// dropThrough removes the entries at or before t and returns their total
// cost.
func (l *entryLog) dropThrough(t int64) (freed int64) {
	for l.head < len(l.entries) && l.entries[l.head].ts <= t {
		freed += l.entries[l.head].cost
		l.head++
	}
	if l.head == len(l.entries) {
		l.entries, l.head = l.entries[:0], 0
	} else if l.head > 32 && l.head > len(l.entries)/2 {
		n := copy(l.entries, l.entries[l.head:])
		l.entries, l.head = l.entries[:n], 0
	}
	return freed
}

// newest returns the time of the latest entry; the log must not be empty.
func (l *entryLog) newest() int64 { return l.entries[len(l.entries)-1].ts }

// freeing returns the time of the entry whose leaving, with all entries
// before it, frees at least need units.
func (l *entryLog) freeing(need int64) (int64, bool) {
	var freed int64
	for _, e := range l.entries[l.head:] {
		if freed += e.cost; freed >= need {
			return e.ts, true
		}
	}
	return 0, false
}
