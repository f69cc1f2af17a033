package spoa

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/authlimit/authlimit/internal/conncap"
	"github.com/authlimit/authlimit/internal/membudget"
)

// Handler answers NOTIFY frames.
type Handler interface {
	// Notify is given the LIST-OF-MESSAGES of one NOTIFY frame, valid
	// only until it returns, and answers it, then or later, with one
	// call of r.Send. The connection reads its next frame once Notify
	// returns.
	Notify(messages []byte, r Reply)
}

// Options configure a Server. Zero values take the defaults.
type Options struct {
	// Handler answers NOTIFY frames. Required.
	Handler Handler
	// Trusted are the addresses HAProxy connects from; a connection from
	// any other is closed at once, before it is read. Empty trusts none.
	Trusted []netip.Prefix
	// MaxFrameSize is the largest frame the agent takes: the
	// max-frame-size it answers is the lesser of this and HAProxy's.
	// Default 65532 (HAProxy's tune.bufsize of 64 KiB less 4); at least
	// 256.
	MaxFrameSize int
	// MaxInFlight bounds the NOTIFY frames of one connection that are
	// being decided or whose ACK waits to be written: the connection
	// reads no further frame until one is answered. Default 256 (HAProxy
	// keeps 20 in flight per connection by default).
	MaxInFlight int
	// MaxInFlightTotal is the same bound over all connections together.
	// Default 16384.
	MaxInFlightTotal int
	// Budget bounds the bytes held for frames larger than a connection's
	// read buffer (4 KiB) over all connections, and over the other ports
	// that share it (AUTHLIMIT_MAX_BUFFERED_BYTES): each connection is a
	// holder, evicted (closed) when it holds the most and another's
	// request needs room (see membudget). Nil bounds them only per
	// connection: one frame of at most MaxFrameSize at a time.
	Budget *membudget.Budget
	// Conns caps the open connections, with other listeners sharing it;
	// nil takes every connection.
	Conns *conncap.Cap
	// HelloTimeout bounds the wait for HAPROXY-HELLO. Default 10s.
	HelloTimeout time.Duration
	// IdleTimeout bounds the wait for a frame between two. It should
	// exceed HAProxy's own (timeout idle in 2.x, the backend's timeout
	// server in 3.1+), so that HAProxy, not the agent, closes an idle
	// connection and no NOTIFY crosses the agent's close. Default 2m.
	IdleTimeout time.Duration
	// FrameTimeout bounds the reading of a frame once its first bytes
	// came. Default 10s.
	FrameTimeout time.Duration
	// WriteTimeout bounds a write of ACK frames. Default 10s.
	WriteTimeout time.Duration
	// Accepted is called for every connection accepted; Refused for
	// every connection closed at once because its peer is not trusted.
	Accepted, Refused func()
	// ProtocolError is called with the status of every AGENT-DISCONNECT
	// the agent sends for a protocol error.
	ProtocolError func(status int)
	// Log logs refused peers (at most one line every 10s with the count
	// of the others) and protocol errors (at debug). Default: discard.
	Log *slog.Logger
}

// Defaults of Options.
const (
	DefaultMaxFrameSize     = 65532
	DefaultMaxInFlight      = 256
	DefaultMaxInFlightTotal = 16384
)

// readBufferSize is a connection's read buffer: a frame that fits is read
// in place; a larger one is read into a buffer from the budget.
const readBufferSize = 4 << 10

// maxPending bounds the ACK bytes a connection holds unwritten: beyond it
// the connection reads no further frame until they are written.
const maxPending = 256 << 10

// ErrServerClosed is what Serve returns once Shutdown or Close was called.
var ErrServerClosed = errors.New("spoa: server closed")

// Server serves SPOP to HAProxy. Build it with NewServer.
type Server struct {
	opts  Options
	slots chan struct{} // a token per NOTIFY in flight, over all connections

	refusedLog logEvery

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closed    bool
	// stopping is closed by Shutdown: connections answer what they
	// have in flight, say AGENT-DISCONNECT and close.
	stopping chan struct{}
	// deadline is when Shutdown gives up waiting (its context's).
	deadline atomic.Pointer[time.Time]
	wg       sync.WaitGroup
}

// NewServer returns a Server with opts, defaults filled in.
func NewServer(opts Options) (*Server, error) {
	if opts.Handler == nil {
		return nil, errors.New("spoa: no handler")
	}
	if opts.MaxFrameSize == 0 {
		opts.MaxFrameSize = DefaultMaxFrameSize
	}
	if opts.MaxFrameSize < minFrameSize {
		return nil, errors.New("spoa: a max frame size below 256")
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.MaxInFlightTotal <= 0 {
		opts.MaxInFlightTotal = DefaultMaxInFlightTotal
	}
	for _, d := range []*time.Duration{&opts.HelloTimeout, &opts.FrameTimeout, &opts.WriteTimeout} {
		if *d <= 0 {
			*d = 10 * time.Second
		}
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 2 * time.Minute
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	for _, f := range []*func(){&opts.Accepted, &opts.Refused} {
		if *f == nil {
			*f = func() {}
		}
	}
	if opts.ProtocolError == nil {
		opts.ProtocolError = func(int) {}
	}
	return &Server{
		opts:      opts,
		slots:     make(chan struct{}, opts.MaxInFlightTotal),
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
		stopping:  make(chan struct{}),
	}, nil
}

// Serve accepts connections on l and serves each until it closes, or the
// Server is shut down. It returns ErrServerClosed after Shutdown or Close,
// and any other error of Accept that is not temporary.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	var wait time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || temporary(err) {
				wait = min(max(2*wait, 5*time.Millisecond), time.Second)
				time.Sleep(wait)
				continue
			}
			return err
		}
		wait = 0
		s.accept(nc)
	}
}

// temporary reports whether err says it is temporary (as accept's EMFILE
// does): accepting again after a wait may succeed.
func temporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// accept takes a new connection: from a trusted peer, within the
// connection cap, it is served on a goroutine of its own.
func (s *Server) accept(nc net.Conn) {
	if peer := remoteIP(nc); !s.trusts(peer) {
		s.opts.Refused()
		if n := s.refusedLog.event(time.Now()); n > 0 {
			s.opts.Log.Warn("spoa: connection refused: the peer is not in AUTHLIMIT_TRUSTED_PROXIES", "peer", peer.String(), "refused", n)
		}
		_ = nc.Close()
		return
	}
	if !s.opts.Conns.Take() {
		_ = nc.Close()
		return
	}
	s.opts.Accepted()
	c := newConn(s, nc)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.opts.Conns.Give()
		_ = nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer s.opts.Conns.Give()
		c.serve()
	}()
}

func (s *Server) trusts(a netip.Addr) bool {
	for _, p := range s.opts.Trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// UnixPeer is the address a peer that is not on an IP socket (a Unix
// socket's) counts as: it is local, trusted if Options.Trusted holds it.
func UnixPeer() netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, 1}) }

// remoteIP is the peer's address; a peer that is not an IP socket (a Unix
// socket) is UnixPeer.
func remoteIP(nc net.Conn) netip.Addr {
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return UnixPeer()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// forget drops a closed connection.
func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// closeListeners stops accepting and marks the Server closed; it reports
// false if it already was.
func (s *Server) closeListeners() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.closed = true
	for l := range s.listeners {
		_ = l.Close()
	}
	return true
}

// Shutdown stops accepting, has every connection answer the NOTIFY frames
// it has in flight, say AGENT-DISCONNECT and close, and waits for them
// until ctx ends, when it closes the rest. A frame HAProxy sends while the
// AGENT-DISCONNECT is on its way gets no answer: HAProxy's timeout
// processing then applies to it.
func (s *Server) Shutdown(ctx context.Context) error {
	if !s.closeListeners() {
		return nil
	}
	if d, ok := ctx.Deadline(); ok {
		s.deadline.Store(&d)
	}
	close(s.stopping)
	s.mu.Lock()
	for c := range s.conns {
		c.wake()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.closeConns()
		<-done
		return ctx.Err()
	}
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() {
	s.closeListeners()
	s.closeConns()
	s.wg.Wait()
}

func (s *Server) closeConns() {
	s.mu.Lock()
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
}

// logEvery tells when to log an event that may come in floods: the first,
// then at most one every 10s, with how many came since the last logged.
type logEvery struct {
	mu     sync.Mutex
	last   time.Time
	missed int
}

// event counts one event and returns how many to report now (0: log
// nothing).
func (l *logEvery) event(now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.missed++
	if !l.last.IsZero() && now.Sub(l.last) < 10*time.Second {
		return 0
	}
	n := l.missed
	l.last, l.missed = now, 0
	return n
}
