package grpcwire

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/authlimit/authlimit/internal/membudget"
	"github.com/authlimit/authlimit/internal/tlstest"
)

// tlsDial dials addr with grpc-go's TLS credentials.
func tlsDial(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// tlsServer serves echo and the asynchronous echo over TLS with cfg.
func tlsServer(t *testing.T, opts Options) (*asyncEcho, string) {
	t.Helper()
	opts.Log = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := NewServer(opts)
	e := &echo{started: make(chan string, 100), ended: make(chan error, 100), release: make(chan struct{})}
	if err := Unary(s, echoPath, e.Echo); err != nil {
		t.Fatal(err)
	}
	a := &asyncEcho{calls: make(chan asyncCall, 1000)}
	if err := UnaryRawAsync(s, asyncPath, a.sync, a.start); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return a, l.Addr().String()
}

func TestTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	srv := ca.Server(t, 7)
	a, addr := tlsServer(t, Options{TLS: &tls.Config{Certificates: []tls.Certificate{srv.TLS}}})
	c := tlsDial(t, addr, &tls.Config{RootCAs: ca.Pool()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if got, err := call(ctx, c, []byte("over tls")); err != nil || string(got) != "over tls" {
		t.Fatalf("echo over TLS = %q, %v", got, err)
	}
	// An asynchronous call's answer, sent from another goroutine, goes
	// through crypto/tls too: a raw write to the socket would put
	// cleartext in the TLS stream, and the client would fail.
	go func() {
		for ac := range a.calls {
			ac.answer(t)
		}
	}()
	defer close(a.calls)
	for i := range 50 {
		want := []byte{byte(i), 'a', 's', 'y', 'n', 'c'}
		got, err := invokeAsync(ctx, c, want)
		if err != nil || string(got) != string(want) {
			t.Fatalf("async call %d over TLS = %q, %v", i, got, err)
		}
	}
}

func invokeAsync(ctx context.Context, c *grpc.ClientConn, v []byte) ([]byte, error) {
	out := &wrapperspb.BytesValue{}
	err := c.Invoke(ctx, asyncPath, &wrapperspb.BytesValue{Value: v}, out)
	return out.GetValue(), err
}

func TestMutualTLS(t *testing.T) {
	ca, other := tlstest.NewCA(t, "ca"), tlstest.NewCA(t, "other")
	srv := ca.Server(t, 7)
	_, addr := tlsServer(t, Options{TLS: &tls.Config{Certificates: []tls.Certificate{srv.TLS},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}})
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		ok    bool
	}{
		{"the CA's client", []tls.Certificate{ca.Client(t, 8, "envoy").TLS}, true},
		{"no certificate", nil, false},
		{"another CA's client", []tls.Certificate{other.Client(t, 9, "mallory").TLS}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tlsDial(t, addr, &tls.Config{RootCAs: ca.Pool(), Certificates: tc.certs})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := call(ctx, c, []byte("x"))
			if tc.ok != (err == nil) || tc.ok && string(got) != "x" {
				t.Fatalf("call = %q, %v; want ok %v", got, err, tc.ok)
			}
		})
	}
}

// readClosed reports whether the server closed nc within d (EOF or a
// reset), rather than leaving it open.
func readClosed(nc net.Conn, d time.Duration) bool {
	_ = nc.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, nc)
	return !isTimeout(err)
}

func TestTLSRefusesWithoutH2(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	_, addr := tlsServer(t, Options{TLS: &tls.Config{Certificates: []tls.Certificate{ca.Server(t, 7).TLS}}})
	// No ALPN, or http/1.1 alone (crypto/tls then negotiates nothing
	// rather than fail): the handshake completes, and the server closes.
	for _, protos := range [][]string{nil, {"http/1.1"}} {
		tc, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), NextProtos: protos})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tc.Write([]byte(clientPreface)); err != nil {
			t.Fatal(err)
		}
		if !readClosed(tc, 10*time.Second) {
			t.Fatalf("a client offering %q was served", protos)
		}
		_ = tc.Close()
	}
	// Another protocol alone: the handshake fails.
	if c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), NextProtos: []string{"spdy/3"}}); err == nil {
		_ = c.Close()
		t.Fatal("a client offering spdy/3 alone completed the handshake")
	}
}

func TestTLSHandshakeTimeout(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	_, addr := tlsServer(t, Options{PrefaceTimeout: 200 * time.Millisecond,
		TLS: &tls.Config{Certificates: []tls.Certificate{ca.Server(t, 7).TLS}}})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Half a ClientHello's record header, then nothing.
	if _, err := nc.Write([]byte{0x16, 0x03}); err != nil {
		t.Fatal(err)
	}
	if !readClosed(nc, 10*time.Second) {
		t.Fatal("a handshake that never finished kept its connection")
	}
}

func TestTLSPeersBeforeHandshake(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	var refused atomic.Int64
	_, addr := tlsServer(t, Options{Peers: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Refused: func(net.Addr) { refused.Add(1) },
		TLS:     &tls.Config{Certificates: []tls.Certificate{ca.Server(t, 7).TLS}}})
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), NextProtos: []string{"h2"}})
	if err == nil {
		_ = c.Close()
		t.Fatal("a peer outside Peers completed a handshake")
	}
	if refused.Load() != 1 {
		t.Fatalf("refused %d, want 1", refused.Load())
	}
}

// TestTLSHandshakeBudget: a handshake holds handshakeCost of the budget
// while it runs: with less room than that, the connection is closed
// before its handshake, and the refusal counted.
func TestTLSHandshakeBudget(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	budget := membudget.New(handshakeCost / 2)
	_, addr := tlsServer(t, Options{Budget: budget, TLS: &tls.Config{Certificates: []tls.Certificate{ca.Server(t, 7).TLS}}})
	if c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), NextProtos: []string{"h2"}}); err == nil {
		_ = c.Close()
		t.Fatal("a handshake ran without room in the budget")
	}
	if budget.Refusals() == 0 {
		t.Error("the handshake's refusal is not counted")
	}
	if budget.Used() != 0 {
		t.Errorf("%d bytes of the budget still held", budget.Used())
	}
}
