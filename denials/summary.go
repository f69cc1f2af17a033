package denials

import (
	"hash/maphash"
	"net/netip"
)

// MaxTag is the longest key tag a summary keeps: algo.AppendTag makes
// plain tags of at most 64 bytes and hashed ones of 33. A longer tag is cut
// (it cannot come from the engine).
const MaxTag = 64

// entry is one key's counts in a summary.
type entry struct {
	tag    [MaxTag]byte
	tagLen uint8
	// heap is the entry's position in summary.heap.
	heap int32
	// client is the last client address denied under the key, when the
	// rule counts by address; the zero Addr otherwise.
	client netip.Addr
	// denied counts the key's denials; err is how many of them may
	// belong to keys it displaced (Space-Saving's over-estimate).
	denied, err uint64
	// admitted counts the key's admissions since it was first denied.
	admitted uint64
	// first and last are the first and last denial, Unix nanoseconds.
	first, last int64
	policy      string
}

func (e *entry) key() []byte { return e.tag[:e.tagLen] }

// summary is a Space-Saving heavy-hitter summary of one rule's denials in
// one window (Metwally, Agrawal and El Abbadi, 2005): at most len(entries)
// keys, in memory fixed when it is made. While the keys fit, every count is
// exact; once a new key displaces the least denied one, it inherits that
// count as its error, and every count is over by at most errBound. Nothing
// in it allocates after newSummary.
type summary struct {
	entries []entry
	n       int     // entries in use
	heap    []int32 // entry indexes, a min-heap by denied
	index   []int32 // open addressing, linear probing: entry index + 1; 0 is empty
	mask    uint64
	seed    maphash.Seed
	// errBound is the count of the last key displaced: no count is over
	// by more. Zero while the summary is exact.
	errBound uint64
	// displaced counts keys displaced.
	displaced uint64
}

func newSummary(size int, seed maphash.Seed) *summary {
	slots := 1
	for slots < 2*size {
		slots <<= 1
	}
	return &summary{
		entries: make([]entry, size),
		heap:    make([]int32, 0, size),
		index:   make([]int32, slots),
		mask:    uint64(slots - 1),
		seed:    seed,
	}
}

// reset empties s, keeping its memory.
func (s *summary) reset() {
	clear(s.index)
	s.heap = s.heap[:0]
	s.n, s.errBound, s.displaced = 0, 0, 0
}

// exact reports whether every count is exact: no key was displaced.
func (s *summary) exact() bool { return s.displaced == 0 }

// find returns the index of key's entry, or -1.
func (s *summary) find(key []byte) int {
	for i := maphash.Bytes(s.seed, key) & s.mask; ; i = (i + 1) & s.mask {
		x := s.index[i]
		if x == 0 {
			return -1
		}
		if e := &s.entries[x-1]; string(e.key()) == string(key) {
			return int(x - 1)
		}
	}
}

// deny counts a denial of key at now (Unix nanoseconds) and reports
// whether key was not in the summary before.
func (s *summary) deny(key []byte, client netip.Addr, policy string, now int64) bool {
	if len(key) > MaxTag {
		key = key[:MaxTag]
	}
	if i := s.find(key); i >= 0 {
		e := &s.entries[i]
		e.denied++
		e.last = max(e.last, now)
		if client.IsValid() {
			e.client = client
		}
		e.policy = policy
		s.down(int(e.heap))
		return false
	}
	var e *entry
	if s.n < len(s.entries) {
		i := s.n
		s.n++
		e = &s.entries[i]
		*e = entry{heap: int32(len(s.heap))}
		s.heap = append(s.heap, int32(i))
	} else {
		// Displace the least denied key: the new one takes its place
		// and its count, which may all be the old key's.
		i := int(s.heap[0])
		e = &s.entries[i]
		s.remove(e.key())
		s.displaced++
		s.errBound = e.denied
		*e = entry{heap: 0, denied: e.denied, err: e.denied}
	}
	e.tagLen = uint8(copy(e.tag[:], key))
	e.denied++
	e.first, e.last = now, now
	e.client, e.policy = client, policy
	s.insert(s.heap[e.heap])
	s.down(int(e.heap))
	s.up(int(e.heap))
	return true
}

// admit counts an admission of key, if the summary holds it.
func (s *summary) admit(key []byte) {
	if s.n == 0 {
		return
	}
	if i := s.find(key); i >= 0 {
		s.entries[i].admitted++
	}
}

// insert puts entry x into the index.
func (s *summary) insert(x int32) {
	key := s.entries[x].key()
	i := maphash.Bytes(s.seed, key) & s.mask
	for s.index[i] != 0 {
		i = (i + 1) & s.mask
	}
	s.index[i] = x + 1
}

// remove takes key out of the index, moving back the entries after it in
// its run so that every probe still finds them (linear probing's deletion
// without tombstones).
func (s *summary) remove(key []byte) {
	i := maphash.Bytes(s.seed, key) & s.mask
	for {
		x := s.index[i]
		if x == 0 {
			return
		}
		if string(s.entries[x-1].key()) == string(key) {
			break
		}
		i = (i + 1) & s.mask
	}
	for j := (i + 1) & s.mask; ; j = (j + 1) & s.mask {
		x := s.index[j]
		if x == 0 {
			break
		}
		home := maphash.Bytes(s.seed, s.entries[x-1].key()) & s.mask
		// The entry at j may move to i when i lies cyclically in
		// [home, j).
		if (j-home)&s.mask >= (j-i)&s.mask {
			s.index[i] = x
			i = j
		}
	}
	s.index[i] = 0
}

func (s *summary) less(a, b int) bool {
	return s.entries[s.heap[a]].denied < s.entries[s.heap[b]].denied
}

func (s *summary) swap(a, b int) {
	s.heap[a], s.heap[b] = s.heap[b], s.heap[a]
	s.entries[s.heap[a]].heap = int32(a)
	s.entries[s.heap[b]].heap = int32(b)
}

func (s *summary) up(h int) {
	for h > 0 {
		p := (h - 1) / 2
		if !s.less(h, p) {
			return
		}
		s.swap(h, p)
		h = p
	}
}

func (s *summary) down(h int) {
	n := len(s.heap)
	for {
		l := 2*h + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && s.less(r, l) {
			c = r
		}
		if !s.less(c, h) {
			return
		}
		s.swap(h, c)
		h = c
	}
}
