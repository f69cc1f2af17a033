package rls

import (
	"context"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/internal/redistest"
)

// benchConfig is the benchmark's configuration (package bench's ips
// workload): one limit per client address, a fixed window far above what a
// run reaches.
const benchConfig = `domain: bench
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 1000000
`

// benchRequests are the encoded requests of n clients, as Envoy's
// remote_address action sends them.
func benchRequests(b *testing.B, n int) [][]byte {
	b.Helper()
	out := make([][]byte, n)
	for i := range out {
		ip := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		m, err := proto.Marshal(&pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlpb.RateLimitDescriptor{{
			Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip.String()}},
		}}})
		if err != nil {
			b.Fatal(err)
		}
		out[i] = m
	}
	return out
}

// BenchmarkShouldRateLimit measures one call: "server" is the server's
// share as front/grpcwire runs it (ShouldRateLimitWire: read, decide,
// write),
// "grpc" a whole call from a grpc-go client over loopback.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, kind := range []storeKind{memoryStore, redisStore} {
		b.Run(string(kind), func(b *testing.B) {
			e := start(b, kind, benchConfig)
			reqs := benchRequests(b, 10_000)
			b.Run("server", func(b *testing.B) {
				b.ReportAllocs()
				var out []byte
				i := 0
				defer redisCPU(b, e.redis)()
				for b.Loop() {
					var err error
					if out, err = e.svc.ShouldRateLimitWire(context.Background(), reqs[i%len(reqs)], out[:0]); err != nil {
						b.Fatalf("ShouldRateLimitWire: %v", err)
					}
					i++
				}
			})
			b.Run("grpc", func(b *testing.B) {
				b.ReportAllocs()
				msgs := make([]*pb.RateLimitRequest, len(reqs))
				for i, m := range reqs {
					msgs[i] = new(pb.RateLimitRequest)
					if err := proto.Unmarshal(m, msgs[i]); err != nil {
						b.Fatal(err)
					}
				}
				i := 0
				for b.Loop() {
					resp, err := e.client.ShouldRateLimit(context.Background(), msgs[i%len(msgs)])
					if err != nil || resp.GetOverallCode() != pb.RateLimitResponse_OK {
						b.Fatalf("ShouldRateLimit = %v, %v", resp, err)
					}
					i++
				}
			})
			b.Run("grpc-parallel", func(b *testing.B) {
				b.ReportAllocs()
				msgs := make([]*pb.RateLimitRequest, len(reqs))
				for i, m := range reqs {
					msgs[i] = new(pb.RateLimitRequest)
					if err := proto.Unmarshal(m, msgs[i]); err != nil {
						b.Fatal(err)
					}
				}
				defer processCPU(b)()
				var next atomic.Int64
				b.SetParallelism(25)
				b.RunParallel(func(p *testing.PB) {
					for p.Next() {
						resp, err := e.client.ShouldRateLimit(context.Background(), msgs[next.Add(1)%int64(len(msgs))])
						if err != nil || resp.GetOverallCode() != pb.RateLimitResponse_OK {
							b.Errorf("ShouldRateLimit = %v, %v", resp, err)
							return
						}
					}
				})
			})
		})
	}
}

// redisCPU reports, once b's loop is done, Redis's scripts per call and
// their CPU per call (microseconds, the commands they call included).
func redisCPU(b *testing.B, srv *redistest.Server) func() {
	b.Helper()
	if srv == nil {
		return func() {}
	}
	calls0, usec0 := srv.ScriptStats(b)
	return func() {
		calls, usec := srv.ScriptStats(b)
		b.ReportMetric(float64(usec-usec0)/float64(b.N), "redis-µs/op")
		b.ReportMetric(float64(calls-calls0)/float64(b.N), "scripts/op")
	}
}

// processCPU reports, once b's loop is done, the process's CPU time per
// call: the client's and the server's (and the memory store's) together.
func processCPU(b *testing.B) func() {
	var start syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &start); err != nil {
		b.Fatal(err)
	}
	return func() {
		var end syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &end); err != nil {
			b.Fatal(err)
		}
		used := time.Duration(end.Utime.Nano()+end.Stime.Nano()-start.Utime.Nano()-start.Stime.Nano()) * time.Nanosecond
		b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-µs/op")
	}
}
