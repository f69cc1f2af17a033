package grpcwire

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/authlimit/authlimit/internal/membudget"
	"github.com/authlimit/authlimit/internal/rawsock"
)

// clientPreface opens every HTTP/2 connection (RFC 9113, section 3.4).
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

const (
	// readFrameSize is the largest frame the server reads: the default
	// SETTINGS_MAX_FRAME_SIZE, which it does not raise.
	readFrameSize = 16384
	// drainTime is how long a closing connection reads on, so that the
	// client reads the last frames before the socket closes.
	drainTime = time.Second
	// maxKeptBlock is the largest header block kept to be recognized
	// when it comes again (see readerState.last).
	maxKeptBlock = 1024
)

// Buffers of response messages and of requests, of at least minBuf
// bytes.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, minBuf); return &b }}

const minBuf = 1024

// keptBuf is the largest buffer put back in bufPool.
const keptBuf = 64 << 10

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > keptBuf {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// conn is one served connection. Its fields are grouped by who may touch
// them:
//
//   - srv, nc and hold never change;
//   - rd is the reading goroutine's alone (serve, and what it calls): it
//     takes no lock;
//   - sh, and raw, are shared by the reader, the handlers and whoever
//     answers an asynchronous call: every access holds mu.
//
// The lock rule: a function either takes mu and releases it before it
// returns, or its name ends in Locked and mu is held on its entry and on
// its return. flushLocked and flushFor release it while they write to
// the socket, as sync.Cond's Wait does, and take it again before they
// return.
type conn struct {
	srv  *Server
	nc   net.Conn
	hold *membudget.Holder // the connection's share of Options.Budget

	rd readerState

	mu  sync.Mutex
	sh  sharedState
	raw *rawsock.Writer // writes what the socket takes at once; nil if it has no descriptor
	// over is set, under mu, when more than maxBacklog bytes wait to be
	// written, and cleared by the reader once they no longer do: the
	// reader looks at it after every frame without taking mu.
	over atomic.Bool
}

// readerState is what only the connection's reading goroutine touches.
type readerState struct {
	br  *bufio.Reader
	fr  *http2.Framer
	dec *hpack.Decoder

	block    []byte // the header block being received
	blockID  uint32
	blockEnd bool // its HEADERS frame ended the stream
	blockDep bool // its HEADERS frame made the stream depend on itself
	hdr      reqHeaders
	// last is the previous header block that stood alone (see
	// standalone), and lastHdr what it said: the same block again, as a
	// client that sends its fields as literals kept out of the dynamic
	// table sends on every call, is not decoded again (Huffman codes and
	// strings included).
	last       []byte
	lastHdr    reqHeaders
	connUnused int  // the connection's received bytes not yet returned
	connRecv   int  // bytes received on the connection's window
	opened     int  // streams opened since the last check (see keepReading)
	flooded    bool // too many control frames wait: the connection ends
	// blockCharged is what block's buffer counts in the budget.
	blockCharged int64
	// tick counts the read deadlines passed, every requestTick; checked
	// is the tick of the last check of the connection's timeouts.
	tick, checked uint64
	// idleFrames counts the frames that moved nothing forward since
	// idleSince (see idleFrame).
	idleFrames    int
	idleSince     time.Time
	settingsAcked bool // the client acknowledged the server's SETTINGS
}

// sharedState is what the reader, the handlers and the writers share,
// under conn.mu.
type sharedState struct {
	// flushed is signalled when a writer stops flushing, when the
	// connection closes, and after each write while the reader waits
	// for the backlog (see waitBacklog).
	flushed     sync.Cond
	streams     map[uint32]*stream
	active      int // calls counted against MaxConcurrentStreams
	maxStream   uint32
	wbuf, spare []byte
	flushing    bool
	wdl         time.Time // the socket's write deadline (by the one writing)
	queued      int       // control frames queued since the last write began
	wcharged    int64     // what wbuf counts in the budget (see chargeBacklogLocked)
	writing     int       // the bytes of the write under way
	backlogWait bool      // the reader waits for the backlog to shrink
	sendWindow  int64
	peerWindow  int64 // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame    int
	blocked     []*stream
	blockedAt   time.Time // when blocked last became non-empty
	goingAway   bool      // GOAWAY sent: no call beyond lastStream
	lastStream  uint32
	peerGone    bool // the client sent GOAWAY
	// answered: a call was answered since the client's last PING (see
	// frame's PING case).
	answered   bool
	closing    bool // the socket is closing once written
	halfClosed bool // the last frames are written
	closed     bool
}

// stream is one call. Its fields are grouped as conn's are: id, m and
// async are set before the call starts and never change; rd is the
// reader's; sh is under the connection's mu. req, the request's bytes,
// and charged are the reader's until the request has ended (rd.ended),
// then the handler's, which lets go of them when it answers (freeReq).
type stream struct {
	id    uint32
	m     *method
	async bool // answered by its Reply: see flushFor
	// refusal, if set, is the answer of a request that is not a gRPC
	// call (m is nil then): see refusal.go.
	refusal *refusal
	ctx     callCtx // its fields under the connection's mu
	reply   Reply   // an asynchronous call's
	req     *[]byte // the request's bytes as received; nil before the first
	// charged is what the stream counts in the budget: streamCost and
	// req's capacity.
	charged int64

	rd streamReader
	sh streamShared
}

// streamReader is what only the reader touches of a stream.
type streamReader struct {
	recvUsed  int    // bytes received on the stream's window
	recvAcked int    // of those, returned
	ended     bool   // the client's side ended
	stale     bool   // no DATA came since the reader last looked
	openTick  uint64 // c.rd.tick when the stream opened
	// declared is the request's content-length, -1 if it has none;
	// body is the length of the DATA received, padding aside.
	declared, body int64
}

// streamShared is what the reader, the handler and the writers share of
// a stream, under the connection's mu.
type streamShared struct {
	sendWindow  int64
	out         *[]byte // response bytes waiting for the window
	outOff      int
	trailers    []byte // sent once out is
	endData     bool   // out's last DATA frame ends the stream (no trailers)
	headersSent bool
	finished    bool // trailers queued, or the stream reset
	handling    bool // a handler runs
	counted     bool // counted in active
	reset       bool
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{srv: s, nc: nc}
	c.hold = s.opts.Budget.Holder(func() { go c.evicted() })
	c.sh = sharedState{streams: map[uint32]*stream{}, sendWindow: defaultWindow, peerWindow: defaultWindow, maxFrame: readFrameSize}
	c.sh.flushed.L = &c.mu
	c.raw = rawsock.New(nc)
	c.rd.br = bufio.NewReaderSize(deadlineReader{c}, 16<<10)
	c.rd.fr = http2.NewFramer(io.Discard, c.rd.br)
	c.rd.fr.SetReuseFrames()
	c.rd.fr.SetMaxReadFrameSize(readFrameSize)
	c.rd.dec = hpack.NewDecoder(4096, c.field)
	c.rd.dec.SetMaxStringLength(2 * int(s.opts.MaxHeaderListSize))
	return c
}

// deadlineReader reads the socket within the connection's timeouts: the
// read deadline is set once an IdleTimeout; when it passes, the
// connection closes if it was idle all along, or if a response has waited
// for the client's window longer than WriteTimeout, and reads on
// otherwise.
type deadlineReader struct{ c *conn }

func (r deadlineReader) Read(p []byte) (int, error) {
	c := r.c
	for {
		n, err := c.nc.Read(p)
		if n > 0 || err == nil || !isTimeout(err) {
			return n, err
		}
		if !c.keepReading() {
			return n, err
		}
	}
}

// isTimeout reports whether err is a passed deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// keepReading decides, when the read deadline passed, whether the
// connection goes on, and sets the next deadline if so (on the reader).
// The deadline passes every requestTick: each time, a request that has
// not ended RequestTimeout after its HEADERS is reset (CANCEL); every
// readInterval, the connection's other timeouts are looked at (see
// checkTimeouts).
func (c *conn) keepReading() bool {
	rd := &c.rd
	rd.tick++
	tick := c.requestTick()
	limit := uint64(c.srv.opts.RequestTimeout / tick)
	var late []uint32
	c.mu.Lock()
	for id, s := range c.sh.streams {
		if !s.rd.ended && rd.tick-s.rd.openTick > limit {
			late = append(late, id)
		}
	}
	closing := c.sh.closing || c.sh.closed
	c.mu.Unlock()
	if closing {
		return false
	}
	for _, id := range late {
		c.resetStream(id, http2.ErrCodeCancel)
	}
	if time.Duration(rd.tick-rd.checked)*tick < c.readInterval() {
		return c.nc.SetReadDeadline(time.Now().Add(tick)) == nil
	}
	rd.checked = rd.tick
	return c.checkTimeouts()
}

// requestTick is how often the reader looks at the requests' timeouts:
// a quarter of RequestTimeout, so that a request is reset within a
// quarter more than it, or the readInterval if shorter.
func (c *conn) requestTick() time.Duration {
	return min(c.srv.opts.RequestTimeout/4, c.readInterval())
}

// checkTimeouts looks, every readInterval, at a connection's idleness,
// its responses waiting for a window and its requests that get no
// bytes, and reports whether it goes on.
func (c *conn) checkTimeouts() bool {
	opened := c.rd.opened
	c.rd.opened = 0
	c.mu.Lock()
	// A request that got no byte for a whole interval is cut off: its
	// client holds a call's place and sends nothing.
	var stale []uint32
	for id, s := range c.sh.streams {
		if !s.rd.ended {
			if s.rd.stale {
				stale = append(stale, id)
			}
			s.rd.stale = true
		}
	}
	idle := c.sh.active == 0 && opened == 0
	stuck := len(c.sh.blocked) > 0 && time.Since(c.sh.blockedAt) > c.srv.opts.WriteTimeout
	closing := c.sh.closing || c.sh.closed
	c.mu.Unlock()
	if stuck || closing {
		return false
	}
	for _, id := range stale {
		c.resetStream(id, http2.ErrCodeCancel)
	}
	if idle {
		// GOAWAY first, so that the client sends no call into a closing
		// connection (one already on its way is ignored, and the client
		// retries it elsewhere); the connection closes a moment later.
		c.goAway()
		return c.nc.SetReadDeadline(time.Now().Add(drainTime)) == nil
	}
	return c.nc.SetReadDeadline(time.Now().Add(c.requestTick())) == nil
}

// readInterval is how often the reader looks at the connection's timeouts.
func (c *conn) readInterval() time.Duration {
	return min(c.srv.opts.IdleTimeout, max(c.srv.opts.WriteTimeout, time.Second))
}

// connError ends the connection with GOAWAY.
type connError struct {
	code http2.ErrCode
	msg  string
}

func (e connError) Error() string { return fmt.Sprintf("connection error %v: %s", e.code, e.msg) }

// serve reads the connection's frames until it ends.
func (c *conn) serve() {
	defer c.srv.forget(c)
	defer c.endReader()
	err := c.readFrames()
	var ce connError
	var he http2.ConnectionError
	switch {
	case errors.As(err, &ce):
	case errors.As(err, &he):
		ce = connError{http2.ErrCode(he), "malformed frame"}
	case errors.Is(err, http2.ErrFrameTooLarge):
		ce = connError{http2.ErrCodeFrameSize, "frame too large"}
	default:
		c.srv.opts.Log.Debug("grpc connection closed", "err", err)
		c.closeNow()
		return
	}
	c.srv.opts.Log.Debug("grpc connection error", "code", ce.code.String(), "err", ce.msg)
	c.mu.Lock()
	if !c.sh.closed {
		c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 8+len(ce.msg), frameGoAway, 0, 0)
		c.sh.wbuf = appendUint32(c.sh.wbuf, c.sh.maxStream)
		c.sh.wbuf = appendUint32(c.sh.wbuf, uint32(ce.code))
		c.sh.wbuf = append(c.sh.wbuf, ce.msg...)
		c.sh.goingAway, c.sh.lastStream = true, c.sh.maxStream
	}
	c.sh.closing = true
	c.flushLocked()
	// Another goroutine may be writing, and writes the GOAWAY after what
	// it has: half-closing now would lose it.
	for c.sh.flushing && !c.sh.closed {
		c.sh.flushed.Wait()
	}
	c.mu.Unlock()
	c.drain()
}

// drain half-closes the connection, reads what the client still sends
// for a moment, so that it reads the last frames before the socket
// closes, and closes it.
func (c *conn) drain() {
	if tc, ok := c.nc.(interface{ CloseWrite() error }); ok && tc.CloseWrite() == nil {
		_ = c.nc.SetReadDeadline(time.Now().Add(drainTime))
		_, _ = io.Copy(io.Discard, io.LimitReader(c.nc, 1<<20))
	}
	c.closeNow()
}

// readFrames reads the preface and then frames until an error.
func (c *conn) readFrames() error {
	opts := &c.srv.opts
	if err := c.handshake(); err != nil {
		return err
	}
	if err := c.nc.SetReadDeadline(time.Now().Add(opts.PrefaceTimeout)); err != nil {
		return err
	}
	var preface [len(clientPreface)]byte
	if _, err := io.ReadFull(c.rd.br, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != clientPreface {
		return errors.New("no HTTP/2 client preface")
	}
	c.mu.Lock()
	c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 4*6, frameSettings, 0, 0)
	for _, s := range []http2.Setting{
		{ID: http2.SettingMaxConcurrentStreams, Val: opts.MaxConcurrentStreams},
		{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		{ID: http2.SettingMaxHeaderListSize, Val: opts.MaxHeaderListSize},
		{ID: http2.SettingEnablePush, Val: 0},
	} {
		c.sh.wbuf = append(c.sh.wbuf, byte(s.ID>>8), byte(s.ID))
		c.sh.wbuf = appendUint32(c.sh.wbuf, s.Val)
	}
	c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 4, frameWindowUpdate, 0, 0)
	c.sh.wbuf = appendUint32(c.sh.wbuf, connWindow-defaultWindow)
	c.flushLocked()
	c.mu.Unlock()

	// The preface ends with the client's SETTINGS.
	f, err := c.rd.fr.ReadFrame()
	if err != nil {
		return err
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return connError{http2.ErrCodeProtocol, "the client preface lacks SETTINGS"}
	}
	if err := c.settings(sf); err != nil {
		return err
	}
	if err := c.nc.SetReadDeadline(time.Now().Add(c.requestTick())); err != nil {
		return err
	}
	for {
		f, err := c.rd.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.resetStream(se.StreamID, se.Code)
				if c.rd.flooded {
					return errFlood
				}
				if err := c.idleFrame(); err != nil {
					return err
				}
				continue
			}
			return err
		}
		if err := c.frame(f); err != nil {
			return err
		}
		if c.rd.flooded {
			return errFlood
		}
		if err := c.waitBacklog(); err != nil {
			return err
		}
	}
}

// goAway stops the connection taking calls: GOAWAY with the last stream
// it took; it closes once the calls in flight are answered.
func (c *conn) goAway() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sh.goingAway || c.sh.closed {
		return
	}
	c.sh.goingAway, c.sh.lastStream = true, c.sh.maxStream
	c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 8, frameGoAway, 0, 0)
	c.sh.wbuf = appendUint32(c.sh.wbuf, c.sh.lastStream)
	c.sh.wbuf = appendUint32(c.sh.wbuf, uint32(http2.ErrCodeNo))
	if c.sh.active == 0 {
		c.sh.closing = true
	}
	c.flushLocked()
}

// closeNow closes the socket and cancels every call.
func (c *conn) closeNow() {
	c.mu.Lock()
	first := c.closeLocked()
	c.mu.Unlock()
	if first {
		_ = c.nc.Close()
	}
}

// closeLocked marks the connection closed and cancels every call; it
// reports whether it was the first to, and then the caller closes the
// socket once it has released mu (closing a TLS connection writes).
func (c *conn) closeLocked() bool {
	if c.sh.closed {
		return false
	}
	c.sh.closed = true
	c.sh.flushed.Broadcast()
	for _, s := range c.sh.streams {
		s.ctx.endLocked(context.Canceled)
	}
	for _, s := range c.sh.blocked {
		if s.sh.out != nil {
			putBuf(s.sh.out)
			s.sh.out = nil
		}
	}
	c.sh.blocked = nil
	return true
}

// alpnH2 is HTTP/2's ALPN protocol ID over TLS (RFC 9113, section 3.2).
const alpnH2 = "h2"

// handshakeCost is what a TLS handshake holds of Options.Budget while it
// runs: crypto/tls's record buffers (a record is up to 16 KiB, read
// whole) and the handshake's state.
const handshakeCost = 32 << 10

// errNoH2 ends a TLS connection whose client did not negotiate h2.
var errNoH2 = errors.New("the TLS client did not negotiate h2 by ALPN")

// handshake runs the TLS handshake of a TLS connection, within
// PrefaceTimeout and holding handshakeCost of the budget, and requires
// h2 by ALPN: crypto/tls refuses a client that offers only other
// protocols (no_application_protocol), and one that offers none is
// closed here. A cleartext connection has nothing to do.
func (c *conn) handshake() error {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return nil
	}
	if !c.hold.Take(handshakeCost) {
		return errors.New("no room in the memory budget for a TLS handshake")
	}
	defer c.hold.Give(handshakeCost)
	if err := tc.SetDeadline(time.Now().Add(c.srv.opts.PrefaceTimeout)); err != nil {
		return err
	}
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("tls handshake: %w", err)
	}
	if tc.ConnectionState().NegotiatedProtocol != alpnH2 {
		return errNoH2
	}
	return tc.SetWriteDeadline(time.Time{})
}
