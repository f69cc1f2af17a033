package main

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/authlimit/authlimit/internal/redistest"
)

// checkFrom makes a Check for client from the local address source.
func checkFrom(t *testing.T, addr, source, client string) (*authv3.CheckResponse, error) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return authv3.NewAuthorizationClient(conn).Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: client}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/", Host: "api.example.com",
			Headers: map[string]string{"x-plan": "pro"}}},
	}})
}

// TestGRPCUntrustedPeer: a peer outside AUTHLIMIT_GRPC_TRUSTED_PEERS
// cannot call: its Checks, claiming another client's address and a tier,
// spend nothing of that client's quota, and are counted and logged; the
// gateway's Check for that client is then its first.
func TestGRPCUntrustedPeer(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	app := startApp(t, map[string]string{
		"AUTHLIMIT_GRPC_LISTEN":        addr,
		"AUTHLIMIT_GRPC_TRUSTED_PEERS": "127.0.0.2",
		"AUTHLIMIT_RULES":              "name=api key=ip limit=1/1h tier=header:X-Plan\ntier rule=api name=pro limit=100/1h",
	})
	for range 4 {
		if _, err := checkFrom(t, addr, "127.0.0.1", "203.0.113.50"); err == nil {
			t.Fatal("an untrusted peer's Check was answered")
		} else if st, _ := status.FromError(err); st.Code().String() != "Unavailable" {
			t.Fatalf("an untrusted peer's Check: %v, want Unavailable (refused at accept)", err)
		}
	}
	r, err := checkFrom(t, addr, "127.0.0.2", "203.0.113.50")
	if err != nil {
		t.Fatal(err)
	}
	if r.GetOkResponse() == nil {
		t.Errorf("the gateway's first Check for 203.0.113.50: %v, want allowed (the untrusted peer spent nothing)", r)
	}
	m := app.do(t, request{path: "/metrics"})
	if !strings.Contains(m.body, "authlimit_grpc_untrusted_connections_total ") || strings.Contains(m.body, "authlimit_grpc_untrusted_connections_total 0\n") {
		t.Errorf("/metrics: authlimit_grpc_untrusted_connections_total not counted:\n%s", grepLines(m.body, "untrusted"))
	}
	if got := strings.Count(app.logs.String(), "grpc connection refused"); got != 1 {
		t.Errorf("%d log lines of refused peers, want 1 (at most one every 10 s)", got)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
