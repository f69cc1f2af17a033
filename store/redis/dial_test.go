package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/redistest"
)

// TestTLSDialer: the dialer connects and verifies as tls.Dial does (the
// server name from the address), fails a handshake with an untrusted
// server as a handshake, and gives up a handshake that a silent server
// never completes at the context's deadline, not at its dial timeout, with
// an error that is a timeout.
func TestTLSDialer(t *testing.T) {
	srv := redistest.StartTLS(t)
	const dialTimeout = 10 * time.Second
	dial := func(ctx context.Context, caFile, addr string) (net.Conn, error) {
		cfg := redistest.TLSConfig(t, caFile) // no ServerName
		return TLSDialer(cfg, dialTimeout)(ctx, "tcp", addr)
	}

	t.Run("trusted", func(t *testing.T) {
		cfg := redistest.TLSConfig(t, srv.CAFile)
		client := goredis.NewClient(&goredis.Options{Addr: srv.Addr, TLSConfig: cfg, Dialer: TLSDialer(cfg, dialTimeout), MaxRetries: -1})
		t.Cleanup(func() { _ = client.Close() })
		if err := client.Ping(context.Background()).Err(); err != nil {
			t.Fatalf("PING over the dialer's connection: %v", err)
		}
		// Without a server name crypto/tls verifies nothing and refuses
		// to connect; the name, sent as SNI, is the address's host.
		_, port, err := net.SplitHostPort(srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := dial(context.Background(), srv.CAFile, net.JoinHostPort("localhost", port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tc, ok := c.(*tls.Conn)
		if !ok {
			t.Fatalf("dialed a %T, want a *tls.Conn", c)
		}
		if got := tc.ConnectionState().ServerName; got != "localhost" {
			t.Errorf("server name %q, want the address's host, localhost", got)
		}
		if !tc.ConnectionState().HandshakeComplete {
			t.Errorf("handshake not complete")
		}
	})

	t.Run("untrusted", func(t *testing.T) {
		_, err := dial(context.Background(), srv.WrongCAFile, srv.Addr)
		var unknown x509.UnknownAuthorityError
		if err == nil || !isHandshake(err) || !errors.As(err, &unknown) {
			t.Fatalf("dial with the wrong CA = %v, want a handshake error of an unknown authority", err)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("an untrusted certificate is a timeout: %v", err)
		}
	})

	t.Run("silent", func(t *testing.T) {
		addr := redistest.Silent(t)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := dial(ctx, srv.CAFile, addr)
		took := time.Since(start)
		var ne net.Error
		if err == nil || !isHandshake(err) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("dial of a silent server = %v, want a handshake error that is a timeout", err)
		}
		if took > dialTimeout/2 {
			t.Errorf("dial of a silent server took %v: the context's deadline (100ms) did not bound it", took)
		}
	})

	t.Run("refused", func(t *testing.T) {
		port, err := redistest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		_, err = dial(context.Background(), srv.CAFile, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil || isHandshake(err) {
			t.Fatalf("dial of a closed port = %v, want a dial error, not a handshake's", err)
		}
	})
}

// TestDecideConnTLSSilent: a decision whose decide connection dials a TLS
// server that accepts and never completes the handshake fails within its
// budget, as a timeout (a stalled Redis), not as an unreachable one, and
// a refused dial still fails as unreachable.
func TestDecideConnTLSSilent(t *testing.T) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	const budget = 100 * time.Millisecond
	addr := redistest.Silent(t)
	client := goredis.NewClient(&goredis.Options{Addr: addr, TLSConfig: cfg, Dialer: TLSDialer(cfg, 10*time.Second), MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	rs := New(client, Options{Prefix: "silent", Timeout: budget})
	t.Cleanup(func() { _ = rs.Close() })
	if rs.direct == nil {
		t.Fatal("a standalone client made no decide connections")
	}
	p := algotest.MustPolicy(t, algo.Spec{Name: "s", Algorithm: algo.FixedWindow, Limit: 10, Window: time.Hour})
	start := time.Now()
	_, err := rs.Decide(context.Background(), []algo.Request{{Policy: p, Key: []byte("k")}}, make([]algo.Result, 1))
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, algo.ErrUnreachable) {
		t.Errorf("Decide on a silent TLS server = %v, want a timeout (context.DeadlineExceeded), not ErrUnreachable", err)
	}
	if took > 2*time.Second {
		t.Errorf("Decide on a silent TLS server took %v, want about its budget (%v)", took, budget)
	}
}
