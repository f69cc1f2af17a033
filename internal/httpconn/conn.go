package httpconn

import (
	"bytes"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/authlimit/authlimit/internal/membudget"
)

// Conn is a served connection. It tells whether it ever sent a byte, and
// refuses a request whose header block ends in bare line feeds ("GET /
// HTTP/1.1\nHost: x\n\n"): fasthttp looks for CRLF CRLF alone, and would
// wait for it until the read timeout answered 408. RFC 9112 lets a server
// refuse such a request; fasthttp then answers 400 and closes.
type Conn struct {
	net.Conn
	l      *Listener
	state  atomic.Int32      // connSilent, then connSpoke or connShut
	linger atomic.Bool       // the last answer went to a request not read whole (see Close)
	holder *membudget.Holder // the connection's share of the listener's budget

	// Read and Write run on the connection's one serving goroutine: the
	// fields below need no lock.
	ahead    []byte           // bytes read from the socket that fasthttp has not asked for yet
	aheadBuf *[aheadSize]byte // ahead's pooled buffer, held while ahead is not empty
	aheadErr error            // the error of the read that filled ahead, for once it is drained
	scanning bool             // the bytes read since the last answer may start a header block
	head     []byte           // those bytes, while the block has not ended
	headBuf  *[]byte          // head's pooled buffer
	refused  bool             // a header block ended in bare line feeds
	busy     bool             // a request's bytes came, its answer is not written yet
	whole    bool             // a handler took the request whole (see Whole)
	start    time.Time        // the first byte of the last request; before one, the accept
	held     int64            // bytes the unfinished request holds in the budget (see take)
}

const (
	connSilent int32 = iota // no byte read yet
	connSpoke               // a byte read: it carries, or carried, a request
	connShut                // closed by shutdown while silent
)

// ErrBareLF refuses a header block that ends in bare line feeds.
var ErrBareLF = errors.New("header block ends in bare line feeds; HTTP/1.1 wants CRLF")

// ErrBudget ends a connection whose unfinished request found no room in
// the memory budget.
var ErrBudget = errors.New("no room in the memory budget for an unfinished request")

// aheadSize is the buffer a read for fewer bytes reads into (see
// Conn.Read): a proxy's auth subrequest, headers and all, fits.
const aheadSize = 4 << 10

// Read reads the request bytes, within the connection's timeouts.
//
// fasthttp, with ReduceMemoryUsage, waits for a request's first byte
// with a read of one byte, then reads the rest into a buffer taken for
// the request: two reads from the socket for one request that came at
// once. A read for fewer than aheadSize bytes reads up to aheadSize into a
// pooled buffer instead and hands the bytes over from there; the buffer
// goes back to the pool once they are all handed over, so that a waiting
// connection holds none.
func (c *Conn) Read(p []byte) (int, error) {
	if len(c.ahead) == 0 && c.aheadErr == nil {
		if c.refused {
			return 0, ErrBareLF
		}
		if len(p) >= aheadSize || len(p) == 0 {
			return c.readSocket(p)
		}
		buf := c.l.ahead.Get().(*[aheadSize]byte)
		n, err := c.readSocket(buf[:])
		if n <= len(p) {
			c.l.ahead.Put(buf)
			return copy(p, buf[:n]), err
		}
		c.ahead, c.aheadBuf, c.aheadErr = buf[:n], buf, err
	}
	n := copy(p, c.ahead)
	c.ahead = c.ahead[n:]
	if len(c.ahead) > 0 {
		return n, nil
	}
	err := c.aheadErr
	c.aheadErr = nil
	if c.aheadBuf != nil {
		c.l.ahead.Put(c.aheadBuf)
		c.ahead, c.aheadBuf = nil, nil
	}
	return n, err
}

// readSocket reads from the socket, within the connection's timeouts,
// and looks at what it read for the end of a header block.
//
// The deadline set on the socket is never later than the one the
// connection has now, nor than any it can have later: a request's read
// deadline is its first byte plus the read timeout, so one set at time t
// is at most t plus the read timeout. When that deadline passes first,
// readSocket sets the next and reads on; a busy connection does so about
// once a read timeout, not once a request.
func (c *Conn) readSocket(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	// A read of nothing without an error (an empty write into an
	// in-memory pipe) is read again: fasthttp, waiting for a request's
	// first byte with ReduceMemoryUsage, takes it for a broken reader.
	for n == 0 && len(p) > 0 && (err == nil || IsTimeout(err) && c.extend(c.Conn.SetReadDeadline, c.readDeadline(), c.l.cfg.Timeouts.Read)) {
		n, err = c.Conn.Read(p)
	}
	if n == 0 && err != nil {
		// The connection is done with: its kept head goes back now,
		// as Close may be called from another goroutine.
		c.dropHead()
	}
	if n > 0 {
		if !c.busy {
			c.busy, c.whole, c.start = true, false, time.Now()
		}
		c.state.CompareAndSwap(connSilent, connSpoke)
		refused, ok := false, c.take(n)
		if ok && c.scanning {
			refused, ok = c.bareLF(p[:n])
		}
		if !ok {
			_ = c.Conn.Close()
			c.dropHead()
			return 0, ErrBudget
		}
		if refused {
			c.refused = true
			return n, ErrBareLF
		}
	}
	return n, err
}

// take counts n bytes more, just read, in what the unfinished request
// holds in the budget, and reports whether they found room. The first
// bytes of a request also count the read buffer fasthttp takes for it
// then (Config.MaxHeader, its size): a connection that sent one byte of a
// request holds that much. The bytes are held until the request is whole
// (see Whole) or answered: a client that never finishes its requests is
// the one whose connections the budget closes when others need room.
func (c *Conn) take(n int) bool {
	m := int64(n)
	if c.held == 0 {
		m += int64(c.l.cfg.MaxHeader)
	}
	return c.charge(m)
}

// charge counts m bytes more in what the unfinished request holds.
func (c *Conn) charge(m int64) bool {
	if c.holder == nil {
		return true
	}
	if !c.holder.Take(m) {
		return false
	}
	c.held += m
	return true
}

// settle gives back what the request held in the budget.
func (c *Conn) settle() {
	if c.held > 0 {
		c.holder.Give(c.held)
		c.held = 0
	}
}

// evict ends the connection when the budget needs its bytes for another's
// request: its serving goroutine's read fails, and fasthttp closes it.
func (c *Conn) evict() { _ = c.Conn.Close() }

// Whole tells the connection nc (a *Conn; any other is left alone) that
// its request has been read whole: a handler calls it first, so that a
// request it holds (a shaping delay, say) holds nothing in the budget
// meanwhile. It must be called on the connection's serving goroutine.
func Whole(nc net.Conn) {
	if c, ok := nc.(*Conn); ok {
		c.whole = true
		c.settle()
	}
}

// continueLine starts the interim answer to "Expect: 100-continue", after
// which the same request's body comes.
var continueLine = []byte("HTTP/1.1 100 ")

// Write writes an answer, within the connection's timeouts.
func (c *Conn) Write(p []byte) (int, error) {
	// An answer ends its request: what is read next starts another. (A
	// pipelined request fasthttp read before this answer is not looked
	// at: no proxy pipelines, and such a one still gets its 408.)
	if !bytes.HasPrefix(p, continueLine) {
		if c.busy {
			// The answer's first write. A request no handler took
			// whole (see Whole) is answered by fasthttp itself, 408,
			// 400 or 431, and the connection closed while the client
			// may still be sending it.
			c.linger.Store(!c.whole)
		}
		c.scanning, c.busy = true, false
		c.dropHead()
		c.settle()
	}
	t := c.l.cfg.Timeouts
	n, err := c.Conn.Write(p)
	for n < len(p) && IsTimeout(err) && c.extend(c.Conn.SetWriteDeadline, c.writeDeadline(), t.Read+t.Write) {
		var m int
		m, err = c.Conn.Write(p[n:])
		n += m
	}
	return n, err
}

// readDeadline is when the connection's wait for bytes ends: a request's
// read timeout after its first byte (or the connection's accept), or
// between requests the idle timeout after the last one's first byte.
func (c *Conn) readDeadline() time.Time {
	if c.busy || c.state.Load() == connSilent {
		return c.start.Add(c.l.cfg.Timeouts.Read)
	}
	return c.start.Add(c.l.cfg.Timeouts.Idle)
}

// writeDeadline is when writing an answer ends: a read and a write timeout
// after its request's first byte.
func (c *Conn) writeDeadline() time.Time {
	t := c.l.cfg.Timeouts
	return c.start.Add(t.Read + t.Write)
}

// extend is called when a deadline set on the socket passed: if the
// connection's own deadline d has not, it sets the next one, d or at most
// longest from now, and reports true.
func (c *Conn) extend(set func(time.Time) error, d time.Time, longest time.Duration) bool {
	now := time.Now()
	if !now.Before(d) {
		return false
	}
	if next := now.Add(longest); next.Before(d) {
		d = next
	}
	return set(d) == nil
}

// Close closes the connection and gives its place in the cap back. After
// an answer to a request that was not read whole, it first lingers (see
// lingerClose), holding its place meanwhile.
func (c *Conn) Close() error {
	if c.linger.Load() {
		c.lingerClose()
	}
	c.l.mu.Lock()
	_, open := c.l.conns[c]
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	if open {
		c.l.cfg.Conns.Give()
	}
	c.holder.Close()
	return c.Conn.Close()
}

// How long, and for how many bytes, a closing connection reads what its
// client still sends (see lingerClose).
const (
	lingerTime  = 500 * time.Millisecond
	lingerBytes = 64 << 10
)

// lingerClose shuts the connection's write side, then reads and drops
// what the client still sends, until it closes its side, lingerTime
// passes or lingerBytes came. A socket closed with bytes unread, or that
// receives bytes once closed, is reset by its kernel, and the reset can
// destroy the answer just written before the client reads it: a client
// that sends a request slowly (answered 408) or one too large (431) would
// see its connection reset instead of its answer.
func (c *Conn) lingerClose() {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil || c.Conn.SetReadDeadline(time.Now().Add(lingerTime)) != nil {
		return
	}
	var buf [512]byte
	for n := 0; n < lingerBytes; {
		m, err := c.Conn.Read(buf[:])
		if err != nil {
			return
		}
		n += m
	}
}
