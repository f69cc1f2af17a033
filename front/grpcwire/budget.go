package grpcwire

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Memory a client makes the server hold, counted in Options.Budget: each
// open stream (streamCost), the buffer its request is read into (its
// capacity), and a header block beyond what one frame holds (blockFree).
// A connection's own buffers are not counted: Options.MaxConns bounds
// those.
const (
	// streamCost is what an open stream holds besides its request's
	// bytes: the stream itself and its place in the connection's map.
	streamCost = 512
	// blockFree is the part of a header block's buffer not counted: a
	// frame's worth, which every connection may hold.
	blockFree = readFrameSize
)

// errBudget refuses a call beyond the memory budget.
var errBudget = status.New(codes.ResourceExhausted, "grpcwire: the server's memory budget for unfinished requests is spent")

// reqBytes is what has come of s's request (on the reader, or on the
// handler once the request ended).
func reqBytes(s *stream) []byte {
	if s.req == nil {
		return nil
	}
	return *s.req
}

// Request buffers come in size classes, powers of two from minBuf up to
// maxPooledReq, each class with a pool: a buffer's capacity, which the
// budget counts, is at most twice what its request asked for, and the
// buffers of a request let go of (answered, reset, or cut off with its
// connection) serve the next requests rather than wait for the collector.
// A client that makes the server evict its connections again and again
// then costs the budget, not a heap full of garbage. A request beyond
// maxPooledReq gets a buffer of its own size.
const (
	reqClasses   = 12
	maxPooledReq = minBuf << (reqClasses - 1) // 2 MiB
	// maxExact is the largest message whose buffer is made whole as soon
	// as its length is known: every auth request; a larger one grows, a
	// class at a time, as its bytes come, so that a client announcing a
	// large message and sending little of it is charged for what it
	// sent.
	maxExact = 64 << 10
)

// reqPools are the request buffers' pools, by size class.
var reqPools [reqClasses]sync.Pool

// reqClass is the size class of n bytes.
func reqClass(n int) int {
	class := 0
	for minBuf<<class < n {
		class++
	}
	return class
}

// getReq returns a request buffer of at least n bytes: a pooled one of
// its size class, or one of its own beyond maxPooledReq.
func getReq(n int) *[]byte {
	if n > maxPooledReq {
		b := make([]byte, 0, n)
		return &b
	}
	class := reqClass(n)
	if b, ok := reqPools[class].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, minBuf<<class)
	return &b
}

// putReq returns a request buffer to its pool, if it has one.
func putReq(b *[]byte) {
	n := cap(*b)
	if n > maxPooledReq || n < minBuf || n&(n-1) != 0 {
		return
	}
	*b = (*b)[:0]
	reqPools[reqClass(n)].Put(b)
}

// reserve makes room for data in s's request buffer, counted in the
// budget, and reports whether there was room (on the reader).
func (c *conn) reserve(s *stream, data []byte) bool {
	old := reqBytes(s)
	need := len(old) + len(data)
	if need <= cap(old) {
		return true
	}
	want := max(need, 2*cap(old))
	if len(old) < 5 && need >= 5 {
		var prefix [5]byte
		copy(prefix[copy(prefix[:], old):], data)
		size := int(prefix[1])<<24 | int(prefix[2])<<16 | int(prefix[3])<<8 | int(prefix[4])
		if size <= maxExact {
			want = max(need, 5+size)
		}
	}
	b := getReq(want)
	if !c.hold.Take(int64(cap(*b))) {
		putReq(b)
		return false
	}
	*b = append(*b, old...)
	if s.req != nil {
		putReq(s.req)
	}
	c.hold.Give(int64(cap(old)))
	s.req, s.charged = b, s.charged+int64(cap(*b)-cap(old))
	return true
}

// freeReq lets go of s's request: its buffer back to its pool, its bytes
// back to the budget (by whoever owns the request).
func (c *conn) freeReq(s *stream) {
	if s.req != nil {
		putReq(s.req)
		s.req = nil
	}
	c.hold.Give(s.charged)
	s.charged = 0
}

// growBlock makes room for n more bytes in the header block being
// received (after its first fragment when more), counting what lies
// beyond blockFree in the budget; false: no room (on the reader).
func (c *conn) growBlock(n int, more bool) bool {
	rd := &c.rd
	used := 0
	if more {
		used = len(rd.block)
	}
	need := used + n
	if need <= cap(rd.block) {
		return true
	}
	grown := max(need, 2*cap(rd.block))
	if charge := int64(max(grown-blockFree, 0)) - rd.blockCharged; charge > 0 {
		if !c.hold.Take(charge) {
			return false
		}
		rd.blockCharged += charge
	}
	b := make([]byte, used, grown)
	copy(b, rd.block[:used])
	rd.block = b
	return true
}

// dropBlock lets go of a header block buffer larger than a frame, once
// the block is read.
func (c *conn) dropBlock() {
	if cap(c.rd.block) > blockFree {
		c.rd.block = nil
		c.hold.Give(c.rd.blockCharged)
		c.rd.blockCharged = 0
	}
}

// evicted ends a connection the budget evicted to make room for others:
// it closes at once, and its reader gives back what it held.
func (c *conn) evicted() {
	c.srv.opts.Log.Debug("grpc connection evicted: it held the most of the memory budget", "remote", c.nc.RemoteAddr().String())
	c.closeNow()
}

// endReader lets go of the requests the reader still holds, once it has
// ended, and leaves the budget.
func (c *conn) endReader() {
	var open []*stream
	c.mu.Lock()
	for _, s := range c.sh.streams {
		if !s.rd.ended {
			open = append(open, s)
		}
	}
	c.mu.Unlock()
	for _, s := range open {
		s.rd.ended = true
		c.freeReq(s)
	}
	c.hold.Close()
}
