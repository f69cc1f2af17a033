package grpcwire

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// clientPreface opens every HTTP/2 connection (RFC 9113, section 3.4).
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// Flow control of what the server receives.
const (
	// streamWindow is the window the server gives each stream; it is
	// returned as the stream's data is read.
	streamWindow = 1 << 20
	// connWindow is the connection's window; it is returned as the
	// requests are handed to their handlers, so that a connection holds
	// at most this much of unfinished requests.
	connWindow = 8 << 20
	// defaultWindow is every window's size before SETTINGS or
	// WINDOW_UPDATE (section 6.9.2).
	defaultWindow = 65535
	maxWindow     = 1<<31 - 1
	// readFrameSize is the largest frame the server reads: the default
	// SETTINGS_MAX_FRAME_SIZE, which it does not raise.
	readFrameSize = 16384
	// maxQueuedControl is how many control frames (acknowledgements,
	// resets) may wait behind a write that does not progress: a client
	// that sends PING, SETTINGS or refused streams without reading the
	// answers is cut off.
	maxQueuedControl = 10000
	// maxPendingStream is how much of a server-streaming call's messages
	// may wait for the client's window before the call ends.
	maxPendingStream = 1 << 20
	// drainTime is how long a closing connection reads on, so that the
	// client reads the last frames before the socket closes.
	drainTime = time.Second
	// maxKeptBlock is the largest header block kept to be recognized
	// when it comes again (see conn.last).
	maxKeptBlock = 1024
)

// Buffers of response messages and of requests.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

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

// conn is one served connection. Its reader (serve) owns the fields
// marked reader; mu guards the rest.
type conn struct {
	srv *Server
	nc  net.Conn
	br  *bufio.Reader
	fr  *http2.Framer
	dec *hpack.Decoder

	// reader
	block    []byte // the header block being received
	blockID  uint32
	blockEnd bool // its HEADERS frame ended the stream
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
	opened     int  // streams opened since the read deadline was last set
	flooded    bool // too many control frames wait: the connection ends

	// raw writes without waiting, for flushFor; nil if the socket has
	// no file descriptor, or the system no non-blocking write authlimit
	// uses (see rawWriter). tryWrite writes tryBuf to it, once.
	raw      syscall.RawConn
	tryWrite func(fd uintptr) bool
	tryBuf   []byte
	tryN     int
	tryErr   error

	mu sync.Mutex
	// flushed is signalled, under mu, when a writer stops flushing.
	flushed     sync.Cond
	streams     map[uint32]*stream
	active      int // calls counted against MaxConcurrentStreams
	maxStream   uint32
	wbuf, spare []byte
	flushing    bool
	wdl         time.Time // the socket's write deadline (by the one writing)
	queued      int       // control frames queued since the last write began
	sendWindow  int64
	peerWindow  int64 // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame    int
	blocked     []*stream
	blockedAt   time.Time // when blocked last became non-empty
	goingAway   bool      // GOAWAY sent: no call beyond lastStream
	lastStream  uint32
	peerGone    bool // the client sent GOAWAY
	closing     bool // the socket is closing once written
	halfClosed  bool // the last frames are written
	closed      bool
}

// stream is one call.
type stream struct {
	id    uint32
	ctx   callCtx // ended under mu
	m     *method
	reply Reply // an asynchronous call's
	async bool  // answered by its Reply: see flushFor

	// reader
	req       *[]byte // the request's bytes as received
	recvUsed  int     // bytes received on the stream's window
	recvAcked int     // of those, returned
	ended     bool    // the client's side ended
	stale     bool    // no DATA came since the reader last looked

	// mu
	sendWindow  int64
	out         *[]byte // response bytes waiting for the window
	outOff      int
	trailers    []byte // sent once out is
	headersSent bool
	finished    bool // trailers queued, or the stream reset
	handling    bool // a handler runs
	counted     bool // counted in active
	reset       bool
}

// reqHeaders is what a request's header block says.
type reqHeaders struct {
	method, path, contentType, timeout, encoding string
	authority, host                              int
	size                                         int
	malformed                                    bool // pseudo-header misplaced, unknown or repeated; connection-specific field; upper-case name
	regular                                      bool // a regular field came
	isGRPC                                       bool
	badTimeout                                   error
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{srv: s, nc: nc, streams: map[uint32]*stream{},
		sendWindow: defaultWindow, peerWindow: defaultWindow, maxFrame: readFrameSize}
	c.flushed.L = &c.mu
	c.raw, c.tryWrite = rawWriter(c, nc)
	c.br = bufio.NewReaderSize(deadlineReader{c}, 16<<10)
	c.fr = http2.NewFramer(io.Discard, c.br)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(readFrameSize)
	c.dec = hpack.NewDecoder(4096, c.field)
	c.dec.SetMaxStringLength(2 * int(s.opts.MaxHeaderListSize))
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
// connection goes on, and sets the next deadline if so.
func (c *conn) keepReading() bool {
	opened := c.opened
	c.opened = 0
	c.mu.Lock()
	// A request that got no byte for a whole interval is cut off: its
	// client holds a call's place and sends nothing.
	var stale []uint32
	for id, s := range c.streams {
		if !s.ended {
			if s.stale {
				stale = append(stale, id)
			}
			s.stale = true
		}
	}
	idle := c.active == 0 && opened == 0
	stuck := len(c.blocked) > 0 && time.Since(c.blockedAt) > c.srv.opts.WriteTimeout
	closing := c.closing || c.closed
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
	return c.nc.SetReadDeadline(time.Now().Add(c.readInterval())) == nil
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
		c.closeNow(err)
		return
	}
	c.srv.opts.Log.Debug("grpc connection error", "code", ce.code.String(), "err", ce.msg)
	c.mu.Lock()
	if !c.closed {
		c.wbuf = appendFrameHeader(c.wbuf, 8+len(ce.msg), frameGoAway, 0, 0)
		c.wbuf = appendUint32(c.wbuf, c.maxStream)
		c.wbuf = appendUint32(c.wbuf, uint32(ce.code))
		c.wbuf = append(c.wbuf, ce.msg...)
		c.goingAway, c.lastStream = true, c.maxStream
	}
	c.closing = true
	c.flushLocked()
	// Another goroutine may be writing, and writes the GOAWAY after what
	// it has: half-closing now would lose it.
	c.mu.Lock()
	for c.flushing && !c.closed {
		c.flushed.Wait()
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
	c.closeNow(errors.New("connection closed"))
}

// readFrames reads the preface and then frames until an error.
func (c *conn) readFrames() error {
	opts := &c.srv.opts
	if err := c.nc.SetReadDeadline(time.Now().Add(opts.PrefaceTimeout)); err != nil {
		return err
	}
	var preface [len(clientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != clientPreface {
		return errors.New("no HTTP/2 client preface")
	}
	c.mu.Lock()
	c.wbuf = appendFrameHeader(c.wbuf, 4*6, frameSettings, 0, 0)
	for _, s := range []http2.Setting{
		{ID: http2.SettingMaxConcurrentStreams, Val: opts.MaxConcurrentStreams},
		{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		{ID: http2.SettingMaxHeaderListSize, Val: opts.MaxHeaderListSize},
		{ID: http2.SettingEnablePush, Val: 0},
	} {
		c.wbuf = append(c.wbuf, byte(s.ID>>8), byte(s.ID))
		c.wbuf = appendUint32(c.wbuf, s.Val)
	}
	c.wbuf = appendFrameHeader(c.wbuf, 4, frameWindowUpdate, 0, 0)
	c.wbuf = appendUint32(c.wbuf, connWindow-defaultWindow)
	c.flushLocked()

	// The preface ends with the client's SETTINGS.
	f, err := c.fr.ReadFrame()
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
	if err := c.nc.SetReadDeadline(time.Now().Add(c.readInterval())); err != nil {
		return err
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.resetStream(se.StreamID, se.Code)
				if c.flooded {
					return errFlood
				}
				continue
			}
			return err
		}
		if err := c.frame(f); err != nil {
			return err
		}
		if c.flooded {
			return errFlood
		}
	}
}

// frame handles one frame.
func (c *conn) frame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		return c.data(f)
	case *http2.HeadersFrame:
		if f.StreamID%2 == 0 {
			return connError{http2.ErrCodeProtocol, "even stream id"}
		}
		c.block = append(c.block[:0], f.HeaderBlockFragment()...)
		c.blockID, c.blockEnd = f.StreamID, f.StreamEnded()
		if f.HeadersEnded() {
			return c.headers()
		}
		return c.checkBlock()
	case *http2.ContinuationFrame:
		c.block = append(c.block, f.HeaderBlockFragment()...)
		if f.HeadersEnded() {
			return c.headers()
		}
		return c.checkBlock()
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		return c.settings(f)
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		c.mu.Lock()
		c.wbuf = appendFrameHeader(c.wbuf, 8, framePing, flagAck, 0)
		c.wbuf = append(c.wbuf, f.Data[:]...)
		return c.control()
	case *http2.WindowUpdateFrame:
		return c.windowUpdate(f)
	case *http2.RSTStreamFrame:
		return c.rstStream(f)
	case *http2.GoAwayFrame:
		c.mu.Lock()
		c.peerGone = true
		if c.active == 0 {
			c.closing = true
		}
		closing := c.closing
		c.flushLocked()
		if closing {
			return errors.New("client went away")
		}
		return nil
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE from a client"}
	default:
		// PRIORITY and unknown frame types are ignored (section 5.5).
		return nil
	}
}

// checkBlock bounds a header block: compressed, it may not be larger
// than twice the header list it may decode to.
func (c *conn) checkBlock() error {
	if len(c.block) > 2*int(c.srv.opts.MaxHeaderListSize) {
		return connError{http2.ErrCodeEnhanceYourCalm, "header block too large"}
	}
	return nil
}

// control ends the queueing of a control frame (c.mu held): it writes it
// unless a write is under way, and cuts the connection off when too many
// wait behind one.
func (c *conn) control() error {
	c.queued++
	if c.queued > maxQueuedControl {
		c.flooded = true
		c.mu.Unlock()
		return errFlood
	}
	c.flushLocked()
	return nil
}

// errFlood ends a connection whose client does not read the answers to
// its control frames.
var errFlood = connError{http2.ErrCodeEnhanceYourCalm, "too many control frames unanswered"}

// settings applies the client's SETTINGS and acknowledges them.
func (c *conn) settings(f *http2.SettingsFrame) error {
	c.mu.Lock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				return connError{http2.ErrCode(ce), "invalid setting " + s.String()}
			}
			return connError{http2.ErrCodeProtocol, "invalid setting " + s.String()}
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerWindow
			c.peerWindow = int64(s.Val)
			for _, st := range c.streams {
				st.sendWindow += delta
				if st.sendWindow > maxWindow {
					return connError{http2.ErrCodeFlowControl, "stream window overflow"}
				}
			}
		case http2.SettingMaxFrameSize:
			c.maxFrame = int(s.Val)
		}
		// HEADER_TABLE_SIZE needs nothing: responses never use the
		// dynamic table.
		return nil
	})
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.pushBlocked()
	c.wbuf = appendFrameHeader(c.wbuf, 0, frameSettings, flagAck, 0)
	return c.control()
}

// windowUpdate opens a send window.
func (c *conn) windowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	if f.StreamID == 0 {
		c.sendWindow += int64(f.Increment)
		if c.sendWindow > maxWindow {
			c.mu.Unlock()
			return connError{http2.ErrCodeFlowControl, "connection window overflow"}
		}
	} else if s := c.streams[f.StreamID]; s != nil {
		s.sendWindow += int64(f.Increment)
		if s.sendWindow > maxWindow {
			c.mu.Unlock()
			c.resetStream(f.StreamID, http2.ErrCodeFlowControl)
			return nil
		}
	} else if f.StreamID > c.maxStream {
		c.mu.Unlock()
		return connError{http2.ErrCodeProtocol, "WINDOW_UPDATE on an idle stream"}
	}
	c.pushBlocked()
	c.flushLocked()
	return nil
}

// discard returns to the connection's window the request bytes of a
// stream being reset before its client's side ended (on the reader).
func (c *conn) discard(id uint32) {
	c.mu.Lock()
	s := c.streams[id]
	c.mu.Unlock()
	if s != nil && !s.ended {
		s.ended = true
		c.release(len(*s.req))
	}
}

// rstStream cancels a call.
func (c *conn) rstStream(f *http2.RSTStreamFrame) error {
	c.discard(f.StreamID)
	c.mu.Lock()
	if f.StreamID > c.maxStream {
		c.mu.Unlock()
		return connError{http2.ErrCodeProtocol, "RST_STREAM on an idle stream"}
	}
	if s := c.streams[f.StreamID]; s != nil {
		c.dropLocked(s)
	}
	c.flushLocked()
	return nil
}

// resetStream resets a stream with code (on the reader).
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.discard(id)
	c.mu.Lock()
	if s := c.streams[id]; s != nil {
		c.dropLocked(s)
	}
	c.wbuf = appendFrameHeader(c.wbuf, 4, frameRSTStream, 0, id)
	c.wbuf = appendUint32(c.wbuf, uint32(code))
	_ = c.control()
}

// dropLocked forgets a stream that was reset: its call's context is
// cancelled, and it counts against MaxConcurrentStreams until its handler
// returns.
func (c *conn) dropLocked(s *stream) {
	s.reset = true
	s.ctx.endLocked(context.Canceled)
	if s.out != nil {
		putBuf(s.out)
		s.out = nil
	}
	delete(c.streams, s.id)
	c.finishLocked(s)
}

// finishLocked ends a stream's count once it is finished and its handler
// returned; the connection closes after its last call once it is going
// away.
func (c *conn) finishLocked(s *stream) {
	s.finished = true
	if s.handling || !s.counted {
		return
	}
	s.counted = false
	c.active--
	if c.active == 0 && (c.goingAway || c.peerGone) {
		c.closing = true
	}
}

// headers handles a complete header block.
func (c *conn) headers() error {
	if err := c.checkBlock(); err != nil {
		return err
	}
	id := c.blockID
	if len(c.last) == 0 || !bytes.Equal(c.block, c.last) {
		c.hdr = reqHeaders{}
		if _, err := c.dec.Write(c.block); err != nil {
			return connError{http2.ErrCodeCompression, "header block: " + err.Error()}
		}
		if err := c.dec.Close(); err != nil {
			return connError{http2.ErrCodeCompression, "header block: " + err.Error()}
		}
		c.last = c.last[:0]
		if len(c.block) <= maxKeptBlock && standalone(c.block) {
			c.last, c.lastHdr = append(c.last, c.block...), c.hdr
		}
	} else {
		c.hdr = c.lastHdr
	}
	if cap(c.block) > 64<<10 {
		c.block = nil
	}
	c.mu.Lock()
	if s := c.streams[id]; s != nil {
		// Trailers from the client: they must end the stream.
		c.mu.Unlock()
		if !c.blockEnd || s.ended {
			c.resetStream(id, http2.ErrCodeProtocol)
			return nil
		}
		return c.endRequest(s)
	}
	if id <= c.maxStream {
		c.mu.Unlock()
		return connError{http2.ErrCodeStreamClosed, "HEADERS on a closed stream"}
	}
	c.maxStream = id
	if c.goingAway && id > c.lastStream {
		// Sent after GOAWAY: ignored (section 6.8).
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	c.opened++
	h := &c.hdr
	switch {
	case h.size > int(c.srv.opts.MaxHeaderListSize):
		c.abort(id, status.New(codes.Internal, "header list larger than SETTINGS_MAX_HEADER_LIST_SIZE"), 431)
		return nil
	case h.authority > 1 || h.host > 1:
		c.abort(id, status.New(codes.Internal, "more than one :authority or host"), 400)
		return nil
	case h.malformed:
		c.resetStream(id, http2.ErrCodeProtocol)
		return nil
	case !h.isGRPC:
		c.abort(id, status.Newf(codes.InvalidArgument, "invalid gRPC request content-type %q", h.contentType), 415)
		return nil
	case h.badTimeout != nil:
		c.abort(id, status.Newf(codes.Internal, "malformed grpc-timeout: %v", h.badTimeout), 400)
		return nil
	case h.authority == 0 && h.host == 0:
		c.abort(id, status.New(codes.Internal, "no host or :authority header present"), 400)
		return nil
	}
	c.mu.Lock()
	full := c.active >= int(c.srv.opts.MaxConcurrentStreams)
	c.mu.Unlock()
	if full {
		c.resetStream(id, http2.ErrCodeRefusedStream)
		return nil
	}
	if h.method != "POST" {
		c.abort(id, status.Newf(codes.Internal, "http2Server.operateHeaders parsed a :method field: %v which should be POST", h.method), 405)
		return nil
	}
	m := c.srv.methods[h.path]
	if m == nil {
		c.abort(id, unknownMethod(c.srv, h.path), 200)
		return nil
	}
	if h.encoding != "" && h.encoding != "identity" {
		c.abort(id, status.Newf(codes.Unimplemented, "grpc: Decompressor is not installed for grpc-encoding %q", h.encoding), 200)
		return nil
	}
	var timeout time.Duration
	if h.timeout != "" {
		timeout, _ = parseTimeout(h.timeout)
		if timeout <= 0 {
			c.abort(id, status.New(codes.DeadlineExceeded, context.DeadlineExceeded.Error()), 200)
			return nil
		}
	}
	s := &stream{id: id, m: m, req: getBuf(), counted: true}
	s.ctx.c = c
	if h.timeout != "" {
		s.ctx.deadline = time.Now().Add(timeout)
	}
	c.mu.Lock()
	if c.closed {
		s.ctx.endLocked(context.Canceled)
	}
	s.sendWindow = c.peerWindow
	c.streams[id] = s
	c.active++
	c.mu.Unlock()
	if c.blockEnd {
		return c.endRequest(s)
	}
	return nil
}

// unknownMethod is the status of a call to no registered method, as
// grpc-go words it.
func unknownMethod(srv *Server, path string) *status.Status {
	svc, name, ok := splitMethod(path)
	if !ok {
		return status.Newf(codes.Unimplemented, "malformed method name: %q", path)
	}
	if srv.services[svc] {
		return status.Newf(codes.Unimplemented, "unknown method %v for service %v", name, svc)
	}
	return status.Newf(codes.Unimplemented, "unknown service %v", svc)
}

// field takes one decoded header field.
func (c *conn) field(f hpack.HeaderField) {
	h := &c.hdr
	h.size += len(f.Name) + len(f.Value) + 32
	if h.size > int(c.srv.opts.MaxHeaderListSize) {
		return
	}
	if strings.HasPrefix(f.Name, ":") {
		if h.regular {
			h.malformed = true
			return
		}
		var p *string
		switch f.Name {
		case ":method":
			p = &h.method
		case ":path":
			p = &h.path
		case ":authority":
			h.authority++
			return
		case ":scheme":
			return
		default:
			h.malformed = true
			return
		}
		if *p != "" {
			h.malformed = true
		}
		*p = f.Value
		return
	}
	h.regular = true
	switch f.Name {
	case "content-type":
		h.contentType = f.Value
		h.isGRPC = isGRPCContentType(f.Value)
	case "grpc-timeout":
		h.timeout = f.Value
		if _, err := parseTimeout(f.Value); err != nil {
			h.badTimeout = err
		}
	case "grpc-encoding":
		h.encoding = f.Value
	case "host":
		h.host++
	case "te":
		if f.Value != "trailers" {
			h.malformed = true
		}
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
		h.malformed = true
	default:
		for i := 0; i < len(f.Name); i++ {
			if 'A' <= f.Name[i] && f.Name[i] <= 'Z' {
				h.malformed = true
			}
		}
	}
}

// isGRPCContentType reports whether v is application/grpc, alone or with a
// subtype ("+proto") or parameters.
func isGRPCContentType(v string) bool {
	rest, ok := strings.CutPrefix(v, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// abort answers a stream at once with a trailers-only response and, when
// the client's side is still open, resets it (NO_ERROR): the server needs
// nothing more.
func (c *conn) abort(id uint32, st *status.Status, httpStatus int) {
	c.mu.Lock()
	c.wbuf = appendHeaderBlock(c.wbuf, id, appendStatus(nil, st, true, httpStatus), true, c.maxFrame)
	if !c.blockEnd {
		c.wbuf = appendFrameHeader(c.wbuf, 4, frameRSTStream, 0, id)
		c.wbuf = appendUint32(c.wbuf, uint32(http2.ErrCodeNo))
	}
	_ = c.control()
}

// data takes a DATA frame.
func (c *conn) data(f *http2.DataFrame) error {
	n := int(f.Length)
	c.connRecv += n
	if c.connRecv > connWindow {
		return connError{http2.ErrCodeFlowControl, "connection window exceeded"}
	}
	c.mu.Lock()
	s := c.streams[f.StreamID]
	idle := f.StreamID > c.maxStream
	c.mu.Unlock()
	if s == nil || s.ended {
		c.release(n)
		switch {
		case idle:
			return connError{http2.ErrCodeProtocol, "DATA on an idle stream"}
		case s != nil:
			// Half-closed by the client, whose call runs.
			c.resetStream(f.StreamID, http2.ErrCodeStreamClosed)
		}
		// A stream already closed: ignored, but counted (section 5.1).
		return nil
	}
	s.recvUsed += n
	s.stale = false
	if s.recvUsed-s.recvAcked > streamWindow {
		c.release(n)
		c.resetStream(s.id, http2.ErrCodeFlowControl)
		return nil
	}
	data := f.Data()
	c.release(n - len(data)) // padding
	*s.req = append(*s.req, data...)
	if st := c.checkMessage(s); st != nil {
		c.release(len(*s.req))
		c.answerEarly(s, st, f.StreamEnded())
		return nil
	}
	if f.StreamEnded() {
		return c.endRequest(s)
	}
	if unacked := s.recvUsed - s.recvAcked; unacked >= streamWindow/2 {
		s.recvAcked = s.recvUsed
		c.mu.Lock()
		c.wbuf = appendFrameHeader(c.wbuf, 4, frameWindowUpdate, 0, s.id)
		c.wbuf = appendUint32(c.wbuf, uint32(unacked))
		c.flushLocked()
	}
	return nil
}

// release returns n received bytes to the connection's window, in
// WINDOW_UPDATEs of at least a quarter of it.
func (c *conn) release(n int) {
	c.connUnused += n
	if c.connUnused < connWindow/4 {
		return
	}
	inc := c.connUnused
	c.connUnused, c.connRecv = 0, c.connRecv-inc
	c.mu.Lock()
	c.wbuf = appendFrameHeader(c.wbuf, 4, frameWindowUpdate, 0, 0)
	c.wbuf = appendUint32(c.wbuf, uint32(inc))
	c.flushLocked()
}

// checkMessage looks at a request's bytes as they come: a message larger
// than the limit, or a second one, is answered at once.
func (c *conn) checkMessage(s *stream) *status.Status {
	b := *s.req
	if len(b) < 5 {
		return nil
	}
	size := int(b[1])<<24 | int(b[2])<<16 | int(b[3])<<8 | int(b[4])
	if max := c.srv.opts.MaxRecvMsgSize; size > max {
		return status.Newf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", size, max)
	}
	if len(b) > 5+size {
		return status.New(codes.Internal, "cardinality violation: received multiple request messages for non-client-streaming RPC")
	}
	return nil
}

// answerEarly answers a stream whose request is refused, before its
// handler runs.
func (c *conn) answerEarly(s *stream, st *status.Status, ended bool) {
	s.ended = true
	putBuf(s.req)
	s.req = nil
	c.mu.Lock()
	s.ctx.endLocked(context.Canceled)
	delete(c.streams, s.id)
	c.wbuf = appendHeaderBlock(c.wbuf, s.id, appendStatus(nil, st, true, 200), true, c.maxFrame)
	if !ended {
		c.wbuf = appendFrameHeader(c.wbuf, 4, frameRSTStream, 0, s.id)
		c.wbuf = appendUint32(c.wbuf, uint32(http2.ErrCodeNo))
	}
	c.finishLocked(s)
	_ = c.control()
}

// endRequest starts the handler of a request the client ended.
func (c *conn) endRequest(s *stream) error {
	s.ended = true
	b := *s.req
	c.release(len(b))
	var st *status.Status
	switch {
	case len(b) == 0:
		st = status.New(codes.Internal, "cardinality violation: received no request message from non-client-streaming RPC")
	case len(b) < 5 || len(b) < 5+(int(b[1])<<24|int(b[2])<<16|int(b[3])<<8|int(b[4])):
		st = status.New(codes.Internal, "grpc: the request ended within a message")
	case b[0] == 1:
		// A grpc-encoding other than identity was refused at once.
		st = status.New(codes.Internal, "grpc: compressed flag set with identity or empty encoding")
	case b[0] > 1:
		st = status.Newf(codes.Internal, "grpc: received unexpected payload format %d", b[0])
	}
	if st != nil {
		c.answerEarly(s, st, true)
		return nil
	}
	c.mu.Lock()
	if s.reset {
		c.mu.Unlock()
		return nil
	}
	s.handling = true
	c.mu.Unlock()
	if s.m.async != nil && c.startAsync(s) {
		return nil
	}
	c.srv.start(c, s)
	return nil
}

// Reply answers a call taken by an asynchronous handler (UnaryRawAsync).
type Reply struct {
	c    *conn
	s    *stream
	out  *[]byte
	sent atomic.Bool
}

// Send answers the call: out, the response message appended to the out
// start was given, and OK; or err's status, as a unary handler's error.
// Only the first Send of a call counts. The request's bytes are not
// valid once it is called.
func (r *Reply) Send(out []byte, err error) {
	if !r.sent.CompareAndSwap(false, true) {
		return
	}
	*r.out = out
	r.c.answer(r.s, r.out, err)
}

// startAsync runs a call's asynchronous start on the reader, and reports
// whether it took the call.
func (c *conn) startAsync(s *stream) (taken bool) {
	out := getBuf()
	s.reply.c, s.reply.s, s.reply.out = c, s, out
	defer func() {
		if p := recover(); p != nil {
			c.srv.opts.Log.Error("grpc handler panicked", "stream", s.id, "panic", fmt.Sprint(p))
			s.reply.Send(nil, status.Error(codes.Internal, "the handler failed"))
			taken = true
		}
	}()
	s.async = true
	if s.m.async(&s.ctx, (*s.req)[5:], append((*out)[:0], 0, 0, 0, 0, 0), &s.reply) {
		return true
	}
	s.async = false
	s.reply = Reply{}
	putBuf(out)
	return false
}

// run runs a call's handler and writes its answer.
func (c *conn) run(s *stream) {
	req := (*s.req)[5:]
	out := getBuf()
	defer func() {
		if p := recover(); p != nil {
			c.srv.opts.Log.Error("grpc handler panicked", "stream", s.id, "panic", fmt.Sprint(p))
			c.respond(s, out, status.New(codes.Internal, "the handler failed"))
		}
	}()
	if s.m.stream != nil {
		c.respond(s, out, errStatus(s.m.stream(&s.ctx, req, func(m proto.Message) error { return c.send(s, m) })))
		return
	}
	b := append((*out)[:0], 0, 0, 0, 0, 0)
	b, err := s.m.unary(&s.ctx, req, b)
	*out = b
	c.answer(s, out, err)
}

// answer writes a unary call's answer: the message in out (after its 5
// bytes of gRPC framing), or err's status.
func (c *conn) answer(s *stream, out *[]byte, err error) {
	switch {
	case err != nil:
		c.respond(s, out, errStatus(err))
	case !s.ctx.deadline.IsZero() && s.ctx.Err() == context.DeadlineExceeded:
		c.respond(s, out, status.New(codes.DeadlineExceeded, context.DeadlineExceeded.Error()))
	default:
		b := *out
		size := len(b) - 5
		b[1], b[2], b[3], b[4] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
		c.respond(s, out, nil)
	}
}

// send sends one message of a server-streaming call.
func (c *conn) send(s *stream, m proto.Message) error {
	out := getBuf()
	b, err := proto.MarshalOptions{}.MarshalAppend(append((*out)[:0], 0, 0, 0, 0, 0), m)
	if err != nil {
		putBuf(out)
		return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	size := len(b) - 5
	b[1], b[2], b[3], b[4] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	*out = b
	c.mu.Lock()
	if s.reset || c.closed {
		c.mu.Unlock()
		putBuf(out)
		return status.FromContextError(context.Canceled).Err()
	}
	if s.out != nil && len(*s.out)-s.outOff > maxPendingStream {
		c.mu.Unlock()
		putBuf(out)
		return status.Error(codes.ResourceExhausted, "the client reads no messages")
	}
	if !s.headersSent {
		s.headersSent = true
		c.wbuf = appendHeaderBlock(c.wbuf, s.id, responseHeaders, false, c.maxFrame)
	}
	c.queueLocked(s, out)
	c.flushLocked()
	return nil
}

// errStatus is the status of a handler's error.
func errStatus(err error) *status.Status {
	if err == nil {
		return status.New(codes.OK, "")
	}
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// respond writes a call's answer: out's message then OK, or st.
func (c *conn) respond(s *stream, out *[]byte, st *status.Status) {
	putBuf(s.req)
	s.req = nil
	c.mu.Lock()
	s.handling = false
	// The call has ended: so has its context, as grpc-go ends it.
	s.ctx.endLocked(context.Canceled)
	if s.reset || c.closed {
		putBuf(out)
		c.finishLocked(s)
		c.flushFor(s)
		return
	}
	if st != nil {
		// An error, or the end of a server-streaming call.
		putBuf(out)
		s.trailers = appendStatus(nil, st, !s.headersSent, 200)
		if s.out == nil {
			c.wbuf = appendHeaderBlock(c.wbuf, s.id, s.trailers, true, c.maxFrame)
			s.trailers = nil
			delete(c.streams, s.id)
			c.finishLocked(s)
		} else {
			c.pushLocked(s)
		}
		c.flushFor(s)
		return
	}
	if !s.headersSent {
		s.headersSent = true
		c.wbuf = appendHeaderBlock(c.wbuf, s.id, responseHeaders, false, c.maxFrame)
	}
	b := *out
	if s.out == nil && len(b) <= c.maxFrame && int64(len(b)) <= c.sendWindow && int64(len(b)) <= s.sendWindow {
		// The common case: the message fits in one frame and the windows.
		c.wbuf = appendFrameHeader(c.wbuf, len(b), frameData, 0, s.id)
		c.wbuf = append(c.wbuf, b...)
		c.sendWindow -= int64(len(b))
		s.sendWindow -= int64(len(b))
		putBuf(out)
		c.wbuf = appendHeaderBlock(c.wbuf, s.id, okTrailers, true, c.maxFrame)
		delete(c.streams, s.id)
		c.finishLocked(s)
		c.flushFor(s)
		return
	}
	s.trailers = okTrailers
	c.queueLocked(s, out)
	c.flushFor(s)
}

// queueLocked adds out to what s sends, sends what the windows allow, and
// keeps the rest for a WINDOW_UPDATE.
func (c *conn) queueLocked(s *stream, out *[]byte) {
	if s.out == nil {
		s.out, s.outOff = out, 0
	} else {
		*s.out = append((*s.out)[s.outOff:], *out...)
		s.outOff = 0
		putBuf(out)
	}
	if !c.pushLocked(s) {
		if len(c.blocked) == 0 {
			c.blockedAt = time.Now()
		}
		for _, b := range c.blocked {
			if b == s {
				return
			}
		}
		c.blocked = append(c.blocked, s)
	}
}

// pushLocked sends what the windows allow of s's waiting bytes, then its
// trailers if it has them; it reports whether nothing waits.
func (c *conn) pushLocked(s *stream) bool {
	if s.reset {
		return true
	}
	for s.out != nil && s.outOff < len(*s.out) {
		n := min(int64(len(*s.out)-s.outOff), int64(c.maxFrame), c.sendWindow, s.sendWindow)
		if n <= 0 {
			return false
		}
		c.wbuf = appendFrameHeader(c.wbuf, int(n), frameData, 0, s.id)
		c.wbuf = append(c.wbuf, (*s.out)[s.outOff:s.outOff+int(n)]...)
		s.outOff += int(n)
		c.sendWindow -= n
		s.sendWindow -= n
	}
	if s.out != nil {
		putBuf(s.out)
		s.out = nil
	}
	if s.trailers != nil {
		c.wbuf = appendHeaderBlock(c.wbuf, s.id, s.trailers, true, c.maxFrame)
		s.trailers = nil
		delete(c.streams, s.id)
		c.finishLocked(s)
	}
	return true
}

// pushBlocked sends what the windows now allow of the blocked streams.
func (c *conn) pushBlocked() {
	kept := c.blocked[:0]
	for _, s := range c.blocked {
		if !c.pushLocked(s) {
			kept = append(kept, s)
		}
	}
	clear(c.blocked[len(kept):])
	if len(kept) > 0 && len(kept) < len(c.blocked) {
		c.blockedAt = time.Now()
	}
	c.blocked = kept
}

// flushLocked writes what is queued, unless another goroutine is writing
// (it then writes this too), and releases c.mu. Once the connection is
// closing and nothing is left to write or to answer, it closes it.
func (c *conn) flushLocked() {
	if c.flushing || c.closed {
		c.mu.Unlock()
		return
	}
	c.flushing = true
	for len(c.wbuf) > 0 && !c.closed {
		b := c.wbuf
		c.wbuf, c.queued = c.spare[:0], 0
		c.mu.Unlock()
		err := c.writeDeadline()
		if err == nil {
			_, err = c.nc.Write(b)
		}
		c.mu.Lock()
		if cap(b) <= keptBuf {
			c.spare = b[:0]
		} else {
			c.spare = nil
		}
		if err != nil {
			c.flushing = false
			c.flushed.Broadcast()
			c.mu.Unlock()
			c.closeNow(err)
			return
		}
	}
	c.flushing = false
	c.flushed.Broadcast()
	end := c.closing && c.active == 0 && !c.closed && !c.halfClosed
	if end {
		c.halfClosed = true
	}
	c.mu.Unlock()
	if end {
		// Ends the reader, which half-closes and drains.
		if tc, ok := c.nc.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		_ = c.nc.SetReadDeadline(time.Now().Add(drainTime))
	}
}

// flushFor writes what is queued, as flushLocked does, for stream s. An
// asynchronous call's answer is written by whoever completed its
// decision, which may answer many calls of many connections in turn: it
// must not wait for one client's socket. It writes what the socket takes
// at once, and leaves the rest, if any, to a goroutine of its own, which
// waits as flushLocked does.
func (c *conn) flushFor(s *stream) {
	if !s.async || c.raw == nil || c.flushing || c.closed || len(c.wbuf) == 0 {
		c.flushLocked()
		return
	}
	c.tryBuf, c.tryN, c.tryErr = c.wbuf, 0, nil
	err := c.raw.Write(c.tryWrite)
	c.tryBuf = nil
	if err != nil || c.tryErr != nil && c.tryErr != syscall.EAGAIN {
		c.flushLocked() // it writes again, and meets the error
		return
	}
	n := max(c.tryN, 0)
	c.wbuf = c.wbuf[:copy(c.wbuf, c.wbuf[n:])]
	c.queued = 0
	if len(c.wbuf) == 0 {
		c.flushLocked() // nothing left to write: whatever ends the connection
		return
	}
	c.flushing = true
	c.mu.Unlock()
	go func() {
		c.mu.Lock()
		c.flushing = false
		c.flushLocked()
	}()
}

// writeDeadline gives the next write at least half of WriteTimeout, and
// at most all of it: the socket's deadline is moved only when less than
// half is left, not on every write (called by the one writing).
func (c *conn) writeDeadline() error {
	now, t := time.Now(), c.srv.opts.WriteTimeout
	if c.wdl.Sub(now) >= t/2 {
		return nil
	}
	c.wdl = now.Add(t)
	return c.nc.SetWriteDeadline(c.wdl)
}

// goAway stops the connection taking calls: GOAWAY with the last stream
// it took; it closes once the calls in flight are answered.
func (c *conn) goAway() {
	c.mu.Lock()
	if c.goingAway || c.closed {
		c.mu.Unlock()
		return
	}
	c.goingAway, c.lastStream = true, c.maxStream
	c.wbuf = appendFrameHeader(c.wbuf, 8, frameGoAway, 0, 0)
	c.wbuf = appendUint32(c.wbuf, c.lastStream)
	c.wbuf = appendUint32(c.wbuf, uint32(http2.ErrCodeNo))
	if c.active == 0 {
		c.closing = true
	}
	c.flushLocked()
}

// closeNow closes the socket and cancels every call.
func (c *conn) closeNow(error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	for _, s := range c.streams {
		s.ctx.endLocked(context.Canceled)
	}
	for _, s := range c.blocked {
		if s.out != nil {
			putBuf(s.out)
			s.out = nil
		}
	}
	c.blocked = nil
	c.mu.Unlock()
	_ = c.nc.Close()
}
