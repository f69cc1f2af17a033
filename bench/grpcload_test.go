package main

// Tests of the gRPC load generator: how it reads answers, the requests it
// sends, and whole runs against an in-process rate-limit service.

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/envoyconf"
)

func TestClassifyRLS(t *testing.T) {
	tests := []struct {
		name     string
		reply    proto.Message
		want     verdict
		wantKind string
	}{
		{"ok", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, verdictAllowed, ""},
		{"over limit", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, verdictDenied, ""},
		{"unknown", &rlsv3.RateLimitResponse{}, verdictOther, "overall_code UNKNOWN"},
		{"over limit, statuses and headers", &rlsv3.RateLimitResponse{
			OverallCode:          rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 20, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}}},
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "ratelimit-limit", Value: "20"}, {Key: "ratelimit-remaining", Value: "0"}},
		}, verdictDenied, ""},
		{"wrong type", &authv3.CheckResponse{}, verdictOther, "reply of type *authv3.CheckResponse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, kind := classifyRLS(tt.reply); got != tt.want || kind != tt.wantKind {
				t.Errorf("classifyRLS = %d, %q; want %d, %q", got, kind, tt.want, tt.wantKind)
			}
			if _, isRLS := tt.reply.(*rlsv3.RateLimitResponse); isRLS {
				readsAsClassified(t, readRLS, tt.reply, tt.want, tt.wantKind)
			}
		})
	}
	if v, kind := readRLS([]byte{0x0a, 0x05, 'x'}); v != verdictOther || kind != "malformed RateLimitResponse" {
		t.Errorf("readRLS(truncated) = %d, %q; want the malformed answer", v, kind)
	}
}

// readsAsClassified checks that read, given reply's bytes, gives the
// verdict the classify functions give the decoded reply.
func readsAsClassified(t *testing.T, read func([]byte) (verdict, string), reply proto.Message, want verdict, wantKind string) {
	t.Helper()
	b, err := proto.Marshal(reply)
	if err != nil {
		t.Fatal(err)
	}
	if got, kind := read(b); got != want || kind != wantKind {
		t.Errorf("read(%x) = %d, %q; want %d, %q", b, got, kind, want, wantKind)
	}
	if n := testing.AllocsPerRun(20, func() { read(b) }); n != 0 && want != verdictOther {
		t.Errorf("read allocates %v times; want 0", n)
	}
}

func TestClassifyCheck(t *testing.T) {
	denied := func(c codes.Code, httpStatus typev3.StatusCode) *authv3.CheckResponse {
		return &authv3.CheckResponse{
			Status:       &rpcstatus.Status{Code: int32(c)},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{Status: &typev3.HttpStatus{Code: httpStatus}}},
		}
	}
	tests := []struct {
		name     string
		reply    proto.Message
		want     verdict
		wantKind string
	}{
		{"ok", &authv3.CheckResponse{Status: &rpcstatus.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}}, verdictAllowed, ""},
		{"ok without ok_response", &authv3.CheckResponse{Status: &rpcstatus.Status{}}, verdictOther, "status OK without ok_response"},
		{"429", denied(codes.ResourceExhausted, 429), verdictDenied, ""},
		{"503", denied(codes.Unavailable, 503), verdictOther, "status Unavailable, HTTP 503"},
		{"denied without response", &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)}}, verdictOther, "status PermissionDenied without denied_response"},
		{"ok with headers", &authv3.CheckResponse{Status: &rpcstatus.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
			ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "ratelimit-remaining", Value: "99"}}},
		}}}, verdictAllowed, ""},
		{"429 with headers and body", &authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: int32(codes.ResourceExhausted), Message: "over"},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status:  &typev3.HttpStatus{Code: 429},
				Headers: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "retry-after", Value: "1"}}},
				Body:    `{"type":"urn:authlimit:rate-limited"}`,
			}},
		}, verdictDenied, ""},
		{"denied without status", &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.ResourceExhausted)},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{}}}, verdictOther, "status ResourceExhausted, HTTP 0"},
		{"no status", &authv3.CheckResponse{}, verdictOther, "status OK without ok_response"},
		{"wrong type", &rlsv3.RateLimitResponse{}, verdictOther, "reply of type *ratelimitv3.RateLimitResponse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, kind := classifyCheck(tt.reply); got != tt.want || kind != tt.wantKind {
				t.Errorf("classifyCheck = %d, %q; want %d, %q", got, kind, tt.want, tt.wantKind)
			}
			if _, isCheck := tt.reply.(*authv3.CheckResponse); isCheck {
				readsAsClassified(t, readCheck, tt.reply, tt.want, tt.wantKind)
			}
		})
	}
	if v, kind := readCheck([]byte{0x12, 0x02, 0x0a, 0x05}); v != verdictOther || kind != "malformed CheckResponse" {
		t.Errorf("readCheck(truncated) = %d, %q; want the malformed answer", v, kind)
	}
}

// TestWorkerCount checks what one answer adds: every answer is timed;
// failures are counted by kind and reach the result's errors.
func TestWorkerCount(t *testing.T) {
	r := rlsRPC(nil)
	wire := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ok := wire(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK})
	over := wire(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT})
	unknown := wire(&rlsv3.RateLimitResponse{})
	var a, b grpcWorker
	a.count(r, ok, nil, time.Millisecond)
	a.count(r, ok, nil, time.Millisecond)
	a.count(r, over, nil, time.Millisecond)
	a.count(r, ok, status.Error(codes.Unavailable, "down"), time.Millisecond)
	b.count(r, unknown, nil, time.Millisecond)
	b.count(r, over, status.Error(codes.Unavailable, "down"), time.Millisecond)
	b.count(r, over, status.Error(codes.DeadlineExceeded, "slow"), time.Millisecond)

	res := mergeGRPC(time.Second, []*grpcWorker{&a, &b})
	if res.allowed != 2 || res.denied != 1 {
		t.Errorf("allowed, denied = %d, %d; want 2, 1", res.allowed, res.denied)
	}
	if got, want := res.hist.total, uint64(7); got != want {
		t.Errorf("timed answers = %d, want %d", got, want)
	}
	if got, want := res.errors(), uint64(4); got != want {
		t.Errorf("errors() = %d, want %d", got, want)
	}
	if got, want := res.errorDetail(), "gRPC DeadlineExceeded: 1, gRPC Unavailable: 2, overall_code UNKNOWN: 1"; got != want {
		t.Errorf("errorDetail() = %q, want %q", got, want)
	}
}

func TestRPCRequests(t *testing.T) {
	ips := clientIPs(3)
	t.Run("ShouldRateLimit", func(t *testing.T) {
		r := rlsRPC(ips)
		if len(r.reqs) != len(ips) {
			t.Fatalf("%d requests, want %d", len(r.reqs), len(ips))
		}
		for i, m := range append(r.reqs, r.probe) {
			want := probeIP().String()
			if i < len(ips) {
				want = ips[i].String()
			}
			req := m.(*rlsv3.RateLimitRequest)
			d := req.GetDescriptors()
			if req.GetDomain() != rlsDomain || len(d) != 1 || len(d[0].GetEntries()) != 1 ||
				d[0].GetEntries()[0].GetKey() != rlsKey || d[0].GetEntries()[0].GetValue() != want {
				t.Errorf("request %d = %v, want domain %s, one descriptor %s=%s", i, req, rlsDomain, rlsKey, want)
			}
		}
	})
	t.Run("Check", func(t *testing.T) {
		r := checkRPC(ips)
		if len(r.reqs) != len(ips) {
			t.Fatalf("%d requests, want %d", len(r.reqs), len(ips))
		}
		for i, m := range r.reqs {
			a := m.(*authv3.CheckRequest).GetAttributes()
			if got := a.GetSource().GetAddress().GetSocketAddress().GetAddress(); got != ips[i].String() {
				t.Errorf("request %d: source %q, want %s", i, got, ips[i])
			}
			if h := a.GetRequest().GetHttp(); h.GetMethod() != "GET" || h.GetPath() != "/" {
				t.Errorf("request %d: %s %s, want GET /", i, h.GetMethod(), h.GetPath())
			}
		}
	})
	if ip := probeIP(); netip.MustParsePrefix("198.18.0.0/15").Contains(ip) {
		t.Errorf("probe client %s is among the workload's clients", ip)
	}
}

// TestRLSConfig checks that the file both rate-limit services read is one
// authlimit accepts, with the HTTP systems' limit.
func TestRLSConfig(t *testing.T) {
	for _, w := range []string{"ips", "hot"} {
		t.Run(w, func(t *testing.T) {
			c, err := envoyconf.Parse([]envoyconf.File{{Name: "bench.yaml", Data: []byte(rlsConfigFor(w))}})
			if err != nil {
				t.Fatalf("Parse(%q): %v", rlsConfigFor(w), err)
			}
			ls, _ := c.Match(rlsDomain, []envoyconf.Entry{{Key: rlsKey, Value: clientIPs(1)[0].String()}}, nil)
			if len(ls) != 1 {
				t.Fatalf("Match found %d limits, want 1", len(ls))
			}
			l := limitFor(w)
			if got, want := ls[0].Unit.Window(), time.Duration(l.ms)*time.Millisecond; got != want {
				t.Errorf("window %v, want %v", got, want)
			}
			if got, want := int64(ls[0].RequestsPerUnit), l.n; got != want {
				t.Errorf("requests_per_unit %d, want %d", got, want)
			}
		})
	}
}

// rlsServer is an in-process rate-limit service: it admits clients whose
// address ends in an even number, denies the others, fails the client
// fail, and counts calls by client.
type rlsServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	fail  string
	block bool // answer nothing until the call ends
	mu    sync.Mutex
	calls map[string]int
}

func (s *rlsServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ip := req.GetDescriptors()[0].GetEntries()[0].GetValue()
	s.mu.Lock()
	s.calls[ip]++
	s.mu.Unlock()
	if s.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if ip == s.fail {
		return nil, status.Error(codes.Internal, "broken")
	}
	if netip.MustParseAddr(ip).As4()[3]%2 == 0 {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
}

// serveRLS serves s on a loopback port until the test ends.
func serveRLS(t *testing.T, s *rlsServer) string {
	t.Helper()
	s.calls = map[string]int{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, s)
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return l.Addr().String()
}

func TestGRPCLoadRun(t *testing.T) {
	ips := clientIPs(8)
	s := &rlsServer{fail: ips[4].String()}
	addr := serveRLS(t, s)
	l := &grpcLoad{addr: addr, rpc: rlsRPC(ips), conns: 3, warmup: 50 * time.Millisecond, duration: 300 * time.Millisecond}
	var edges []string
	res, err := l.run(context.Background(),
		func() error { edges = append(edges, "start"); return nil },
		func() error { edges = append(edges, "end"); return nil })
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if strings.Join(edges, ",") != "start,end" {
		t.Errorf("atStart and atEnd called as %v, want once each, in order", edges)
	}
	// 198.18.0.1 to .8: odd addresses are denied, .5 fails.
	if res.allowed == 0 || res.denied == 0 {
		t.Errorf("allowed %d, denied %d; want both above 0", res.allowed, res.denied)
	}
	if got := res.failed["gRPC Internal"]; got == 0 || got != res.errors() {
		t.Errorf("failed %v, errors() %d; want only gRPC Internal, at least once", res.failed, res.errors())
	}
	if res.hist.total != res.decisions()+res.errors() {
		t.Errorf("timed %d answers, want the %d decisions and %d errors", res.hist.total, res.decisions(), res.errors())
	}
	if res.elapsed < l.duration {
		t.Errorf("measured window %v, shorter than %v", res.elapsed, l.duration)
	}
	// Every client was asked: the workers cycle through the requests.
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ip := range ips {
		if s.calls[ip.String()] == 0 {
			t.Errorf("no call for %s; calls %v", ip, s.calls)
		}
	}
	var total int
	for _, n := range s.calls {
		total += n
	}
	if counted := res.decisions() + res.errors(); uint64(total) < counted {
		t.Errorf("the server answered %d calls, fewer than the %d the load counted", total, counted)
	}
}

// TestGRPCLoadHungServer checks that a server that never answers cannot
// hold a run past its end, and that its calls count as errors.
func TestGRPCLoadHungServer(t *testing.T) {
	addr := serveRLS(t, &rlsServer{block: true})
	l := &grpcLoad{addr: addr, rpc: rlsRPC(clientIPs(2)), conns: 2, duration: 50 * time.Millisecond}
	start := time.Now()
	res, err := l.run(context.Background(), func() error { return nil }, func() error { return nil })
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if d := time.Since(start); d > 3*stopGrace {
		t.Errorf("run took %v against a hung server, want about %v", d, stopGrace)
	}
	if res.decisions() != 0 {
		t.Errorf("%d decisions from a server that answers nothing", res.decisions())
	}
}

// TestGRPCLoadCanceled checks that canceling the run's context ends it
// with the context's error.
func TestGRPCLoadCanceled(t *testing.T) {
	addr := serveRLS(t, &rlsServer{})
	l := &grpcLoad{addr: addr, rpc: rlsRPC(clientIPs(2)), conns: 2, warmup: time.Hour, duration: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := l.run(ctx, func() error { return nil }, func() error { return nil }); err != context.Canceled {
		t.Errorf("run = %v, want %v", err, context.Canceled)
	}
}

// TestWaitGRPC checks the readiness probe: ready once the probe gets a
// decision, not ready on a failed call.
func TestWaitGRPC(t *testing.T) {
	if err := waitGRPC(serveRLS(t, &rlsServer{}), rlsRPC(nil))(); err != nil {
		t.Errorf("waitGRPC on a working service: %v", err)
	}
	err := waitGRPC(serveRLS(t, &rlsServer{fail: probeIP().String()}), rlsRPC(nil))()
	if err == nil || !strings.Contains(err.Error(), "gRPC Internal") {
		t.Errorf("waitGRPC on a failing service = %v, want its gRPC Internal", err)
	}
}

// TestGRPCNull checks that the gRPC null server's answers read as
// admissions for both methods.
func TestGRPCNull(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveGRPCNullOn(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	for _, r := range []*rpc{rlsRPC(nil), checkRPC(nil)} {
		if err := waitGRPC(l.Addr().String(), r)(); err != nil {
			t.Errorf("%s: %v", r.method, err)
		}
	}
}
