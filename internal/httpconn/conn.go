package httpconn

import (
	"bytes"
	"errors"
	"net"
	"sync/atomic"
	"time"
)

// Conn is a served connection. It tells whether it ever sent a byte, and
// refuses a request whose header block ends in bare line feeds ("GET /
// HTTP/1.1\nHost: x\n\n"): fasthttp looks for CRLF CRLF alone, and would
// wait for it until the read timeout answered 408. RFC 9112 lets a server
// refuse such a request; fasthttp then answers 400 and closes.
type Conn struct {
	net.Conn
	l     *Listener
	state atomic.Int32 // connSilent, then connSpoke or connShut

	// Read and Write run on the connection's one serving goroutine: the
	// fields below need no lock.
	ahead    []byte           // bytes read from the socket that fasthttp has not asked for yet
	aheadBuf *[aheadSize]byte // ahead's pooled buffer, held while ahead is not empty
	aheadErr error            // the error of the read that filled ahead, for once it is drained
	scanning bool             // the bytes read since the last answer may start a header block
	head     []byte           // those bytes, while the block has not ended
	refused  bool             // a header block ended in bare line feeds
	busy     bool             // a request's bytes came, its answer is not written yet
	start    time.Time        // the first byte of the last request; before one, the accept
}

const (
	connSilent int32 = iota // no byte read yet
	connSpoke               // a byte read: it carries, or carried, a request
	connShut                // closed by shutdown while silent
)

// ErrBareLF refuses a header block that ends in bare line feeds.
var ErrBareLF = errors.New("header block ends in bare line feeds; HTTP/1.1 wants CRLF")

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
	if n > 0 {
		if !c.busy {
			c.busy, c.start = true, time.Now()
		}
		c.state.CompareAndSwap(connSilent, connSpoke)
		if c.scanning && c.bareLF(p[:n]) {
			c.refused = true
			return n, ErrBareLF
		}
	}
	return n, err
}

// keptHead is the largest head buffer a connection keeps for its next
// request. A header block that comes in pieces is kept in head until it
// ends; a small buffer kept saves an allocation per such request, a large
// one is not held by a waiting connection.
const keptHead = 1 << 10

// continueLine starts the interim answer to "Expect: 100-continue", after
// which the same request's body comes.
var continueLine = []byte("HTTP/1.1 100 ")

// Write writes an answer, within the connection's timeouts.
func (c *Conn) Write(p []byte) (int, error) {
	// An answer ends its request: what is read next starts another. (A
	// pipelined request fasthttp read before this answer is not looked
	// at: no proxy pipelines, and such a one still gets its 408.)
	if !bytes.HasPrefix(p, continueLine) {
		c.scanning, c.head, c.busy = true, c.head[:0], false
		if cap(c.head) > keptHead {
			c.head = nil
		}
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

// Close closes the connection and gives its place in the cap back.
func (c *Conn) Close() error {
	c.l.mu.Lock()
	_, open := c.l.conns[c]
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	if open {
		c.l.cfg.Conns.Give()
	}
	return c.Conn.Close()
}
