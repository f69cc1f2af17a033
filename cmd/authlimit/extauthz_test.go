package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/authlimit/authlimit/front/grpcwire"
)

// TestExtAuthzSharesTheEngine: Check, registered by registerExtAuthz on a
// gRPC server on loopback, decides with the app's engine: one quota spent
// through /auth is gone for Check, and Check's denial carries the status,
// the headers and the body /auth would.
func TestExtAuthzSharesTheEngine(t *testing.T) {
	a, s := newTestApp(t, map[string]string{"AUTHLIMIT_RULES": "name=login key=ip limit=2/1m path=/login"})
	g := grpcwire.NewServer(grpcwire.Options{})
	if err := registerExtAuthz(g, a, s); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := authv3.NewAuthorizationClient(conn)

	// /auth spends the first request of 203.0.113.7's quota of 2.
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = a.serve(ctx, a.listener(tcp, s), s.ShutdownTimeout)
	}()
	c, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /auth HTTP/1.1\r\nHost: authlimit\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Uri: /login\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Body.Close()
	if r.StatusCode != 200 || r.Header.Get("X-RateLimit-Remaining") != "1" {
		t.Fatalf("/auth: %d remaining %q, want 200 remaining 1", r.StatusCode, r.Header.Get("X-RateLimit-Remaining"))
	}

	check := func() *authv3.CheckResponse {
		t.Helper()
		resp, err := client.Check(context.Background(), &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: "203.0.113.7", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 50000}}}}},
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/login?x=1", Host: "api.example.com"}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := check(); codes.Code(resp.GetStatus().GetCode()) != codes.OK || okHeader(resp, "X-RateLimit-Remaining") != "0" {
		t.Fatalf("second request, through Check: %v, want OK with X-RateLimit-Remaining 0", resp)
	}
	resp := check()
	denied := resp.GetDeniedResponse()
	if codes.Code(resp.GetStatus().GetCode()) == codes.OK || denied.GetStatus().GetCode() != 429 || !strings.Contains(denied.GetBody(), "urn:authlimit:rate-limited") {
		t.Fatalf("third request, through Check: %v, want a 429 rate-limited denial", resp)
	}
}

func okHeader(resp *authv3.CheckResponse, name string) string {
	for _, h := range resp.GetOkResponse().GetResponseHeadersToAdd() {
		if h.GetHeader().GetKey() == name {
			return h.GetHeader().GetValue()
		}
	}
	return ""
}
