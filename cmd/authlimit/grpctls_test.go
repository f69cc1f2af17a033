package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/internal/tlstest"
)

func TestGRPCTLSConfigErrors(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	srv, other := ca.Server(t, 2), ca.Server(t, 3)
	cert, key := writeFile(t, "tls.crt", string(srv.CertPEM)), writeFile(t, "tls.key", string(srv.KeyPEM))
	otherKey := writeFile(t, "other.key", string(other.KeyPEM))
	garbage := writeFile(t, "garbage.pem", "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
	notPEM := writeFile(t, "not.pem", "hello\n")
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"cert without key", map[string]string{"AUTHLIMIT_GRPC_TLS_CERT": cert}, []string{
			"AUTHLIMIT_GRPC_TLS_KEY: unset, and AUTHLIMIT_GRPC_TLS_CERT is set"}},
		{"key without cert", map[string]string{"AUTHLIMIT_GRPC_TLS_KEY": key}, []string{
			"AUTHLIMIT_GRPC_TLS_CERT: unset, and AUTHLIMIT_GRPC_TLS_KEY is set"}},
		{"client CA without cert", map[string]string{"AUTHLIMIT_GRPC_TLS_CLIENT_CA": cert}, []string{
			"AUTHLIMIT_GRPC_TLS_CLIENT_CA: set without AUTHLIMIT_GRPC_TLS_CERT"}},
		{"unreadable", map[string]string{"AUTHLIMIT_GRPC_TLS_CERT": "/nonexistent/tls.crt", "AUTHLIMIT_GRPC_TLS_KEY": "/nonexistent/tls.key"}, []string{
			"AUTHLIMIT_GRPC_TLS_CERT: open /nonexistent/tls.crt: no such file or directory",
			"AUTHLIMIT_GRPC_TLS_KEY: open /nonexistent/tls.key: no such file or directory"}},
		{"bad PEM", map[string]string{"AUTHLIMIT_GRPC_TLS_CERT": garbage, "AUTHLIMIT_GRPC_TLS_KEY": key}, []string{
			"AUTHLIMIT_GRPC_TLS_CERT: " + garbage + ": certificate 1: "}},
		{"not PEM", map[string]string{"AUTHLIMIT_GRPC_TLS_CERT": notPEM, "AUTHLIMIT_GRPC_TLS_KEY": key}, []string{
			"AUTHLIMIT_GRPC_TLS_CERT: " + notPEM + ": no PEM certificate in it"}},
		{"key of another certificate", map[string]string{"AUTHLIMIT_GRPC_TLS_CERT": cert, "AUTHLIMIT_GRPC_TLS_KEY": otherKey}, []string{
			"AUTHLIMIT_GRPC_TLS_KEY: " + otherKey + " with " + cert + ": tls: private key does not match public key"}},
		{"a key as the client CA", map[string]string{"AUTHLIMIT_GRPC_TLS_CERT": cert, "AUTHLIMIT_GRPC_TLS_KEY": key, "AUTHLIMIT_GRPC_TLS_CLIENT_CA": key}, []string{
			"AUTHLIMIT_GRPC_TLS_CLIENT_CA: " + key + `: a PEM block of type "EC PRIVATE KEY" where certificates are wanted`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			said, err := checkEnv(t, with(tc.env, "AUTHLIMIT_GRPC_LISTEN", "127.0.0.1:8081"))
			var u usageError
			if !errors.As(err, &u) {
				t.Fatalf("-check = %v, want a usage error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(said, w) {
					t.Errorf("-check does not say\n%s\nit says\n%s", w, said)
				}
			}
		})
	}
	said, err := checkEnv(t, map[string]string{"AUTHLIMIT_GRPC_LISTEN": "127.0.0.1:8081", "AUTHLIMIT_GRPC_TLS_CERT": cert, "AUTHLIMIT_GRPC_TLS_KEY": key, "AUTHLIMIT_GRPC_TLS_CLIENT_CA": writeFile(t, "ca.crt", string(ca.PEM))})
	if err != nil {
		t.Fatalf("-check: %v\n%s", err, said)
	}
	if w := "grpc tls         mutual TLS 1.2+, h2; certificate " + cert + " (localhost, serial 2, expires "; !strings.Contains(said, w) {
		t.Errorf("-check output lacks %q:\n%s", w, said)
	}
	// Valid files with no gRPC listener: a warning, not a mistake.
	said, err = checkEnv(t, map[string]string{"AUTHLIMIT_GRPC_TLS_CERT": cert, "AUTHLIMIT_GRPC_TLS_KEY": key})
	if w := "AUTHLIMIT_GRPC_TLS_CERT is set, AUTHLIMIT_GRPC_LISTEN is not"; err != nil || !strings.Contains(said, w) {
		t.Errorf("-check without AUTHLIMIT_GRPC_LISTEN = %v, want it to warn %q:\n%s", err, w, said)
	}
}

// tlsCall makes a Check and a ShouldRateLimit over TLS with cfg, and
// returns the first error.
func tlsCall(addr string, cfg *tls.Config, client string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	return twoCalls(conn, client)
}

func twoCalls(conn *grpc.ClientConn, client string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := authv3.NewAuthorizationClient(conn).Check(ctx, checkRequest(client))
	if err != nil {
		return err
	}
	if r.GetOkResponse() == nil {
		return errors.New("Check denied: " + r.String())
	}
	rl, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "another",
		Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "key2", Value: client}}}}})
	if err != nil {
		return err
	}
	if rl.GetOverallCode() != pb.RateLimitResponse_OK || rl.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 20 {
		return errors.New("ShouldRateLimit: " + rl.String())
	}
	return nil
}

func checkRequest(client string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: client}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/", Host: "api.example.com"}},
	}}
}

// secretDir writes a Kubernetes Secret's volume into dir: the files in a
// directory of their own, ..data pointing at it, and tls.crt, tls.key and
// ca.crt pointing through ..data. Each call swaps ..data atomically.
func secretDir(t *testing.T, dir, version string, files map[string][]byte) {
	t.Helper()
	d := filepath.Join(dir, "..2026_"+version)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(d, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(d), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// tlsApp starts authlimit serving gRPC over TLS from a Secret's volume in
// dir, with the rate-limit service; it returns the gRPC address.
func tlsApp(t *testing.T, dir string, mutual bool) (*testApp, string) {
	t.Helper()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	env := map[string]string{
		"AUTHLIMIT_GRPC_LISTEN":   addr,
		"AUTHLIMIT_RLS_CONFIG":    writeFile(t, "rls.yaml", rlsConfig),
		"AUTHLIMIT_RULES":         "name=api key=ip limit=1000/1h",
		"AUTHLIMIT_GRPC_TLS_CERT": filepath.Join(dir, "tls.crt"),
		"AUTHLIMIT_GRPC_TLS_KEY":  filepath.Join(dir, "tls.key"),
	}
	if mutual {
		env["AUTHLIMIT_GRPC_TLS_CLIENT_CA"] = filepath.Join(dir, "ca.crt")
	}
	return startApp(t, env), addr
}

// TestGRPCTLS: with a certificate, Check and ShouldRateLimit are served
// over TLS to grpc-go's client, and a cleartext (h2c) client is not.
func TestGRPCTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	srv := ca.Server(t, 2)
	dir := t.TempDir()
	secretDir(t, dir, "a", map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM})
	_, addr := tlsApp(t, dir, false)
	if err := tlsCall(addr, &tls.Config{RootCAs: ca.Pool()}, "203.0.113.1"); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	if err := twoCalls(grpcClient(t, addr), "203.0.113.1"); err == nil {
		t.Fatal("a cleartext client was served by the TLS listener")
	}
}

// TestGRPCMutualTLS: with a client CA, only a client with a certificate
// that CA signed is served.
func TestGRPCMutualTLS(t *testing.T) {
	ca, other := tlstest.NewCA(t, "ca"), tlstest.NewCA(t, "other")
	srv := ca.Server(t, 2)
	dir := t.TempDir()
	secretDir(t, dir, "a", map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM, "ca.crt": ca.PEM})
	_, addr := tlsApp(t, dir, true)
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		ok    bool
	}{
		{"signed by the client CA", []tls.Certificate{ca.Client(t, 10, "envoy").TLS}, true},
		{"no certificate", nil, false},
		{"signed by another CA", []tls.Certificate{other.Client(t, 11, "envoy").TLS}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tlsCall(addr, &tls.Config{RootCAs: ca.Pool(), Certificates: tc.certs}, "203.0.113.2")
			if tc.ok != (err == nil) {
				t.Fatalf("calls: %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// servedSerial is the serial of the certificate a new handshake gets.
func servedSerial(t *testing.T, addr string, ca *tlstest.CA) int64 {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// TestGRPCTLSRotation: a Secret's certificate swapped under load (its
// ..data symlink) is served to new handshakes within seconds, with every
// call in flight answered; a bad certificate swapped in then keeps the
// one in force, logged and counted once; a new client CA swapped in
// serves its clients and refuses the old CA's.
func TestGRPCTLSRotation(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "ca")
	dir := t.TempDir()
	first := ca.Server(t, 2)
	secretDir(t, dir, "a", map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM, "ca.crt": ca.PEM})
	app, addr := tlsApp(t, dir, true)
	client := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, 10, "envoy").TLS}}
	if got := servedSerial(t, addr, ca); got != 2 {
		t.Fatalf("serial %d served, want 2", got)
	}

	// Load: workers on a connection each, and workers that dial anew for
	// every call, so that handshakes run across the swap.
	stop := make(chan struct{})
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var conn *grpc.ClientConn
			if w%2 == 0 {
				var err error
				if conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(client))); err != nil {
					firstErr.CompareAndSwap(nil, err)
					failed.Add(1)
					return
				}
				defer conn.Close()
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// A client of its own per call: none reaches a limit.
				ip := fmt.Sprintf("10.%d.%d.%d", w, i/256%256, i%256)
				var err error
				if conn != nil {
					err = twoCalls(conn, ip)
				} else {
					err = tlsCall(addr, client, ip)
				}
				calls.Add(1)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					failed.Add(1)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	second := ca.Server(t, 3)
	secretDir(t, dir, "b", map[string][]byte{"tls.crt": second.CertPEM, "tls.key": second.KeyPEM, "ca.crt": ca.PEM})
	deadline := time.Now().Add(20 * time.Second)
	for servedSerial(t, addr, ca) != 3 {
		if time.Now().After(deadline) {
			t.Fatal("the rotated certificate (serial 3) is not served 20 s after the swap")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if failed.Load() > 0 || calls.Load() < 4 {
		t.Fatalf("%d of %d call pairs failed across the rotation (first: %v)", failed.Load(), calls.Load(), firstErr.Load())
	}
	t.Logf("%d call pairs across the rotation, none failed", calls.Load())

	// A bad certificate: the one in force stays, logged once.
	secretDir(t, dir, "c", map[string][]byte{"tls.crt": []byte("not a certificate\n"), "tls.key": second.KeyPEM, "ca.crt": ca.PEM})
	time.Sleep(4 * tlsPollInterval)
	if got := servedSerial(t, addr, ca); got != 3 {
		t.Fatalf("serial %d served after a bad certificate, want 3 kept", got)
	}
	if err := tlsCall(addr, client, "198.51.100.9"); err != nil {
		t.Fatalf("after a bad certificate: %v", err)
	}
	if n := strings.Count(app.logs.String(), "grpc tls files changed and do not load"); n != 1 {
		t.Errorf("%d log lines of the bad certificate, want 1", n)
	}
	// A new client CA: its clients are served, the old CA's refused.
	next := tlstest.NewCA(t, "next")
	secretDir(t, dir, "d", map[string][]byte{"tls.crt": second.CertPEM, "tls.key": second.KeyPEM, "ca.crt": next.PEM})
	nextClient := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{next.Client(t, 12, "envoy").TLS}}
	deadline = time.Now().Add(20 * time.Second)
	for tlsCall(addr, nextClient, "198.51.100.10") != nil {
		if time.Now().After(deadline) {
			t.Fatal("a client of the new client CA is still refused 20 s after the swap")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := tlsCall(addr, client, "198.51.100.11"); err == nil {
		t.Error("a client of the replaced client CA is still served")
	}
	m := app.do(t, request{path: "/metrics"})
	for _, w := range []string{`authlimit_grpc_tls_reloads_total{result="error"} 1`, `authlimit_grpc_tls_reloads_total{result="ok"} 2`, "authlimit_grpc_tls_certificate_expiry_seconds " + strconv.FormatFloat(float64(second.Cert.NotAfter.Unix()), 'g', -1, 64)} {
		if !strings.Contains(m.body, w) {
			t.Errorf("/metrics lacks %s:\n%s", w, grepLines(m.body, "tls"))
		}
	}
}
