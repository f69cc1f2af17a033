package grpcwire

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/internal/acceptwait"
	"github.com/authlimit/authlimit/internal/conncap"
	"github.com/authlimit/authlimit/internal/membudget"
	"github.com/authlimit/authlimit/internal/rawsock"
)

// ErrServerStopped is Serve's error once Stop or GracefulStop was called.
var ErrServerStopped = errors.New("grpcwire: the server was stopped")

// Defaults of Options.
const (
	DefaultMaxConcurrentStreams = 1024
	DefaultMaxRecvMsgSize       = 4 << 20 // grpc-go's receive limit
	DefaultMaxHeaderListSize    = 64 << 10
	DefaultPrefaceTimeout       = 10 * time.Second
	DefaultIdleTimeout          = 5 * time.Minute
	DefaultWriteTimeout         = 10 * time.Second
	DefaultRequestTimeout       = 10 * time.Second
)

// Options bound what a client may hold of the server. Zero fields take
// the defaults above.
type Options struct {
	// MaxConcurrentStreams is advertised in SETTINGS and enforced: a
	// stream beyond it is refused (RST_STREAM REFUSED_STREAM). A call
	// counts until it is answered (its answer waiting for the client's
	// window included), or, once the client reset it, until its handler
	// returns; so does a request that is not a gRPC call (see
	// refusal.go).
	MaxConcurrentStreams uint32
	// MaxRecvMsgSize is the largest request message; a larger one is
	// answered RESOURCE_EXHAUSTED.
	MaxRecvMsgSize int
	// MaxHeaderListSize is the largest request header list (as HTTP/2
	// counts it: a larger one is answered 431); a compressed header block
	// larger than twice it ends the connection (ENHANCE_YOUR_CALM).
	MaxHeaderListSize uint32
	// MaxConns is the most connections kept at once; those beyond are
	// closed at once. 0: no cap. Ignored when Conns is set.
	MaxConns int
	// Conns, if set, is the cap the server counts its connections in,
	// shared with other listeners: a connection beyond it is closed at
	// once (and reported by the cap).
	Conns *conncap.Cap
	// Accepted, if set, is called for each connection the server keeps
	// (not for those closed at once beyond the cap).
	Accepted func()
	// Peers, if not empty, are the only addresses a connection is served
	// from: one from elsewhere is closed at once, before a byte of it is
	// read, and Refused, if set, is called with its address. The calls'
	// messages name the client a call is for (Check's source address,
	// ShouldRateLimit's descriptors): a peer that may call may spend any
	// client's quota.
	Peers   []netip.Prefix
	Refused func(net.Addr)
	// TLS, if set, serves every connection over TLS with it (its
	// NextProtos set to h2): the handshake runs on the connection's own
	// goroutine, after the Peers check, within PrefaceTimeout and holding
	// handshakeCost of Budget; a client that does not negotiate h2 by ALPN
	// is closed once the handshake is done, as grpc-go's server does. A
	// TLS connection's every write goes through crypto/tls (there is no raw
	// write path, see write.go). Nil: h2c, cleartext.
	TLS *tls.Config
	// PrefaceTimeout bounds a new connection's TLS handshake, if any,
	// and its wait for the client's preface and first SETTINGS (each).
	PrefaceTimeout time.Duration
	// IdleTimeout closes a connection that had no call in flight and
	// started none for that long, with GOAWAY.
	IdleTimeout time.Duration
	// WriteTimeout bounds each write to the socket (a write gets at least
	// half of it), how long a response may wait for the client to open
	// its flow-control window, and how long a connection may have more
	// than maxBacklog (256 KiB) waiting to be written: its client is not
	// read meanwhile, and is cut off after it.
	WriteTimeout time.Duration
	// RequestTimeout bounds a request, from its HEADERS to the end of its
	// message: one that takes longer is reset (CANCEL), within a quarter
	// more. Envoy sends a call whole at once.
	RequestTimeout time.Duration
	// Budget, if set, bounds the memory every connection's unfinished
	// calls hold together, with the other ports' (see package
	// membudget): each open stream, its request's buffer, and a header
	// block larger than a frame. A call that finds no room is answered
	// RESOURCE_EXHAUSTED at once; a connection that holds the most when
	// another's call needs room is closed.
	Budget *membudget.Budget
	//
	// The connection's reader looks at these every interval of
	// min(IdleTimeout, max(WriteTimeout, 1s)): a connection idle for a
	// whole interval is closed, as is one whose response waited longer
	// than WriteTimeout; a request whose client sent nothing for a whole
	// interval is reset (CANCEL). Each happens within two intervals.
	// Log gets the accept errors and the handlers' panics.
	Log *slog.Logger
}

func (o *Options) fill() {
	if o.Conns == nil {
		o.Conns = conncap.New(o.MaxConns, nil)
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if o.MaxRecvMsgSize <= 0 {
		o.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if o.MaxHeaderListSize == 0 {
		o.MaxHeaderListSize = DefaultMaxHeaderListSize
	}
	if o.PrefaceTimeout <= 0 {
		o.PrefaceTimeout = DefaultPrefaceTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.TLS != nil {
		o.TLS = forH2(o.TLS.Clone())
		if get := o.TLS.GetConfigForClient; get != nil {
			o.TLS.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
				cfg, err := get(h)
				if cfg == nil || err != nil {
					return cfg, err
				}
				if len(cfg.NextProtos) == 1 && cfg.NextProtos[0] == alpnH2 && cfg.MinVersion >= tls.VersionTLS12 {
					return cfg, nil
				}
				return forH2(cfg.Clone()), nil
			}
		}
	}
}

// forH2 makes c offer h2 alone by ALPN, over TLS 1.2 at least (RFC 9113,
// section 9.2).
func forH2(c *tls.Config) *tls.Config {
	c.NextProtos = []string{alpnH2}
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	return c
}

// unaryFunc decodes a request message, calls the handler and appends the
// response message to out.
type unaryFunc func(ctx context.Context, req []byte, out []byte) ([]byte, error)

// streamFunc decodes a request message and calls a server-streaming
// handler, which sends its messages with send.
type streamFunc func(ctx context.Context, req []byte, send func(proto.Message) error) error

// asyncFunc starts a unary call on the connection's reader: it answers
// through r, now or later from any goroutine, and reports true; or it
// reports false, having answered nothing, and the call's unaryFunc runs
// on a worker.
type asyncFunc func(ctx context.Context, req []byte, out []byte, r *Reply) bool

// method is a registered method: exactly one of unary and stream is set;
// async, if set, is tried before unary.
type method struct {
	unary  unaryFunc
	async  asyncFunc
	stream streamFunc
}

// Server serves the registered methods. Register every method before
// Serve.
type Server struct {
	opts     Options
	methods  map[string]*method
	services map[string]bool

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	stopped   bool
	draining  chan struct{} // closed by GracefulStop and Stop
	connsDone sync.WaitGroup
	// The workers waiting for a call (see start): the last to become
	// idle on top.
	wmu        sync.Mutex
	idle       []*worker
	gen        uint64 // reap's runs
	reaping    bool   // reap is due
	workerIdle time.Duration
}

// pending is a call for a worker to run.
type pending struct {
	c *conn
	s *stream
}

// workerIdle is how long a worker waits for its next call before it ends:
// at least that, at most twice.
const workerIdle = 10 * time.Second

// worker runs calls one after another on its goroutine.
type worker struct {
	next chan pending // one call at a time; closed to end the worker
	gen  uint64       // s.gen when it last became idle; under s.wmu
}

// start runs a call on the worker that became idle last, or on a new one.
// A worker's stack has grown to what handlers need (decoding a request
// message takes several kilobytes): a new goroutine per call would grow
// its stack each time, a tenth of a small call's cost. The last idle
// worker is the one whose stack and data are still in the CPU's caches;
// a channel shared by the idle workers would hand the call to the one idle
// longest.
func (s *Server) start(c *conn, st *stream) {
	s.wmu.Lock()
	if n := len(s.idle); n > 0 {
		w := s.idle[n-1]
		s.idle[n-1] = nil
		s.idle = s.idle[:n-1]
		s.wmu.Unlock()
		w.next <- pending{c, st}
		return
	}
	s.wmu.Unlock()
	go s.work(&worker{next: make(chan pending, 1)}, pending{c, st})
}

// work runs p, then the calls start hands it, until reap ends it.
func (s *Server) work(w *worker, p pending) {
	for {
		p.c.run(p.s)
		s.wmu.Lock()
		w.gen = s.gen
		s.idle = append(s.idle, w)
		if !s.reaping {
			s.reaping = true
			time.AfterFunc(s.workerIdle, s.reap)
		}
		s.wmu.Unlock()
		var ok bool
		if p, ok = <-w.next; !ok {
			return
		}
	}
}

// reap runs every workerIdle while workers are idle, and ends those that
// were already idle at its previous run. The idle stack holds the longest
// idle at its bottom.
func (s *Server) reap() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.gen++
	stale := 0
	for stale < len(s.idle) && s.idle[stale].gen+2 <= s.gen {
		close(s.idle[stale].next)
		stale++
	}
	n := copy(s.idle, s.idle[stale:])
	clear(s.idle[n:])
	s.idle = s.idle[:n]
	if len(s.idle) == 0 {
		s.reaping = false
		return
	}
	time.AfterFunc(s.workerIdle, s.reap)
}

// NewServer returns a server with no method yet.
func NewServer(opts Options) *Server {
	opts.fill()
	return &Server{opts: opts, methods: map[string]*method{}, services: map[string]bool{},
		listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}, draining: make(chan struct{}), workerIdle: workerIdle}
}

// register adds m under path, "/package.Service/Method".
func (s *Server) register(path string, m *method) error {
	svc, name, ok := splitMethod(path)
	if !ok {
		return fmt.Errorf("register %q: want /service/method", path)
	}
	if _, dup := s.methods[path]; dup {
		return fmt.Errorf("register %q: registered twice", path)
	}
	s.methods[path] = m
	s.services[svc] = true
	_ = name
	return nil
}

// splitMethod splits "/service/method".
func splitMethod(path string) (service, method string, ok bool) {
	rest, ok := strings.CutPrefix(path, "/")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// Services lists the services with a registered method.
func (s *Server) Services() []string {
	out := make([]string, 0, len(s.services))
	for name := range s.services {
		out = append(out, name)
	}
	return out
}

// Unary registers h as the unary method at path, such as
// "/envoy.service.auth.v3.Authorization/Check". A request that does not
// decode is answered INTERNAL, as grpc-go does; h's error is the call's
// status (a google.golang.org/grpc/status error keeps its code, message
// and details; a context error becomes CANCELLED or DEADLINE_EXCEEDED; any
// other is UNKNOWN).
func Unary[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](s *Server, path string, h func(context.Context, PReq) (Resp, error)) error {
	return s.register(path, &method{unary: func(ctx context.Context, b []byte, out []byte) ([]byte, error) {
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			return out, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		resp, err := h(ctx, req)
		if err != nil {
			return out, err
		}
		out, err = proto.MarshalOptions{}.MarshalAppend(out, resp)
		if err != nil {
			return out, status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
		}
		return out, nil
	}})
}

// UnaryRaw registers h as the unary method at path, given the request
// message's bytes as they came: h appends its encoded response to out and
// returns it, or returns the call's status as Unary's h does. The request's
// bytes are the connection's: h must not keep them once it returns.
func UnaryRaw(s *Server, path string, h func(ctx context.Context, req, out []byte) ([]byte, error)) error {
	return s.register(path, &method{unary: h})
}

// UnaryRawAsync registers a unary method at path as UnaryRaw does, with
// start tried first, on the connection's reading goroutine, as soon as
// the request is complete: start must not block (the connection's other
// calls wait for it). It either takes the call and reports true, and
// then answers it with r.Send exactly once, now or later, from any
// goroutine; or reports false, having answered nothing, and h runs the
// call on a worker as UnaryRaw's would. The request's bytes stay valid
// until the call is answered; out is what h's out is.
func UnaryRawAsync(s *Server, path string, h func(ctx context.Context, req, out []byte) ([]byte, error), start func(ctx context.Context, req, out []byte, r *Reply) bool) error {
	return s.register(path, &method{unary: h, async: start})
}

// serverStream registers h as a server-streaming method at path: it sends
// its messages with send, and its error is the call's status.
func serverStream[Req any, PReq interface {
	*Req
	proto.Message
}](s *Server, path string, h func(context.Context, PReq, func(proto.Message) error) error) error {
	return s.register(path, &method{stream: func(ctx context.Context, b []byte, send func(proto.Message) error) error {
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		return h(ctx, req, send)
	}})
}

// Draining is closed once GracefulStop or Stop began: a server-streaming
// handler ends its stream.
func (s *Server) Draining() <-chan struct{} { return s.draining }

// Serve accepts connections on l and serves each until Stop or
// GracefulStop, when it returns ErrServerStopped. After an accept error a
// later accept may not have (no file descriptor free, say), it waits, from
// 5 ms doubling up to 1 s, and accepts again; it returns any other error.
// Beyond Options.MaxConns connections (or Options.Conns's cap), a new
// one is closed at once.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		_ = l.Close()
		return ErrServerStopped
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var wait time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			stopped := s.stopped
			s.mu.Unlock()
			if stopped {
				return ErrServerStopped
			}
			if !acceptwait.Retryable(err) {
				return fmt.Errorf("accept: %w", err)
			}
			if wait == 0 {
				s.opts.Log.Warn("grpc accept failed; accepting again after a wait", "err", err)
			}
			wait = acceptwait.Next(wait)
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-s.draining:
				t.Stop()
			}
			continue
		}
		wait = 0
		if !s.trusts(nc.RemoteAddr()) {
			if s.opts.Refused != nil {
				s.opts.Refused(nc.RemoteAddr())
			}
			_ = nc.Close()
			continue
		}
		if !s.opts.Conns.Take() {
			_ = nc.Close()
			continue
		}
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			s.opts.Conns.Give()
			_ = nc.Close()
			continue
		}
		// Raw reads and writes (see package rawsock), under TLS too.
		nc = rawsock.Wrap(nc)
		if s.opts.TLS != nil {
			nc = tls.Server(nc, s.opts.TLS)
		}
		c := newConn(s, nc)
		s.conns[c] = struct{}{}
		s.connsDone.Add(1)
		s.mu.Unlock()
		if s.opts.Accepted != nil {
			s.opts.Accepted()
		}
		go c.serve()
	}
}

// trusts reports whether a connection from a is served: Options.Peers
// holds it, or is empty.
func (s *Server) trusts(a net.Addr) bool {
	if len(s.opts.Peers) == 0 {
		return true
	}
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return false
	}
	ip := ta.AddrPort().Addr().Unmap()
	for _, p := range s.opts.Peers {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// forget drops a closed connection.
func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.opts.Conns.Give()
	s.connsDone.Done()
}

// stop closes the listeners and returns the connections.
func (s *Server) stop() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped {
		s.stopped = true
		close(s.draining)
	}
	for l := range s.listeners {
		_ = l.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// GracefulStop stops accepting, tells every client with GOAWAY that no
// further call is taken, and returns once the calls in flight have
// finished and every connection is closed.
func (s *Server) GracefulStop() {
	for _, c := range s.stop() {
		c.goAway()
	}
	s.connsDone.Wait()
}

// Stop closes the listeners and every connection at once: the calls in
// flight see their contexts cancelled. It returns once every connection's
// reader has ended; it does not wait for the handlers.
func (s *Server) Stop() {
	for _, c := range s.stop() {
		c.closeNow()
	}
	s.connsDone.Wait()
}
