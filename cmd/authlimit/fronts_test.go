package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/rules"
)

// buildBinary returns the built authlimit (see authlimitBinary).
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	return authlimitBinary(t)
}

// binary is a running authlimit, killed at the end of the test unless it
// was stopped; its logs are shown when the test fails.
type binary struct {
	httpAddr, grpcAddr string
	cmd                *exec.Cmd
	exited             chan error
	stopped            bool
}

// runBinary starts bin on free loopback ports for HTTP and gRPC, with env
// besides, and waits until gRPC health says SERVING.
func runBinary(t *testing.T, bin string, env map[string]string) *binary {
	t.Helper()
	var ports [2]int
	for i := range ports {
		p, err := redistest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	b := &binary{httpAddr: "127.0.0.1:" + strconv.Itoa(ports[0]), grpcAddr: "127.0.0.1:" + strconv.Itoa(ports[1]), exited: make(chan error, 1)}
	b.cmd = exec.Command(bin)
	b.cmd.Env = []string{"AUTHLIMIT_LISTEN=" + b.httpAddr, "AUTHLIMIT_GRPC_LISTEN=" + b.grpcAddr}
	for k, v := range env {
		b.cmd.Env = append(b.cmd.Env, k+"="+v)
	}
	var logs bytes.Buffer
	// One writer for both: exec.Cmd then writes from one goroutine.
	b.cmd.Stdout, b.cmd.Stderr = &logs, &logs
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { b.exited <- b.cmd.Wait() }()
	t.Cleanup(func() {
		if !b.stopped {
			_ = b.cmd.Process.Kill()
			<-b.exited
		}
		if t.Failed() {
			t.Logf("authlimit logs:\n%s", logs.String())
		}
	})
	health := healthpb.NewHealthClient(grpcClient(t, b.grpcAddr))
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		h, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && h.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("gRPC health never SERVING: %v, %v", h, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (b *binary) stop(t *testing.T) {
	t.Helper()
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-b.exited:
		b.stopped = true
		if err != nil {
			t.Errorf("authlimit exited after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("authlimit did not exit within 30s of SIGTERM")
	}
}

// TestThreeFrontsOneBinary runs one authlimit on Redis with /auth, Check
// and ShouldRateLimit: each answers from one engine, and, once Redis is
// stopped, each gives its fail mode's documented answer: open admits
// (OK, statuses without counts), closed refuses (503 with Retry-After, a
// 503 denied_response, gRPC Unavailable), local decides with every limit
// divided by AUTHLIMIT_LOCAL_DIVISOR, the limits Envoy sends with a
// descriptor too.
func TestThreeFrontsOneBinary(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	cfg := writeFile(t, "rls.yaml", `
domain: d
descriptors:
  - {key: k, rate_limit: {unit: hour, requests_per_unit: 4}}
`)
	for _, mode := range []string{"open", "closed", "local"} {
		t.Run(mode, func(t *testing.T) {
			// Each mode has its own Redis and its own process.
			t.Parallel()
			srv := ownRedis(t)
			b := runBinary(t, bin, redisEnv(srv, "fronts"+strconv.FormatInt(time.Now().UnixNano(), 36),
				"AUTHLIMIT_RULES", "name=r limit=4/1h", "AUTHLIMIT_RLS_CONFIG", cfg,
				"AUTHLIMIT_FAIL_MODE", mode, "AUTHLIMIT_LOCAL_DIVISOR", "2"))
			conn := grpcClient(t, b.grpcAddr)
			f := fronts{t: t, http: b.httpAddr, authz: authv3.NewAuthorizationClient(conn), rls: pb.NewRateLimitServiceClient(conn)}
			for {
				// One window for the whole sequence (hours: it waits only
				// in the last 20 seconds of one).
				if left := time.Hour - time.Duration(time.Now().UnixNano()%int64(time.Hour)); left > 20*time.Second {
					break
				}
				time.Sleep(time.Second)
			}

			// Redis up: /auth and Check spend one client's quota of 4;
			// ShouldRateLimit counts its descriptors.
			if st, h := f.auth("203.0.113.1"); st != 200 || h.Get("X-RateLimit-Remaining") != "3" {
				t.Fatalf("/auth: %d remaining %q, want 200 remaining 3", st, h.Get("X-RateLimit-Remaining"))
			}
			if c, st, h := f.check("203.0.113.1"); c != codes.OK || st != 200 || h["X-RateLimit-Remaining"] != "2" {
				t.Fatalf("Check after /auth: %v %d %v, want OK remaining 2", c, st, h)
			}
			if r, err := f.ask("up", 0); err != nil || r.GetOverallCode() != pb.RateLimitResponse_OK || r.Statuses[0].GetLimitRemaining() != 3 {
				t.Fatalf("ShouldRateLimit: %v %v, want OK remaining 3", r, err)
			}
			if r, err := f.ask("up", 6); err != nil || r.GetOverallCode() != pb.RateLimitResponse_OK || r.Statuses[0].GetLimitRemaining() != 5 {
				t.Fatalf("ShouldRateLimit with a limit of 6: %v %v, want OK remaining 5", r, err)
			}

			srv.Stop(t)
			// Until the circuit opens, a decision that fails is 503 in
			// every mode; then the fail mode answers.
			for i, deadline := 0, time.Now().Add(20*time.Second); ; i++ {
				st, h := f.auth("198.51.100." + strconv.Itoa(i%250))
				if failModeAnswers(mode, st, h) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("/auth with Redis down never gave fail mode %s's answer: %d %v", mode, st, h)
				}
				time.Sleep(20 * time.Millisecond)
			}

			switch mode {
			case "open":
				if st, h := f.auth("203.0.113.2"); st != 200 || h.Get("X-RateLimit-Limit") != "" {
					t.Errorf("/auth, failing open: %d %v, want 200 without counts", st, h)
				}
				if c, st, _ := f.check("203.0.113.2"); c != codes.OK || st != 200 {
					t.Errorf("Check, failing open: %v %d, want OK", c, st)
				}
				r, err := f.ask("down", 0)
				if err != nil || r.GetOverallCode() != pb.RateLimitResponse_OK || r.Statuses[0].GetCurrentLimit() != nil || len(r.GetResponseHeadersToAdd()) != 0 {
					t.Errorf("ShouldRateLimit, failing open: %v %v, want OK without counts", r, err)
				}
			case "closed":
				if st, h := f.auth("203.0.113.2"); st != 503 || h.Get("Retry-After") != "1" {
					t.Errorf("/auth, failing closed: %d %v, want 503 with Retry-After 1", st, h)
				}
				if c, st, h := f.check("203.0.113.2"); c != codes.Unavailable || st != 503 || h["Retry-After"] != "1" {
					t.Errorf("Check, failing closed: %v %d %v, want Unavailable, 503 with Retry-After 1", c, st, h)
				}
				if r, err := f.ask("down", 0); status.Code(err) != codes.Unavailable {
					t.Errorf("ShouldRateLimit, failing closed: %v %v, want Unavailable", r, err)
				}
			case "local":
				// 4 divided by 2: /auth and Check share the client's 2.
				if st, h := f.auth("203.0.113.2"); st != 200 || h.Get("X-RateLimit-Limit") != "2" || h.Get("X-RateLimit-Remaining") != "1" {
					t.Errorf("/auth, deciding locally: %d %v, want 200, limit 2, remaining 1", st, h)
				}
				if c, st, h := f.check("203.0.113.2"); c != codes.OK || st != 200 || h["X-RateLimit-Remaining"] != "0" {
					t.Errorf("Check, deciding locally: %v %d %v, want OK remaining 0", c, st, h)
				}
				if c, st, _ := f.check("203.0.113.2"); c != codes.ResourceExhausted || st != 429 {
					t.Errorf("Check, deciding locally, third: %v %d, want a 429", c, st)
				}
				// The configured 4/hour and Envoy's 6/hour, divided.
				for _, tc := range []struct {
					override uint32
					left     []uint32
				}{{0, []uint32{1, 0}}, {6, []uint32{2, 1, 0}}} {
					for i, left := range tc.left {
						r, err := f.ask("down", tc.override)
						if err != nil || r.GetOverallCode() != pb.RateLimitResponse_OK || r.Statuses[0].GetLimitRemaining() != left {
							t.Errorf("ShouldRateLimit (limit override %d), deciding locally, request %d: %v %v, want OK remaining %d", tc.override, i+1, r, err, left)
						}
					}
					if r, err := f.ask("down", tc.override); err != nil || r.GetOverallCode() != pb.RateLimitResponse_OVER_LIMIT {
						t.Errorf("ShouldRateLimit (limit override %d), deciding locally, past the share: %v %v, want OVER_LIMIT", tc.override, r, err)
					}
				}
			}
			b.stop(t)
		})
	}
}

// failModeAnswers reports whether /auth's answer is the fail mode's rather
// than a failed decision's.
func failModeAnswers(mode string, st int, h http.Header) bool {
	switch mode {
	case "open":
		return st == 200 && h.Get("X-RateLimit-Limit") == ""
	case "local":
		return st == 200 && h.Get("X-RateLimit-Limit") == "2"
	}
	// A failed decision is 503 too: once the circuit is open, fail mode
	// closed is counted as such.
	return st == 503
}

// fronts asks one authlimit through its three fronts.
type fronts struct {
	t     *testing.T
	http  string
	authz authv3.AuthorizationClient
	rls   pb.RateLimitServiceClient
}

// auth asks /auth for a client behind the trusted loopback proxy.
func (f fronts) auth(client string) (int, http.Header) {
	f.t.Helper()
	req, err := http.NewRequest("GET", "http://"+f.http+"/auth", nil)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-For", client)
	req.Header.Set("X-Forwarded-Uri", "/")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatalf("/auth: %v", err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// check asks Check for a client connected to Envoy from its address, and
// returns the gRPC code, the HTTP status and the headers of the answer.
func (f fronts) check(client string) (codes.Code, int, map[string]string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := f.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: client, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 50000}}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/", Host: "api.example.com"}},
	}})
	if err != nil {
		f.t.Fatalf("Check: %v", err)
	}
	h := map[string]string{}
	st := 200
	hs := resp.GetOkResponse().GetResponseHeadersToAdd()
	if d := resp.GetDeniedResponse(); d != nil {
		st, hs = int(d.GetStatus().GetCode()), d.GetHeaders()
	}
	for _, x := range hs {
		h[x.GetHeader().GetKey()] = x.GetHeader().GetValue()
	}
	return codes.Code(resp.GetStatus().GetCode()), st, h
}

// ask asks ShouldRateLimit about domain d's descriptor k=value, with a
// limit override of rpu per hour unless rpu is 0.
func (f fronts) ask(value string, rpu uint32) (*pb.RateLimitResponse, error) {
	f.t.Helper()
	d := &rlpb.RateLimitDescriptor{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "k", Value: value}}}
	if rpu > 0 {
		d.Limit = &rlpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typepb.RateLimitUnit_HOUR}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := f.rls.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlpb.RateLimitDescriptor{d}})
	if err == nil && len(r.GetStatuses()) != 1 {
		f.t.Fatalf("ShouldRateLimit: %d statuses for one descriptor", len(r.GetStatuses()))
	}
	return r, err
}

// TestRulesSwapKeepsTheRLSLimitsKnown: a new rule set (a reload of
// AUTHLIMIT_RULES_FILE) leaves the rate-limit service's limits known to
// the guard: its deny cache still answers their denials.
func TestRulesSwapKeepsTheRLSLimitsKnown(t *testing.T) {
	cfg := writeFile(t, "rls.yaml", `
domain: d
descriptors:
  - {key: one, rate_limit: {unit: hour, requests_per_unit: 1}}
`)
	ta := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=r limit=4/1m", "AUTHLIMIT_RLS_CONFIG": cfg})
	a := ta.app
	rs, err := rules.Parse("name=r2 limit=5/1m")
	if err != nil {
		t.Fatal(err)
	}
	set, err := a.sets.WithRules(rs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a.sets.Store(set, time.Now())
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlpb.RateLimitDescriptor{
		{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "one", Value: "x"}}},
	}}
	for deadline := time.Now().Add(10 * time.Second); ; {
		hits := metric(t, ta, "authlimit_deny_cache_hits_total")
		r, err := a.rls.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if metric(t, ta, "authlimit_deny_cache_hits_total") > hits {
			if r.GetOverallCode() != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].GetCurrentLimit() == nil {
				t.Fatalf("the deny cache's answer: %v, want OVER_LIMIT with its limit", r)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a rules swap, the deny cache never answered a rate-limit service denial: %v", r)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newTestApp builds the app of the environment in this process, closed
// at the end of the test.
func newTestApp(t *testing.T, environ map[string]string) (*app, *settings) {
	t.Helper()
	s, err := loadConfig(environ)
	if err != nil {
		t.Fatal(err)
	}
	a, err := newApp(context.Background(), s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	return a, s
}
