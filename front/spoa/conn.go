package spoa

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/internal/membudget"
	"github.com/authlimit/authlimit/internal/rawsock"
)

// conn is one connection from HAProxy. One goroutine, the reader, runs
// serve: it reads every frame, does the handshake, hands NOTIFY frames to
// the Handler and ends the connection. Answers come from whichever
// goroutine completes a decision: they append their ACK to wbuf under mu,
// and one goroutine at a time writes it (see flushLocked).
type conn struct {
	srv  *Server
	nc   net.Conn
	peer netip.Addr

	// hold is the connection's share of Options.Budget: the large frame
	// it reads.
	hold *membudget.Holder

	// The reader's own.
	br  *bufio.Reader
	rdl time.Time // the socket's read deadline
	// maxFrame is the frame size the handshake settled (the agent's own
	// before it). The reader sets it before the first Notify; Replies
	// only read it.
	maxFrame int

	// flushFn is flush, made once: a goroutine started with it
	// allocates nothing.
	flushFn func()
	// now writes what the socket takes at once (nil if nc is not a
	// socket): see flushLocked.
	now *rawsock.Writer

	// room is signalled (without waiting) when an answer leaves the
	// flight or the written buffer drains: the reader waits on it for
	// room to read the next frame.
	room chan struct{}
	// done is closed when the connection closes.
	done chan struct{}

	mu          sync.Mutex
	wbuf, spare []byte
	flushing    bool // a goroutine is writing wbuf, or is about to
	// holding: the reader has frames in hand and writes what is
	// buffered once it has none (see unhold), so that the answers to a
	// burst of frames go out in one write.
	holding  bool
	wdl      time.Time // the socket's write deadline (the writer's)
	closed   bool
	inflight int  // NOTIFY frames handed to the Handler and not answered
	deferred bool // a run's end will flush the buffer (see Reply.SendIn)
}

func newConn(s *Server, nc net.Conn) *conn {
	nc = rawsock.Wrap(nc)
	c := &conn{
		srv:      s,
		nc:       nc,
		peer:     remoteIP(nc),
		br:       bufio.NewReaderSize(nc, readBufferSize),
		maxFrame: s.opts.MaxFrameSize,
		room:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	c.flushFn = c.flush
	c.now = rawsock.New(nc)
	c.hold = s.opts.Budget.Holder(func() { go c.evicted() })
	return c
}

// protocolError is a frame that breaks SPOP: the agent answers it with
// AGENT-DISCONNECT and its status, and closes.
type protocolError struct {
	status int
	what   string
}

func (e *protocolError) Error() string {
	return fmt.Sprintf("spop status %d (%s): %s", e.status, statusMessages[e.status], e.what)
}

// errStopping ends the reading of a connection whose Server shuts down.
var errStopping = errors.New("spoa: shutting down")

// serve reads and handles frames until the connection ends.
func (c *conn) serve() {
	defer c.close()
	if !c.handshake() {
		return
	}
	for {
		if !c.waitRoom() {
			c.readFailed(errStopping)
			return
		}
		f, large, err := c.readFrame(time.Now(), c.srv.opts.IdleTimeout)
		if err != nil {
			c.readFailed(err)
			return
		}
		err = c.handle(f)
		c.release(f, large)
		if err != nil {
			c.readFailed(err)
			return
		}
	}
}

// handshake reads HAPROXY-HELLO and answers AGENT-HELLO (section 3.2.4),
// or AGENT-DISCONNECT with the status of what is wrong. It reports
// whether NOTIFY frames may follow: not after a refusal, nor after a
// health check's hello, whose connection closes once answered.
func (c *conn) handshake() bool {
	f, large, err := c.readFrame(time.Now(), c.srv.opts.HelloTimeout)
	if err != nil {
		c.readFailed(err)
		return false
	}
	h, ok := readHeader(f)
	var hl hello
	status := statusNormal
	switch {
	case !ok || h.typ != frameHAProxyHello || h.sid != 0 || h.fid != 0:
		status = statusInvalid
	case h.flags&flagFin == 0:
		status = statusNoFragments
	default:
		hl, status = readHello(h.payload)
	}
	c.release(f, large)
	if status != statusNormal {
		c.fail(&protocolError{status: status, what: "in HAPROXY-HELLO"})
		return false
	}
	c.maxFrame = int(min(hl.maxFrame, uint64(c.srv.opts.MaxFrameSize)))
	c.mu.Lock()
	c.wbuf = appendAgentHello(c.wbuf, c.maxFrame)
	c.flushLocked(true)
	if hl.healthcheck {
		c.drain()
		return false
	}
	return true
}

// handle handles one frame (the bytes after its length).
func (c *conn) handle(f []byte) error {
	h, ok := readHeader(f)
	if !ok {
		return &protocolError{status: statusInvalid, what: "truncated metadata"}
	}
	switch h.typ {
	case frameNotify:
		if h.flags&flagFin == 0 {
			return &protocolError{status: statusNoFragments, what: "a NOTIFY fragment"}
		}
		if h.flags&flagAbort != 0 {
			return nil // cancelled: nothing to decide or answer
		}
		if !c.acquire() {
			return errStopping
		}
		return c.notify(h)
	case frameHAProxyDisconnect:
		c.say(statusNormal)
		return io.EOF
	case frameUnset:
		return &protocolError{status: statusNoFragments, what: "a fragment"}
	case frameHAProxyHello, frameAgentHello, frameAgentDisconnect, frameAck:
		return &protocolError{status: statusInvalid, what: fmt.Sprintf("an unexpected frame of type %d", h.typ)}
	}
	return nil // unknown frame types are skipped (section 3.2.2)
}

// notify hands a NOTIFY frame to the Handler. A Handler that panics has
// left the frame's answer unknown: the connection ends.
func (c *conn) notify(h header) (err error) {
	defer func() {
		if p := recover(); p != nil {
			c.srv.opts.Log.Error("spoa: the handler panicked", "panic", fmt.Sprint(p))
			err = &protocolError{status: statusResources, what: "the handler failed"}
		}
	}()
	c.srv.opts.Handler.Notify(h.payload, Reply{c: c, sid: h.sid, fid: h.fid})
	return nil
}

// acquire takes a place in flight for a NOTIFY frame, waiting for one
// over all connections if need be; false if the connection closed
// meanwhile.
func (c *conn) acquire() bool {
	select {
	case c.srv.slots <- struct{}{}:
	default:
		c.unhold()
		select {
		case c.srv.slots <- struct{}{}:
		case <-c.done:
			return false
		}
	}
	c.mu.Lock()
	c.inflight++
	c.holding = true
	c.mu.Unlock()
	return true
}

// unhold writes what the reader held back (see holding): it is about to
// wait.
func (c *conn) unhold() {
	c.mu.Lock()
	c.holding = false
	c.flushLocked(true)
}

// waitRoom waits until the connection may read another frame: fewer than
// MaxInFlight frames in flight and fewer than maxPending bytes unwritten.
// It reports false if the connection closed or shutdown began meanwhile.
func (c *conn) waitRoom() bool {
	for {
		c.mu.Lock()
		full := c.inflight >= c.srv.opts.MaxInFlight || len(c.wbuf) >= maxPending
		closed := c.closed
		c.mu.Unlock()
		switch {
		case closed:
			return false
		case !full:
			return true
		}
		c.unhold()
		select {
		case <-c.room:
		case <-c.done:
			return false
		case <-c.srv.stopping:
			return false
		}
	}
}

// readFrame reads the next frame, waiting until wait after since for its
// first bytes and FrameTimeout for the rest: the bytes after its length,
// in the read buffer (large 0) or in a buffer of large bytes from the
// budget. They are valid until release.
func (c *conn) readFrame(since time.Time, wait time.Duration) (f []byte, large int, err error) {
	if !c.frameBuffered() {
		c.unhold()
	}
	end := since.Add(wait)
	if c.rdl.After(end) || c.rdl.Before(end.Add(-wait/2)) {
		c.setReadDeadline(end)
	}
	var lb []byte
	for {
		if c.stoppingNow() {
			return nil, 0, errStopping
		}
		lb, err = c.br.Peek(4)
		// The socket's deadline may come before end (it moves only
		// when less than half a wait is left): wait on until end.
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(end) {
			break
		}
		c.setReadDeadline(end)
	}
	if err != nil {
		return nil, 0, err
	}
	n := binary.BigEndian.Uint32(lb)
	switch {
	case uint64(n) > uint64(c.maxFrame):
		return nil, 0, &protocolError{status: statusTooBig, what: fmt.Sprintf("a frame of %d bytes, over %d", n, c.maxFrame)}
	case n < frameHeaderMin:
		return nil, 0, &protocolError{status: statusInvalid, what: fmt.Sprintf("a frame of %d bytes", n)}
	}
	size := int(n) + 4
	if size <= c.br.Size() {
		if c.br.Buffered() < size {
			c.frameDeadline()
		}
		b, err := c.br.Peek(size)
		if err != nil {
			return nil, 0, err
		}
		return b[4:], 0, nil
	}
	if !c.take(int64(n)) {
		return nil, 0, &protocolError{status: statusResources, what: "the memory budget for large frames is spent"}
	}
	buf := getFrameBuf(int(n))
	_, _ = c.br.Discard(4)
	c.frameDeadline()
	if _, err := io.ReadFull(c.br, buf); err != nil {
		c.release(buf, int(n))
		return nil, 0, err
	}
	return buf, int(n), nil
}

// frameBuffered reports whether the next frame is in the read buffer
// whole: reading it will not wait.
func (c *conn) frameBuffered() bool {
	n := c.br.Buffered()
	if n < 4 {
		return false
	}
	b, _ := c.br.Peek(4)
	return uint64(n) >= 4+uint64(binary.BigEndian.Uint32(b))
}

// take reserves n bytes of the budget, waiting up to FrameTimeout for
// them; false if they did not come, or the connection closed (or was
// evicted).
func (c *conn) take(n int64) bool {
	deadline := time.Now().Add(c.srv.opts.FrameTimeout)
	for !c.hold.Take(n) {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-c.done:
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
	return true
}

// release lets go of a frame readFrame returned.
func (c *conn) release(f []byte, large int) {
	if large > 0 {
		putFrameBuf(f)
		c.hold.Give(int64(large))
		return
	}
	_, _ = c.br.Discard(len(f) + 4)
}

// frameBufs hold large frames between uses.
var frameBufs sync.Pool

func getFrameBuf(n int) []byte {
	if p, ok := frameBufs.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n, max(n, readBufferSize*2))
}

func putFrameBuf(b []byte) {
	frameBufs.Put(&b)
}

// setReadDeadline sets the socket's read deadline (the reader's).
func (c *conn) setReadDeadline(t time.Time) {
	c.rdl = t
	_ = c.nc.SetReadDeadline(t)
}

// frameDeadline gives the rest of a frame FrameTimeout.
func (c *conn) frameDeadline() {
	c.setReadDeadline(time.Now().Add(c.srv.opts.FrameTimeout))
}

// wake ends the reader's wait for a frame, once shutdown has begun.
func (c *conn) wake() {
	_ = c.nc.SetReadDeadline(time.Now())
	c.signal()
}

// readFailed ends the connection after what ended the reading: a
// protocol error is answered with its AGENT-DISCONNECT; shutdown has the
// frames in flight answered first; a timeout is said with
// AGENT-DISCONNECT; anything else (HAProxy closed, a reset) closes.
func (c *conn) readFailed(err error) {
	var pe *protocolError
	switch {
	case errors.As(err, &pe):
		c.fail(pe)
	case c.stoppingNow():
		c.goodbye()
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.say(statusTimeout)
	}
}

func (c *conn) stoppingNow() bool {
	select {
	case <-c.srv.stopping:
		return true
	default:
		return false
	}
}

// fail says AGENT-DISCONNECT with a protocol error's status.
func (c *conn) fail(pe *protocolError) {
	c.srv.opts.ProtocolError(pe.status)
	c.srv.opts.Log.Debug("spoa: protocol error", "peer", c.nc.RemoteAddr().String(), "err", pe.Error())
	c.say(pe.status)
}

// goodbye waits until every frame in flight is answered (or the
// connection closes: Shutdown's deadline), then says AGENT-DISCONNECT.
func (c *conn) goodbye() {
	for {
		c.mu.Lock()
		n, closed := c.inflight, c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		if n == 0 {
			break
		}
		select {
		case <-c.room:
		case <-c.done:
			return
		}
	}
	c.say(statusNormal)
}

// say writes AGENT-DISCONNECT with status, after what is buffered, and
// waits until it is written.
func (c *conn) say(status int) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.wbuf = appendAgentDisconnect(c.wbuf, status)
	c.mu.Unlock()
	c.drain()
}

// drain writes everything buffered, waiting for it; it returns early if
// the connection closes or a write fails.
func (c *conn) drain() {
	c.mu.Lock()
	for !c.closed && (len(c.wbuf) > 0 || c.flushing) {
		if c.flushing {
			c.mu.Unlock()
			select {
			case <-c.room:
			case <-c.done:
				return
			}
			c.mu.Lock()
			continue
		}
		if !c.writeLocked() {
			break
		}
	}
	c.mu.Unlock()
}

// signal tells the reader there may be room now.
func (c *conn) signal() {
	select {
	case c.room <- struct{}{}:
	default:
	}
}

// close closes the connection, once. Answers still to come are dropped.
func (c *conn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	close(c.done)
	_ = c.nc.Close()
	c.hold.Close()
	c.srv.forget(c)
}

// evicted closes a connection the budget evicted: it held the most when
// another's request needed room.
func (c *conn) evicted() {
	c.srv.opts.Log.Debug("spoa: connection evicted: it held the most of the memory budget", "peer", c.nc.RemoteAddr().String())
	c.close()
}

// Reply answers one NOTIFY frame: see Handler.
type Reply struct {
	c        *conn
	sid, fid uint64
}

// maxAckHeader is the most an ACK frame's metadata takes: its type, flags
// and two varints of up to ten bytes.
const maxAckHeader = 1 + 4 + 10 + 10

// Room is the most bytes of actions the ACK may carry: the frame size the
// handshake settled, less the ACK's metadata. It is at least 231.
func (r Reply) Room() int { return r.c.maxFrame - maxAckHeader }

// Send answers the frame with an ACK carrying actions (a LIST-OF-ACTIONS
// of at most Room bytes, copied before Send returns). Actions over Room
// end the connection instead: HAProxy then errs on the frame, which
// haproxy/spoe-authlimit.conf's set-on-error reports. After the
// connection closed, the answer is dropped.
func (r Reply) Send(actions []byte) { r.SendIn(nil, actions) }

// SendIn is Send within a run of outcomes (see algo.Run): while few
// frames are in flight, the ACK is buffered and written at the run's
// end, with the other answers the run buffered for this connection,
// rather than alone.
func (r Reply) SendIn(run *algo.Run, actions []byte) {
	c := r.c
	defer func() { <-c.srv.slots }()
	c.mu.Lock()
	c.inflight--
	c.signal()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if len(actions) > r.Room() {
		c.mu.Unlock()
		c.srv.opts.Log.Error("spoa: an answer is over the frame size; closing the connection", "actions", len(actions), "room", r.Room())
		c.close()
		return
	}
	var at int
	c.wbuf, at = startFrame(c.wbuf, frameAck, r.sid, r.fid)
	c.wbuf = endFrame(append(c.wbuf, actions...), at)
	quiet := c.inflight < quietInFlight
	if run != nil && quiet {
		deferred := c.deferred
		c.deferred = true
		c.mu.Unlock()
		if !deferred {
			run.Defer(c)
		}
		return
	}
	c.flushLocked(quiet)
}

// Flush writes, at the end of a run, what the run's answers left in the
// buffer: what the socket takes at once, on the calling goroutine, as a
// quiet answer is written (see flushLocked).
func (c *conn) Flush() {
	c.mu.Lock()
	c.deferred = false
	c.flushLocked(true)
}

// quietInFlight is the frames in flight on a connection below which an
// answer is written by the goroutine that completed it (see flushLocked):
// with so few, no other answer is likely to come soon enough to share its
// write.
const quietInFlight = 4

// flushLocked writes what is buffered, unless one already writes or the
// reader holds the answers back (see holding). With now, it writes on the
// calling goroutine what the socket takes at once: at low load an answer
// then goes out without waking another goroutine, which on a busy machine
// costs more than the write. The rest (the socket is full, or not now) is
// written by a goroutine of its own, which waits for the socket as need
// be; answers completed meanwhile (a store's goroutine completes a batch
// of decisions one after another) join the buffer and go out in the same
// write: one write for many answers costs HAProxy and the agent less than
// a write each. c.mu is held on entry and released on return.
func (c *conn) flushLocked(now bool) {
	if c.flushing || c.closed || c.holding || len(c.wbuf) == 0 {
		c.mu.Unlock()
		return
	}
	if now && c.now != nil && !c.writeNowLocked() {
		c.mu.Unlock()
		c.close()
		return
	}
	if c.closed || len(c.wbuf) == 0 {
		c.mu.Unlock()
		return
	}
	c.flushing = true
	c.mu.Unlock()
	go c.flushFn()
}

// writeNowLocked writes what the socket takes of the buffer at once, with
// c.mu released meanwhile and flushing set; what it did not take stays
// first in the buffer. It reports false if the write failed. c.mu is held
// on entry and on return; flushing is false on both.
func (c *conn) writeNowLocked() bool {
	b := c.wbuf
	c.wbuf = c.spare[:0]
	c.spare = nil
	c.flushing = true
	c.mu.Unlock()
	n, err := c.now.Write(b)
	c.mu.Lock()
	c.flushing = false
	if n < len(b) {
		// The rest goes first, before what was buffered meanwhile.
		rest := b[:copy(b, b[n:])]
		c.wbuf, c.spare = append(rest, c.wbuf...), c.wbuf[:0]
	} else if cap(b) <= maxPending {
		c.spare = b[:0]
	}
	c.signal()
	return err == nil
}

// flush writes until nothing is buffered, waiting on the socket as need
// be; the one writing.
func (c *conn) flush() {
	c.mu.Lock()
	c.flushing = false
	for !c.closed && len(c.wbuf) > 0 {
		if !c.writeLocked() {
			c.mu.Unlock()
			c.close()
			return
		}
	}
	c.mu.Unlock()
}

// writeLocked writes the buffer once, waiting on the socket up to
// WriteTimeout, with c.mu released meanwhile and flushing set; false if
// the write failed. c.mu is held on entry and on return; flushing is
// false on both.
func (c *conn) writeLocked() bool {
	b := c.wbuf
	c.wbuf = c.spare[:0]
	c.flushing = true
	c.mu.Unlock()
	err := c.writeDeadline()
	if err == nil {
		_, err = c.nc.Write(b)
	}
	c.mu.Lock()
	c.flushing = false
	// The buffer just written is the next spare; one grown past
	// maxPending is let go, and so is the spare wbuf now uses, or the
	// next write would hand wbuf's own bytes to the socket.
	c.spare = nil
	if cap(b) <= maxPending {
		c.spare = b[:0]
	}
	c.signal()
	return err == nil
}

// writeDeadline gives the next write WriteTimeout, moving the socket's
// deadline only when less than half of it is left (the one writing).
func (c *conn) writeDeadline() error {
	now, t := time.Now(), c.srv.opts.WriteTimeout
	if c.wdl.Sub(now) >= t/2 {
		return nil
	}
	c.wdl = now.Add(t)
	return c.nc.SetWriteDeadline(c.wdl)
}
