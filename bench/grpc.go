package main

// This file holds the gRPC systems: envoyproxy/ratelimit's ShouldRateLimit,
// authlimit's ShouldRateLimit from the same configuration file, and
// authlimit's ext_authz Check with the HTTP systems' rule; and the requests
// the gRPC load sends them.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/front/grpcwire"
)

// rlsDomain and rlsKey are the rate-limit service's domain and descriptor
// key, as Envoy's remote_address action sends it.
const (
	rlsDomain = "bench"
	rlsKey    = "remote_address"
)

// probeIP is the client of readiness probes: outside 198.18.0.0/15, so it
// never shares a counter with the workload's clients.
func probeIP() netip.Addr { return netip.AddrFrom4([4]byte{192, 0, 2, 1}) }

// rlsConfigFor is the envoyproxy/ratelimit configuration both rate-limit
// services read: one descriptor per client address with the HTTP systems'
// limit (a fixed window, the only algorithm envoyproxy/ratelimit has and
// authlimit's default for this format).
func rlsConfigFor(workload string) string {
	n, unit := rlsLimit(workload)
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: %s\n    rate_limit:\n      unit: %s\n      requests_per_unit: %d\n", rlsDomain, rlsKey, unit, n)
}

// rlsLimit is the workload's limit in the configuration's terms.
func rlsLimit(workload string) (requestsPerUnit int64, unit string) {
	l := limitFor(workload)
	if l.ms == 3_600_000 {
		return l.n, "hour"
	}
	return l.n, "minute"
}

// rlsLimitText is the workload's limit for the results.
func rlsLimitText(workload string) string {
	n, unit := rlsLimit(workload)
	return fmt.Sprintf("`requests_per_unit: %d`, `unit: %s` (a fixed window)", n, unit)
}

// rlsRPC is ShouldRateLimit with one request per client: the domain and
// one descriptor, the client's address, as Envoy sends for a
// remote_address action.
func rlsRPC(ips []netip.Addr) *rpc {
	req := func(ip netip.Addr) proto.Message {
		return &rlsv3.RateLimitRequest{
			Domain: rlsDomain,
			Descriptors: []*rlpb.RateLimitDescriptor{{
				Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: rlsKey, Value: ip.String()}},
			}},
		}
	}
	r := &rpc{
		method:   rlsv3.RateLimitService_ShouldRateLimit_FullMethodName,
		probe:    req(probeIP()),
		newReply: func() proto.Message { return &rlsv3.RateLimitResponse{} },
		classify: classifyRLS,
		read:     readRLS,
	}
	for _, ip := range ips {
		r.reqs = append(r.reqs, req(ip))
	}
	return r
}

// classifyRLS reads a RateLimitResponse: OK admits, OVER_LIMIT denies.
func classifyRLS(m proto.Message) (verdict, string) {
	resp, ok := m.(*rlsv3.RateLimitResponse)
	if !ok {
		return verdictOther, fmt.Sprintf("reply of type %T", m)
	}
	switch c := resp.GetOverallCode(); c {
	case rlsv3.RateLimitResponse_OK:
		return verdictAllowed, ""
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return verdictDenied, ""
	default:
		return verdictOther, "overall_code " + c.String()
	}
}

// readRLS is classifyRLS from a RateLimitResponse's bytes: its
// overall_code (field 1).
func readRLS(msg []byte) (verdict, string) {
	var c uint64
	if !eachField(msg, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) bool {
		if num == 1 && typ == protowire.VarintType {
			c = v
		}
		return true
	}) {
		return verdictOther, "malformed RateLimitResponse"
	}
	switch rlsv3.RateLimitResponse_Code(int32(c)) {
	case rlsv3.RateLimitResponse_OK:
		return verdictAllowed, ""
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return verdictDenied, ""
	default:
		return verdictOther, "overall_code " + rlsv3.RateLimitResponse_Code(int32(c)).String()
	}
}

// readCheck is classifyCheck from a CheckResponse's bytes: the code of its
// status (field 1, google.rpc.Status's field 1), whether it has an
// ok_response (field 3), and its denied_response's (field 2) HTTP status
// (field 1, type.v3.HttpStatus's field 1).
func readCheck(msg []byte) (verdict, string) {
	var code, httpCode uint64
	var ok, denied bool
	firstVarint := func(b []byte) (v uint64, good bool) {
		good = eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, _ []byte) bool {
			if num == 1 && typ == protowire.VarintType {
				v = x
			}
			return true
		})
		return v, good
	}
	good := eachField(msg, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) bool {
		if typ != protowire.BytesType {
			return true
		}
		var fine bool
		switch num {
		case 1:
			code, fine = firstVarint(b)
			return fine
		case 2:
			denied = true
			return eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) bool {
				if num == 1 && typ == protowire.BytesType {
					httpCode, fine = firstVarint(b)
					return fine
				}
				return true
			})
		case 3:
			ok = true
		}
		return true
	})
	if !good {
		return verdictOther, "malformed CheckResponse"
	}
	c := codes.Code(int32(code))
	switch {
	case c == codes.OK && ok:
		return verdictAllowed, ""
	case c == codes.OK:
		return verdictOther, "status OK without ok_response"
	case denied && httpCode == 429:
		return verdictDenied, ""
	case denied:
		return verdictOther, fmt.Sprintf("status %s, HTTP %d", c, httpCode)
	default:
		return verdictOther, fmt.Sprintf("status %s without denied_response", c)
	}
}

// eachField calls f with each field of a protobuf message: its number and
// wire type, a varint's value, a length-delimited field's bytes. It
// reports false if the message is malformed or f returns false.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, p []byte) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v uint64
		var p []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			p, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 || !f(num, typ, v, p) {
			return false
		}
		b = b[n:]
	}
	return true
}

// checkRPC is Check with one request per client, as Envoy's ext_authz
// filter sends for a GET of / from that client: the client is the source
// address (Envoy's downstream peer), so no proxy header is read.
func checkRPC(ips []netip.Addr) *rpc {
	req := func(ip netip.Addr) proto.Message {
		return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source:      &authv3.AttributeContext_Peer{Address: socketAddress(ip.String(), 40000)},
			Destination: &authv3.AttributeContext_Peer{Address: socketAddress("127.0.0.1", 8000)},
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Id:       "1",
				Method:   "GET",
				Path:     "/",
				Host:     "127.0.0.1",
				Scheme:   "http",
				Protocol: "HTTP/1.1",
				Headers: map[string]string{
					":authority": "127.0.0.1",
					":method":    "GET",
					":path":      "/",
					":scheme":    "http",
					"user-agent": "authlimit-bench",
				},
			}},
		}}
	}
	r := &rpc{
		method:   authv3.Authorization_Check_FullMethodName,
		probe:    req(probeIP()),
		newReply: func() proto.Message { return &authv3.CheckResponse{} },
		classify: classifyCheck,
		read:     readCheck,
	}
	for _, ip := range ips {
		r.reqs = append(r.reqs, req(ip))
	}
	return r
}

func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// classifyCheck reads a CheckResponse: status OK with an ok_response
// admits; a denied_response with status 429 (RESOURCE_EXHAUSTED) denies,
// as /auth's 429 does.
func classifyCheck(m proto.Message) (verdict, string) {
	resp, ok := m.(*authv3.CheckResponse)
	if !ok {
		return verdictOther, fmt.Sprintf("reply of type %T", m)
	}
	c := codes.Code(resp.GetStatus().GetCode())
	switch {
	case c == codes.OK && resp.GetOkResponse() != nil:
		return verdictAllowed, ""
	case c == codes.OK:
		return verdictOther, "status OK without ok_response"
	case resp.GetDeniedResponse().GetStatus().GetCode() == 429:
		return verdictDenied, ""
	case resp.GetDeniedResponse() != nil:
		return verdictOther, fmt.Sprintf("status %s, HTTP %d", c, resp.GetDeniedResponse().GetStatus().GetCode())
	default:
		return verdictOther, fmt.Sprintf("status %s without denied_response", c)
	}
}

// grpcRatioRows are the summary's rows for the gRPC systems.
func grpcRatioRows() []ratioRow {
	return []ratioRow{
		{label: "grpc-null / null (a gRPC answer's floor over an HTTP answer's)", num: "grpc-null", den: "null"},
		{label: "authlimit-check / grpc-null", num: "authlimit-check", den: "grpc-null"},
		{label: "authlimit-rls / envoy-ratelimit (gRPC ShouldRateLimit)", num: "authlimit-rls", den: "envoy-ratelimit"},
		{label: "authlimit-rls p99 / envoy-ratelimit p99", num: "authlimit-rls", den: "envoy-ratelimit", of: p99Of},
		{label: "authlimit-check / authlimit-redis-1 (gRPC Check / HTTP /auth)", num: "authlimit-check", den: "authlimit-redis-1"},
	}
}

// startAuthlimitRLS starts authlimit serving ShouldRateLimit from the
// rate-limit configuration envoy-ratelimit reads.
func startAuthlimitRLS(ctx context.Context, e *runEnv) (*instance, error) {
	path := filepath.Join(e.dir, "ratelimit.yaml")
	if err := os.WriteFile(path, []byte(rlsConfigFor(e.workload)), 0o644); err != nil {
		return nil, fmt.Errorf("write rate-limit configuration: %w", err)
	}
	return startAuthlimitGRPC(ctx, e, rlsRPC, "AUTHLIMIT_RLS_CONFIG="+path)
}

// startAuthlimitCheck starts authlimit serving Check with the HTTP
// systems' rule.
func startAuthlimitCheck(ctx context.Context, e *runEnv) (*instance, error) {
	return startAuthlimitGRPC(ctx, e, checkRPC)
}

// startAuthlimitGRPC starts authlimit on Redis with the HTTP systems' rule
// and its gRPC server, and waits until the probe of rpcFor gets a decision.
func startAuthlimitGRPC(ctx context.Context, e *runEnv, rpcFor func([]netip.Addr) *rpc, extra ...string) (*instance, error) {
	grpcAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, addr, err := startAuthlimit(ctx, e, rulesFor(e.workload, false, ""), append(extra, "AUTHLIMIT_GRPC_LISTEN="+grpcAddr)...)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, "authlimit gRPC", readyTimeout, waitGRPC(grpcAddr, rpcFor(nil)), p); err != nil {
		p.stop()
		return nil, err
	}
	return &instance{addr: grpcAddr, procs: []*proc{p}, serverRoots: []int{p.pid()}, metrics: []string{"http://" + addr + "/metrics"}}, nil
}

// startEnvoyRatelimit starts envoyproxy/ratelimit on the run's Redis, as
// its README runs it: configuration under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY
// /config, no statsd, every port on loopback; every other setting its
// default (a pool of 10 Redis connections, no pipelining window, no local
// cache of keys over their limit).
func startEnvoyRatelimit(ctx context.Context, e *runEnv) (*instance, error) {
	root := filepath.Join(e.dir, "runtime")
	conf := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		return nil, fmt.Errorf("make envoyproxy/ratelimit runtime directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(conf, "bench.yaml"), []byte(rlsConfigFor(e.workload)), 0o644); err != nil {
		return nil, fmt.Errorf("write envoyproxy/ratelimit configuration: %w", err)
	}
	var ports [3]string
	for i := range ports {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		if _, ports[i], err = net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("free port %s: %w", addr, err)
		}
	}
	grpcAddr := net.JoinHostPort("127.0.0.1", ports[0])
	env := childEnv(
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL="+e.redis.addr,
		"RUNTIME_ROOT="+root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"USE_STATSD=false",
		"LOG_LEVEL=warn",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+ports[0],
		"HOST=127.0.0.1", "PORT="+ports[1],
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+ports[2],
	)
	p, err := startProc(e.dir, "ratelimit", e.o.ratelimit, nil, env)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, "envoyproxy/ratelimit", readyTimeout, waitGRPC(grpcAddr, rlsRPC(nil)), p); err != nil {
		p.stop()
		return nil, err
	}
	return &instance{addr: grpcAddr, procs: []*proc{p}, serverRoots: []int{p.pid()}}, nil
}

// grpcNull answers every ShouldRateLimit with OK and every Check with an
// ok_response, deciding nothing: the floor of any gRPC answer of
// authlimit's own gRPC server, as the null server is of any HTTP answer.
// grpcNullAnswers are grpc-null's answers, encoded once: it neither decodes
// a request nor encodes an answer per call.
func grpcNullAnswers() (rls, check []byte, err error) {
	rls, err = proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK})
	if err != nil {
		return nil, nil, err
	}
	check, err = proto.Marshal(&authv3.CheckResponse{Status: &rpcstatus.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}})
	return rls, check, err
}

// serveGRPCNull serves grpc-null until ctx ends.
func serveGRPCNull(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve-grpc-null", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	return serveGRPCNullOn(ctx, l)
}

// serveGRPCNullOn serves grpc-null on l until ctx ends, on the server
// authlimit serves gRPC with.
func serveGRPCNullOn(ctx context.Context, l net.Listener) error {
	g := grpcwire.NewServer(grpcwire.Options{})
	rls, check, err := grpcNullAnswers()
	if err != nil {
		return err
	}
	answer := func(b []byte) func(context.Context, []byte, []byte) ([]byte, error) {
		return func(_ context.Context, _, out []byte) ([]byte, error) { return append(out, b...), nil }
	}
	if err := grpcwire.UnaryRaw(g, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", answer(rls)); err != nil {
		return err
	}
	if err := grpcwire.UnaryRaw(g, "/envoy.service.auth.v3.Authorization/Check", answer(check)); err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(l) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	g.GracefulStop()
	return nil
}

// startGRPCNull starts `bench serve-grpc-null` on a free loopback port and
// waits until it answers Check.
func startGRPCNull(ctx context.Context, e *runEnv) (*instance, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := startProc(e.dir, "grpc-null", e.o.selfBinary, []string{"serve-grpc-null", "-listen", addr}, nil)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, "gRPC null server", readyTimeout, waitGRPC(addr, checkRPC(nil)), p); err != nil {
		p.stop()
		return nil, err
	}
	return &instance{addr: addr, procs: []*proc{p}, serverRoots: []int{p.pid()}}, nil
}
