// Package httpconn is the HTTP/1.1 connection layer under fasthttp: a
// listener that keeps the connections it accepts, bounds how long a client
// holds one (read, write and idle timeouts, kept on the socket rather than
// by fasthttp), reads a request that comes at once with one system call,
// and refuses a header block that ends in bare line feeds, which fasthttp
// would wait on until its read timeout.
//
// fasthttp's own ReadTimeout, WriteTimeout and IdleTimeout set three
// deadlines for every request, each a timer reset and two readings of the
// clock; a Conn reads the clock once a request and sets a deadline on the
// socket only when the one it set before passes (see Conn.Read).
package httpconn

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/internal/acceptwait"
	"github.com/authlimit/authlimit/internal/conncap"
	"github.com/authlimit/authlimit/internal/membudget"
	"github.com/authlimit/authlimit/internal/rawsock"
)

// Listener is a server's listener. It keeps the connections it accepts,
// so that shutdown can close those that never sent a byte, wraps each in a
// Conn, and counts them. It never fails on an error a later accept may not
// have (no file descriptor free, say): it waits and accepts again, as
// net/http does, so that a client opening connections cannot end the
// process. Its connections count in the cap it may share with other
// listeners: beyond it a new connection is closed at once, so that file
// descriptors remain for the store and for the connections it has.
type Listener struct {
	net.Listener
	cfg       Config
	closed    chan struct{} // closed by Close: a wait between accepts ends
	closeOnce sync.Once
	ahead     sync.Pool // *[aheadSize]byte: see Conn.Read
	heads     sync.Pool // *[]byte of cap Config.MaxHeader: see Conn.bareLF

	mu       sync.Mutex
	conns    map[*Conn]struct{}
	shutting bool
}

// Config is what a Listener keeps.
type Config struct {
	// MaxHeader is the largest header block: fasthttp refuses larger
	// ones itself, and a Conn stops looking for bare line feeds beyond it.
	MaxHeader int
	// Conns is the connections' cap, which other listeners may share; nil:
	// no cap. A connection it refuses is counted by the cap.
	Conns *conncap.Cap
	// Budget bounds the bytes held for unfinished requests, with other
	// listeners' (see Conn.take); nil: no bound.
	Budget   *membudget.Budget
	Timeouts Timeouts
	Metrics  Metrics
	// Log receives a warning when accepts begin to fail; nil: no log.
	Log *slog.Logger
}

// Metrics count what a Listener does with connections. A nil counter
// counts nothing.
type Metrics struct {
	Accepted     prometheus.Counter // accepted and served
	AcceptErrors prometheus.Counter // failed accepts, each followed by a wait
}

// Timeouts bound how long a client holds a connection.
type Timeouts struct {
	// Read bounds a request, from its first byte to its last, and a new
	// connection's wait for its first request.
	Read time.Duration
	// Write bounds an answer: it is written within Read + Write of its
	// request's first byte.
	Write time.Duration
	// Idle bounds a keep-alive connection's wait for its next request,
	// from the first byte of the one before. It is at least Read, which
	// Conn.Read relies on.
	Idle time.Duration
}

// New wraps l.
func New(l net.Listener, c Config) *Listener {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	l2 := &Listener{Listener: l, cfg: c, closed: make(chan struct{}), conns: map[*Conn]struct{}{}}
	l2.ahead.New = func() any { return new([aheadSize]byte) }
	l2.heads.New = func() any {
		b := make([]byte, 0, c.MaxHeader)
		return &b
	}
	return l2
}

// Close closes the listener and ends a wait between accepts.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Accept returns the next connection; once shutdown began (CloseSilent),
// it closes new ones at once (the listener itself closes a moment later),
// as it does those beyond the cap. After an error a later accept may not
// have, it waits, from 5 ms doubling up to 1 s, and accepts again; it
// returns any other error.
func (l *Listener) Accept() (net.Conn, error) {
	var wait time.Duration
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			if !acceptwait.Retryable(err) {
				return nil, err
			}
			inc(l.cfg.Metrics.AcceptErrors)
			if wait == 0 {
				l.cfg.Log.Warn("accept failed; accepting again after a wait", "err", err)
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
		if !l.cfg.Conns.Take() {
			_ = nc.Close()
			continue
		}
		inc(l.cfg.Metrics.Accepted)
		c := &Conn{Conn: rawsock.Wrap(nc), l: l, scanning: true, start: time.Now()}
		c.holder = l.cfg.Budget.Holder(c.evict)
		// The first deadlines: no later than any this connection's
		// requests will have (see Conn.Read).
		if nc.SetReadDeadline(c.readDeadline()) != nil || nc.SetWriteDeadline(c.writeDeadline()) != nil {
			c.holder.Close()
			l.cfg.Conns.Give()
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
		c.holder.Close()
		l.cfg.Conns.Give()
		_ = nc.Close()
	}
}

// CloseSilent starts the shutdown: it closes every connection that has not
// sent a byte, and any accepted from now on. fasthttp closes the
// connections idle between two requests itself, but counts a new one as
// busy from its accept: one that never sends a byte would hold a shutdown
// until its read timeout.
func (l *Listener) CloseSilent() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.shutting = true
	for c := range l.conns {
		if c.state.CompareAndSwap(connSilent, connShut) {
			_ = c.Conn.Close()
		}
	}
}

// Open counts the listener's connections not yet closed: those that have
// not sent a byte yet, and those that have.
func (l *Listener) Open() (silent, spoke int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		switch c.state.Load() {
		case connSilent:
			silent++
		case connSpoke:
			spoke++
		}
	}
	return silent, spoke
}

func inc(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}

// IsTimeout reports whether err is a deadline that passed.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
