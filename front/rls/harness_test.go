package rls

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/front/grpcwire"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset"
	"github.com/authlimit/authlimit/store/redis"
)

// env is a Service behind a real gRPC server on a loopback port, deciding
// through a guard over the store under test.
type env struct {
	svc    *Service
	client pb.RateLimitServiceClient
	conn   *grpc.ClientConn
	reg    *prometheus.Registry
	redis  *redistest.Server // nil for the memory store
}

type storeKind string

const (
	memoryStore  storeKind = "memory"
	redisStore   storeKind = "redis"
	clusterStore storeKind = "redis_cluster"
)

// eachStore runs f against the memory store and against a real Redis, in
// parallel: each run starts a store (and a server) of its own.
func eachStore(t *testing.T, f func(t *testing.T, kind storeKind)) {
	for _, k := range []storeKind{memoryStore, redisStore} {
		t.Run(string(k), func(t *testing.T) { t.Parallel(); f(t, k) })
	}
}

// eachStoreAndCluster runs f against the memory store, a real Redis and a
// Redis Cluster, where a request's descriptors land in different slots, in
// parallel as eachStore does.
func eachStoreAndCluster(t *testing.T, f func(t *testing.T, kind storeKind)) {
	for _, k := range []storeKind{memoryStore, redisStore, clusterStore} {
		t.Run(string(k), func(t *testing.T) { t.Parallel(); f(t, k) })
	}
}

func parseConfig(t testing.TB, files ...string) *envoyconf.Config {
	t.Helper()
	var fs []envoyconf.File
	for i, f := range files {
		fs = append(fs, envoyconf.File{Name: "config" + string(rune('0'+i)) + ".yaml", Data: []byte(f)})
	}
	c, err := envoyconf.Parse(fs)
	if err != nil {
		t.Fatalf("envoyconf.Parse: %v", err)
	}
	return c
}

// start serves the configuration over gRPC with a guard over the store
// kind, fail mode closed.
func start(t testing.TB, kind storeKind, files ...string) *env {
	return startWith(t, kind, guard.FailClosed, files...)
}

func startWith(t testing.TB, kind storeKind, mode guard.FailMode, files ...string) *env {
	t.Helper()
	return startOpts(t, kind, mode, nil, files...)
}

// startOpts is startWith, the service's options changed by mod.
func startOpts(t testing.TB, kind storeKind, mode guard.FailMode, mod func(*Options), files ...string) *env {
	t.Helper()
	h := newHolder(t, parseConfig(t, files...))
	e := &env{reg: prometheus.NewRegistry()}
	opts := guard.Options{
		Rules:             h,
		FailMode:          mode,
		BreakerFailures:   1,
		BreakerBackoff:    50 * time.Millisecond,
		BreakerMaxBackoff: 100 * time.Millisecond,
		ProbeTimeout:      time.Second,
		DenyCacheSize:     1000,
		Registry:          e.reg,
	}
	switch kind {
	case memoryStore:
		m := algo.NewMemory(algo.MemoryOptions{})
		t.Cleanup(func() { _ = m.Close() })
		opts.Store = m
	case redisStore:
		e.redis = redistest.New(t)
		rs := redis.New(e.redis.Client(t), redis.Options{Prefix: e.redis.Prefix(t), Timeout: 2 * time.Second})
		t.Cleanup(func() { _ = rs.Close() })
		opts.Store, opts.Remote = rs, true
	case clusterStore:
		c := redistest.NewCluster(t)
		client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs})
		t.Cleanup(func() { _ = client.Close() })
		rs := redis.New(client, redis.Options{Prefix: "rls" + strconv.FormatInt(time.Now().UnixNano(), 36), Timeout: 2 * time.Second})
		t.Cleanup(func() { _ = rs.Close() })
		opts.Store, opts.Remote = rs, true
	}
	g, err := guard.New(opts)
	if err != nil {
		t.Fatalf("guard.New: %v", err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatalf("guard.Start: %v", err)
	}
	t.Cleanup(g.Close)
	opts2 := Options{Rules: h, Engine: newEngine(t, h, g, e.reg, false), Registry: e.reg}
	if mod != nil {
		mod(&opts2)
	}
	e.svc, err = New(opts2)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcwire.NewServer(grpcwire.Options{})
	if err := e.svc.Register(srv); err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	e.conn, err = grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.conn.Close() })
	e.client = pb.NewRateLimitServiceClient(e.conn)
	return e
}

// newHolder returns a holder of the rule set of cfg and /auth's default
// rules (the rate-limit service uses none of them).
func newHolder(t testing.TB, cfg *envoyconf.Config) *ruleset.Holder {
	t.Helper()
	rs, err := rules.Parse(rules.Default)
	if err != nil {
		t.Fatal(err)
	}
	set, err := ruleset.New(rs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ruleset.NewHolder(set)
}

// newEngine returns an engine deciding h's rules with d.
func newEngine(t testing.TB, h *ruleset.Holder, d decide.Decider, reg prometheus.Registerer, shadow bool) *decide.Engine {
	t.Helper()
	e, err := decide.New(decide.Options{Rules: h, Decider: d, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429, Shadow: shadow, Registry: reg})
	if err != nil {
		t.Fatalf("decide.New: %v", err)
	}
	return e
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlpb.RateLimitDescriptor {
	d := &rlpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func withHits(d *rlpb.RateLimitDescriptor, n uint64) *rlpb.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func withOverride(d *rlpb.RateLimitDescriptor, rpu uint32, unit typepb.RateLimitUnit) *rlpb.RateLimitDescriptor {
	d.Limit = &rlpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

func (e *env) ask(t *testing.T, domain string, ds ...*rlpb.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	return e.askHits(t, domain, 0, ds...)
}

func (e *env) askHits(t *testing.T, domain string, hits uint32, ds ...*rlpb.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := e.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s): %v", domain, err)
	}
	return r
}

// awayFromWindowEdge waits until at least margin is left of the current
// window of length w (counted from the Unix epoch, as the stores count
// fixed windows), so that a sequence of requests lands in one window.
func awayFromWindowEdge(t *testing.T, w, margin time.Duration) {
	t.Helper()
	for {
		now := time.Now()
		left := w - time.Duration(now.UnixNano()%int64(w))
		if left > margin {
			return
		}
		time.Sleep(left + 10*time.Millisecond)
	}
}

type rlDesc = rlpb.RateLimitDescriptor
