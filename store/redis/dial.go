package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"
)

// handshakeError is a TLS handshake that failed once the connection was
// made: the server accepted and did not complete it. Its text is the
// handshake's error's, which crypto/tls words.
type handshakeError struct{ err error }

func (e *handshakeError) Error() string { return e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

// isHandshake reports whether err is, or wraps, a handshakeError.
func isHandshake(err error) bool {
	var h *handshakeError
	return errors.As(err, &h)
}

// TLSDialer returns a dialer for go-redis's Dialer option that opens TLS
// connections within the context's deadline, as the plain dialer does.
// go-redis's own TLS dialing (tls.DialWithDialer) ignores the context, so
// that its handshake is bounded only by timeout, the dial timeout: a
// decision that dialed a Redis that accepts connections and answers
// nothing (stopped, or in DEBUG SLEEP: the kernel accepts for it) would
// wait that long, not its budget. timeout still bounds a dial whose
// context has no deadline.
//
// As tls.DialWithDialer does, it takes the server name from the address
// when cfg has none. A handshake that fails is marked, so that the store
// tells it from a dial that found no server: a server that accepted and
// did not answer within the budget counts as a timeout, as a login that
// stalls does.
func TLSDialer(cfg *tls.Config, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{
		Timeout: timeout,
		// go-redis's own dialer's keepalive.
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3},
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := cfg
		if c.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			c = cfg.Clone()
			c.ServerName = host
		}
		if deadline, ok := ctx.Deadline(); ok {
			// A deadline on the socket as well as the context: the
			// handshake's error is then a timeout's.
			_ = raw.SetDeadline(deadline)
		}
		tc := tls.Client(raw, c)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, &handshakeError{err}
		}
		_ = raw.SetDeadline(time.Time{})
		return tc, nil
	}
}
