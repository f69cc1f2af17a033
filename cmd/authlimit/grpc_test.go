package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/authlimit/authlimit/internal/redistest"
)

const rlsConfig = `
domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: ldap
    rate_limit: {unlimited: true}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 3}
`

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestGRPCConfigErrors(t *testing.T) {
	bad := writeFile(t, "bad.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minutes, requests_per_unit: 5}\n  - key: j\n    rate_limt: {}\n")
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"listen", map[string]string{"AUTHLIMIT_GRPC_LISTEN": "nope"}, []string{
			`AUTHLIMIT_GRPC_LISTEN: "nope" is not host:port (such as :8081 or 127.0.0.1:8081): address nope: missing port in address`}},
		{"missing file", map[string]string{"AUTHLIMIT_RLS_CONFIG": "/nonexistent/rls.yaml"}, []string{
			`AUTHLIMIT_RLS_CONFIG: stat /nonexistent/rls.yaml: no such file or directory`}},
		{"mistakes", map[string]string{"AUTHLIMIT_RLS_CONFIG": bad}, []string{
			`AUTHLIMIT_RLS_CONFIG: ` + bad + `:4: domain "d": descriptor "k": rate_limit.unit: "minutes" is not a unit (did you mean "minute"?) (want second, minute, hour, day, week, month, year)`,
			`AUTHLIMIT_RLS_CONFIG: ` + bad + `:6: domain "d": descriptor "j": rate_limt: unknown field (did you mean "rate_limit"?)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			said, err := checkEnv(t, tc.env)
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
	good := writeFile(t, "good.yaml", rlsConfig)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-check"}, []string{"AUTHLIMIT_RLS_CONFIG=" + good, "AUTHLIMIT_GRPC_LISTEN=127.0.0.1:8081"}, &out, io.Discard); err != nil {
		t.Fatalf("-check: %v", err)
	}
	for _, w := range []string{"grpc             127.0.0.1:8081 (health, ShouldRateLimit)", "rls config       " + good + ": 1 domains (another), 6 limits"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("-check output lacks %q:\n%s", w, out.String())
		}
	}
}

func grpcClient(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func shouldRateLimit(t *testing.T, c pb.RateLimitServiceClient, domain, key, value string) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: domain, Descriptors: []*rlpb.RateLimitDescriptor{
		{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return r
}

// twentyPerMinute asserts the 20/minute contract: 20 admitted, counting
// down, then OVER_LIMIT with nothing remaining.
func twentyPerMinute(t *testing.T, c pb.RateLimitServiceClient, value string) {
	t.Helper()
	for {
		// One window for the whole sequence.
		if left := time.Minute - time.Duration(time.Now().UnixNano()%int64(time.Minute)); left > 15*time.Second {
			break
		}
		time.Sleep(time.Second)
	}
	for i := 1; i <= 20; i++ {
		r := shouldRateLimit(t, c, "another", "key2", value)
		s := r.GetStatuses()[0]
		if r.GetOverallCode() != pb.RateLimitResponse_OK || s.GetLimitRemaining() != uint32(20-i) || s.GetCurrentLimit().GetRequestsPerUnit() != 20 || s.GetCurrentLimit().GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("request %d: %v", i, r)
		}
	}
	r := shouldRateLimit(t, c, "another", "key2", value)
	if s := r.GetStatuses()[0]; r.GetOverallCode() != pb.RateLimitResponse_OVER_LIMIT || s.GetCode() != pb.RateLimitResponse_OVER_LIMIT || s.GetLimitRemaining() != 0 {
		t.Fatalf("request 21: %v", r)
	}
	if r := shouldRateLimit(t, c, "unknown", "key2", value); r.GetOverallCode() != pb.RateLimitResponse_OK || r.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("unknown domain: %v", r)
	}
}

func TestRLSServed(t *testing.T) {
	stores(t, func(t *testing.T, env map[string]string) {
		env = with(env, "AUTHLIMIT_GRPC_LISTEN", "127.0.0.1:0", "AUTHLIMIT_RLS_CONFIG", writeFile(t, "rls.yaml", rlsConfig))
		s, err := loadConfig(env)
		if err != nil {
			t.Fatal(err)
		}
		a, err := newApp(context.Background(), s, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("newApp: %v", err)
		}
		defer a.close()
		ln := fasthttputil.NewInmemoryListener()
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() {
			served <- a.serve(ctx, a.listener(ln, s), 5*time.Second)
		}()
		conn := grpcClient(t, a.grpc.listener.Addr().String())
		for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
			h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health of %q: %v, %v", svc, h, err)
			}
		}
		twentyPerMinute(t, pb.NewRateLimitServiceClient(conn), "served")

		// POST /json on the HTTP port shares the counts.
		c := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://authlimit/json")
		req.Header.SetMethod("POST")
		req.SetBodyString(`{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"served"}]}]}`)
		if err := c.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != 429 || !bytes.Contains(resp.Body(), []byte(`"overallCode":"OVER_LIMIT"`)) {
			t.Errorf("/json: %d %s", resp.StatusCode(), resp.Body())
		}
		req.SetRequestURI("http://authlimit/auth")
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Errorf("/auth beside the rate-limit service: %v %d", err, resp.StatusCode())
		}

		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel2()
		if _, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx2, &pb.RateLimitRequest{Domain: "another"}, grpc.WaitForReady(false)); err == nil {
			t.Errorf("the gRPC server still answers after shutdown")
		}
	})
}

// moreContract asserts, in one window, what envoyproxy/ratelimit's users
// rely on besides a plain limit.
func moreContract(t *testing.T, c pb.RateLimitServiceClient, id string) {
	t.Helper()
	ask := func(hits uint32, kv ...string) *pb.RateLimitResponse {
		t.Helper()
		req := &pb.RateLimitRequest{Domain: "another", HitsAddend: hits}
		for i := 0; i+1 < len(kv); i += 2 {
			req.Descriptors = append(req.Descriptors, &rlpb.RateLimitDescriptor{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: kv[i], Value: kv[i+1]}}})
		}
		r, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatalf("ShouldRateLimit(%v): %v", kv, err)
		}
		return r
	}
	codes := func(r *pb.RateLimitResponse) string {
		s := r.GetOverallCode().String()
		for _, st := range r.GetStatuses() {
			s += fmt.Sprintf(" %s/%d", st.GetCode(), st.GetLimitRemaining())
		}
		return s
	}
	for _, step := range []struct {
		hits uint32
		kv   []string
		want string
	}{
		// Two descriptors, all or nothing: key3 is used up, key2 counts
		// nothing (a fresh key2 value has 20).
		{0, []string{"key2", id + "x", "key3", id}, "OK OK/19 OK/1"},
		{0, []string{"key2", id + "x", "key3", id}, "OK OK/18 OK/0"},
		{0, []string{"key2", id + "x", "key3", id}, "OVER_LIMIT OK/18 OVER_LIMIT/0"},
		{0, []string{"key2", id + "x"}, "OK OK/17"},
		// hits_addend.
		{5, []string{"key2", id + "h"}, "OK OK/15"},
		// Shadow: never over the limit.
		{0, []string{"shadow", id}, "OK OK/0"},
		{0, []string{"shadow", id}, "OK OK/0"},
		// Unlimited.
		{0, []string{"ldap", id}, "OK OK/4294967295"},
		// 0 per unit denies.
		{0, []string{"remote_address", "50.0.0.5"}, "OVER_LIMIT OVER_LIMIT/0"},
		// Wildcard: each value its own counter.
		{0, []string{"path", "/api/" + id}, "OK OK/2"},
		{0, []string{"path", "/api/" + id + "2"}, "OK OK/2"},
		// Unknown descriptor.
		{0, []string{"nope", id}, "OK OK/0"},
	} {
		if got := codes(ask(step.hits, step.kv...)); got != step.want {
			t.Fatalf("%v (hits %d): %s, want %s", step.kv, step.hits, got, step.want)
		}
	}
}

// TestRLSBinary runs the built authlimit with the rate-limit service, on
// both stores, and stops it with SIGTERM.
func TestRLSBinary(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	cfg := writeFile(t, "rls.yaml", rlsConfig)

	bad := exec.Command(bin, "-check")
	bad.Env = []string{"AUTHLIMIT_RLS_CONFIG=" + writeFile(t, "bad.yaml", "domain: d\nfoo: 1\n")}
	out, err := bad.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), `bad.yaml:2: domain "d": foo: unknown field (want domain, descriptors)`) {
		t.Errorf("-check with a bad configuration: %v\n%s", err, out)
	}

	stores(t, func(t *testing.T, env map[string]string) {
		b := runBinary(t, bin, with(env, "AUTHLIMIT_RLS_CONFIG", cfg))
		rc := pb.NewRateLimitServiceClient(grpcClient(t, b.grpcAddr))
		id := fmt.Sprintf("binary-%d", time.Now().UnixNano())
		twentyPerMinute(t, rc, id)
		moreContract(t, rc, id)
		b.stop(t)
	})
}

// TestGRPCHealthFollowsReadiness: with fail mode closed, the overall gRPC
// health is NOT_SERVING while Redis's circuit is open, as /readyz is 503,
// and SERVING again once Redis answers.
func TestGRPCHealthFollowsReadiness(t *testing.T) {
	t.Parallel()
	srv := redistest.New(t)
	if !srv.Owned {
		t.Skip("needs a Redis server the test can stop")
	}
	s, err := loadConfig(map[string]string{
		"AUTHLIMIT_REDIS_URL": srv.URL, "AUTHLIMIT_KEY_PREFIX": srv.Prefix(t), "AUTHLIMIT_FAIL_MODE": "closed",
		"AUTHLIMIT_BREAKER_FAILURES": "1", "AUTHLIMIT_GRPC_LISTEN": "127.0.0.1:0", "AUTHLIMIT_RLS_CONFIG": writeFile(t, "rls.yaml", rlsConfig),
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := newApp(context.Background(), s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("newApp: %v", err)
	}
	defer a.close()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- a.serve(ctx, a.listener(fasthttputil.NewInmemoryListener(), s), 5*time.Second)
	}()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	conn := grpcClient(t, a.grpc.listener.Addr().String())
	health := healthpb.NewHealthClient(conn)
	waitHealth := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			h, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
			if err == nil && h.GetStatus() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health %v, %v; want %v", h, err, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitHealth(healthpb.HealthCheckResponse_SERVING)
	srv.Stop(t)
	// A decision that fails opens the circuit.
	_, err = pb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "another", Descriptors: []*rlpb.RateLimitDescriptor{
		{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "key2", Value: "down"}}}}})
	if status := fmt.Sprint(err); !strings.Contains(status, "Unavailable") {
		t.Fatalf("ShouldRateLimit with Redis down: %v, want Unavailable", err)
	}
	waitHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	srv.Restart(t)
	waitHealth(healthpb.HealthCheckResponse_SERVING)
}
