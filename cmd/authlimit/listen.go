package main

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/internal/acceptwait"
	"github.com/authlimit/authlimit/internal/conncap"
)

// listener is the server's listener. It keeps the connections it accepts,
// so that shutdown can close those that never sent a byte, wraps each in a
// conn, and counts them. It never fails on an error a later accept may not
// have (no file descriptor free, say): it waits and accepts again, as
// net/http does, so that a client opening connections cannot end the
// process. Its connections count in the cap it shares with the gRPC
// listener: beyond it a new connection is closed at once, so that file
// descriptors remain for the store and for the connections it has.
type listener struct {
	net.Listener
	listenerConfig
	closed    chan struct{} // closed by Close: a wait between accepts ends
	closeOnce sync.Once
	ahead     sync.Pool // *[aheadSize]byte: see conn.Read

	mu       sync.Mutex
	conns    map[*conn]struct{}
	shutting bool
}

// listenerConfig is what a listener keeps.
type listenerConfig struct {
	maxHeader int          // the largest header block: fasthttp refuses larger ones itself
	conns     *conncap.Cap // the connections' cap, shared with the gRPC listener; nil: no cap
	timeouts  timeouts
	metrics   connMetrics
	log       *slog.Logger
}

// connMetrics count what the decision listener does with connections.
type connMetrics struct {
	accepted     prometheus.Counter // accepted and served
	grpcAccepted prometheus.Counter // accepted and served by the gRPC listener
	rejected     prometheus.Counter // closed at once: the cap was reached (counted by the cap, on either listener)
	acceptErrors prometheus.Counter // failed accepts, each followed by a wait
}

// newListener wraps l.
func newListener(l net.Listener, c listenerConfig) *listener {
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	l2 := &listener{Listener: l, listenerConfig: c, closed: make(chan struct{}), conns: map[*conn]struct{}{}}
	l2.ahead.New = func() any { return new([aheadSize]byte) }
	return l2
}

// Close closes the listener and ends a wait between accepts.
func (l *listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// timeouts bound how long a client holds a connection. conn keeps them,
// not fasthttp: fasthttp's ReadTimeout, WriteTimeout and IdleTimeout set
// three deadlines for every request, each a timer reset and two readings
// of the clock. conn reads the clock once a request, and sets a deadline
// on the socket only when the one it set before passes (see conn.Read).
type timeouts struct {
	// read bounds a request, from its first byte to its last, and a new
	// connection's wait for its first request.
	read time.Duration
	// write bounds an answer: it is written within read + write of its
	// request's first byte.
	write time.Duration
	// idle bounds a keep-alive connection's wait for its next request,
	// from the first byte of the one before. It is at least read, which
	// conn.Read relies on.
	idle time.Duration
}

// serverTimeouts are authlimit's. The write timeout covers a request held
// by a shaping rule; the idle one is longer than the proxies' upstream
// keep-alive, so that authlimit never closes a connection a proxy is about
// to reuse.
var serverTimeouts = timeouts{read: 10 * time.Second, write: 10*time.Second + algo.MaxDelay, idle: 2 * time.Minute}

// Accept returns the next connection; once shutdown began, it closes new
// ones at once (the listener itself closes a moment later), as it does
// those beyond the cap. After an error a later accept may not have, it
// waits, from 5 ms doubling up to 1 s, and accepts again; it returns any
// other error.
func (l *listener) Accept() (net.Conn, error) {
	var wait time.Duration
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			if !acceptwait.Retryable(err) {
				return nil, err
			}
			l.metrics.acceptErrors.Inc()
			if wait == 0 {
				l.log.Warn("accept failed; accepting again after a wait", "err", err)
			}
			wait = acceptwait.Next(wait)
			t := time.NewTimer(wait)
			select {
			case <-t.C:
				continue
			case <-l.closed:
				t.Stop()
				return nil, net.ErrClosed
			}
		}
		wait = 0
		if !l.listenerConfig.conns.Take() {
			_ = nc.Close()
			continue
		}
		l.metrics.accepted.Inc()
		c := &conn{Conn: nc, l: l, scanning: true, start: time.Now()}
		// The first deadlines: no later than any this connection's
		// requests will have (see conn.Read).
		if nc.SetReadDeadline(c.readDeadline()) != nil || nc.SetWriteDeadline(c.writeDeadline()) != nil {
			l.listenerConfig.conns.Give()
			_ = nc.Close()
			continue
		}
		l.mu.Lock()
		shutting := l.shutting
		if !shutting {
			l.conns[c] = struct{}{}
		}
		l.mu.Unlock()
		if !shutting {
			return c, nil
		}
		l.listenerConfig.conns.Give()
		_ = nc.Close()
	}
}

// closeSilent starts the shutdown: it closes every connection that has not
// sent a byte, and any accepted from now on.
func (l *listener) closeSilent() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.shutting = true
	for c := range l.conns {
		if c.state.CompareAndSwap(connSilent, connShut) {
			_ = c.Conn.Close()
		}
	}
}

// conn is a served connection. It tells whether it ever sent a byte, and
// refuses a request whose header block ends in bare line feeds ("GET /
// HTTP/1.1\nHost: x\n\n"): fasthttp looks for CRLF CRLF alone, and would
// wait for it until the read timeout answered 408. RFC 9112 lets a server
// refuse such a request; fasthttp then answers 400 and closes.
type conn struct {
	net.Conn
	l     *listener
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

// errBareLF refuses a header block that ends in bare line feeds.
var errBareLF = errors.New("header block ends in bare line feeds; HTTP/1.1 wants CRLF")

// aheadSize is the buffer a read for fewer bytes reads into (see
// conn.Read): a proxy's auth subrequest, headers and all, fits.
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
func (c *conn) Read(p []byte) (int, error) {
	if len(c.ahead) == 0 && c.aheadErr == nil {
		if c.refused {
			return 0, errBareLF
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
func (c *conn) readSocket(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	// A read of nothing without an error (an empty write into an
	// in-memory pipe) is read again: fasthttp, waiting for a request's
	// first byte with ReduceMemoryUsage, takes it for a broken reader.
	for n == 0 && len(p) > 0 && (err == nil || isTimeout(err) && c.extend(c.Conn.SetReadDeadline, c.readDeadline(), c.l.timeouts.read)) {
		n, err = c.Conn.Read(p)
	}
	if n > 0 {
		if !c.busy {
			c.busy, c.start = true, time.Now()
		}
		c.state.CompareAndSwap(connSilent, connSpoke)
		if c.scanning && c.bareLF(p[:n]) {
			c.refused = true
			return n, errBareLF
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

func (c *conn) Write(p []byte) (int, error) {
	// An answer ends its request: what is read next starts another. (A
	// pipelined request fasthttp read before this answer is not looked
	// at: no proxy pipelines, and such a one still gets its 408.)
	if !bytes.HasPrefix(p, continueLine) {
		c.scanning, c.head, c.busy = true, c.head[:0], false
		if cap(c.head) > keptHead {
			c.head = nil
		}
	}
	t := c.l.timeouts
	n, err := c.Conn.Write(p)
	for n < len(p) && isTimeout(err) && c.extend(c.Conn.SetWriteDeadline, c.writeDeadline(), t.read+t.write) {
		var m int
		m, err = c.Conn.Write(p[n:])
		n += m
	}
	return n, err
}

// readDeadline is when the connection's wait for bytes ends: a request's
// read timeout after its first byte (or the connection's accept), or
// between requests the idle timeout after the last one's first byte.
func (c *conn) readDeadline() time.Time {
	if c.busy || c.state.Load() == connSilent {
		return c.start.Add(c.l.timeouts.read)
	}
	return c.start.Add(c.l.timeouts.idle)
}

// writeDeadline is when writing an answer ends: a read and a write timeout
// after its request's first byte.
func (c *conn) writeDeadline() time.Time {
	t := c.l.timeouts
	return c.start.Add(t.read + t.write)
}

// extend is called when a deadline set on the socket passed: if the
// connection's own deadline d has not, it sets the next one, d or at most
// longest from now, and reports true.
func (c *conn) extend(set func(time.Time) error, d time.Time, longest time.Duration) bool {
	now := time.Now()
	if !now.Before(d) {
		return false
	}
	if next := now.Add(longest); next.Before(d) {
		d = next
	}
	return set(d) == nil
}

func (c *conn) Close() error {
	c.l.mu.Lock()
	_, open := c.l.conns[c]
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	if open {
		c.l.listenerConfig.conns.Give()
	}
	return c.Conn.Close()
}

// bareLF looks at b, read after the bytes kept in c.head, for the end of a
// request's header block, and reports whether it ends in bare line feeds.
// Once the block ended well, or what was read is no request line, it stops
// looking until the next answer.
func (c *conn) bareLF(b []byte) bool {
	if len(c.head) > 0 {
		c.head = append(c.head, b...)
		b = c.head
	}
	switch headerEnd(b) {
	case headerBareLF:
		return true
	case headerOpen:
		if len(b) <= c.l.maxHeader {
			if len(c.head) == 0 {
				c.head = append(c.head, b...)
			}
			return false
		}
	}
	c.scanning, c.head = false, nil
	return false
}

// headerKind is what headerEnd found.
type headerKind int

const (
	headerOpen   headerKind = iota // the header block has not ended yet
	headerCRLF                     // it ended as fasthttp reads it
	headerBareLF                   // it ended in bare line feeds
	headerOther                    // no request line: a body, or garbage fasthttp refuses itself
)

// headerEnd finds where the header block starting b ends, as RFC 9112
// reads it: lines end in LF, with or without CR; empty lines before the
// request line are skipped. fasthttp reads a block that ends in CRLF CRLF,
// or an empty one ending in CRLF; it would wait on any other.
func headerEnd(b []byte) headerKind {
	for {
		if rest, ok := bytes.CutPrefix(b, []byte("\r\n")); ok {
			b = rest
		} else if rest, ok := bytes.CutPrefix(b, []byte("\n")); ok {
			b = rest
		} else {
			break
		}
	}
	first := bytes.IndexByte(b, '\n')
	if first < 0 {
		return headerOpen
	}
	if !isRequestLine(bytes.TrimSuffix(b[:first], []byte("\r"))) {
		return headerOther
	}
	for end := first + 1; ; {
		i := bytes.IndexByte(b[end:], '\n')
		if i < 0 {
			return headerOpen
		}
		line := b[end : end+i]
		end += i + 1
		if len(line) > 1 || len(line) == 1 && line[0] != '\r' {
			continue
		}
		if bytes.HasSuffix(b[:end], []byte("\r\n\r\n")) || end == first+3 && len(line) == 1 {
			return headerCRLF
		}
		return headerBareLF
	}
}

// isRequestLine reports whether line ends in an HTTP version, as fasthttp
// wants a request line to ("GET / HTTP/1.1").
func isRequestLine(line []byte) bool {
	n := len(line)
	return n > 9 && string(line[n-9:n-3]) == " HTTP/" && line[n-2] == '.' &&
		'0' <= line[n-3] && line[n-3] <= '9' && '0' <= line[n-1] && line[n-1] <= '9'
}
