package main

import (
	"io"
	"net"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/authlimit/authlimit/front/spoa/spoatest"
	"github.com/authlimit/authlimit/internal/redistest"
)

// metricsDoc holds the metrics table, a row per metric family.
const metricsDoc = "../../docs/operations.md"

// TestDocsDocumentEveryMetric: every metric family authlimit exports,
// with Redis, the gRPC services and both fronts in use, has a row in
// the metrics table of docs/operations.md. A family only appears once one
// of its series has a value, so the test first makes every front decide
// and deny.
func TestDocsDocumentEveryMetric(t *testing.T) {
	readme, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	row := regexp.MustCompile("^\\| `(authlimit_[a-z0-9_]+)`")
	for _, line := range strings.Split(string(readme), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			documented[m[1]] = true
		}
	}
	if len(documented) < 10 {
		t.Fatalf("found %d metric rows in %s; has its table moved?", len(documented), metricsDoc)
	}

	srv := redistest.New(t)
	app := startApp(t, map[string]string{
		"AUTHLIMIT_REDIS_URL":     srv.URL,
		"AUTHLIMIT_KEY_PREFIX":    srv.Prefix(t),
		"AUTHLIMIT_RULES":         "name=per-ip key=ip limit=1/1m",
		"AUTHLIMIT_GRPC_LISTEN":   "127.0.0.1:0",
		"AUTHLIMIT_RLS_CONFIG":    writeFile(t, "rls.yaml", rlsConfig),
		"AUTHLIMIT_REDIS_TIMEOUT": "1s",
		"AUTHLIMIT_SPOA_LISTEN":   "127.0.0.1:0",
	})
	for range 3 {
		app.do(t, authFrom("203.0.113.7"))
	}
	conn := grpcClient(t, app.app.grpc.listener.Addr().String())
	rl := pb.NewRateLimitServiceClient(conn)
	for range 2 {
		shouldRateLimit(t, rl, "another", "key3", "metrics")
	}
	// The SPOE agent: a decision, then a frame that breaks the protocol.
	spoaAddr := app.app.spoa.listener.Addr().String()
	sc, err := spoatest.Dial(spoaAddr, 16380)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Ask(spoatest.Request{Method: "GET", Target: "/", Headers: []string{"Host", "h"}}); err != nil {
		t.Fatal(err)
	}
	sc.Close()
	if nc, err := net.Dial("tcp", spoaAddr); err == nil {
		_, _ = nc.Write([]byte{0, 0, 0, 3, 1, 0, 0})
		_, _ = io.Copy(io.Discard, nc)
		nc.Close()
	}
	m := app.do(t, request{path: "/metrics"})
	wantStatus(t, m, 200, "/metrics")
	var missing []string
	seen := 0
	for _, line := range strings.Split(m.body, "\n") {
		name, ok := strings.CutPrefix(line, "# HELP ")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, " ")
		if !strings.HasPrefix(name, "authlimit_") {
			continue
		}
		seen++
		if !documented[name] {
			missing = append(missing, name)
		}
	}
	if seen < 10 {
		t.Fatalf("/metrics exports %d authlimit_ families; want the store's, the fronts' and the connections'", seen)
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("exported but not in the metrics table of %s:\n  %s", metricsDoc, strings.Join(missing, "\n  "))
	}
}
