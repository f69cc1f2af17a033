package rls

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"

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
				defer e.redis.ReportScripts(b)()
				for b.Loop() {
					var err error
					if out, err = e.svc.ShouldRateLimitWire(context.Background(), reqs[i%len(reqs)], out[:0]); err != nil {
						b.Fatalf("ShouldRateLimitWire: %v", err)
					}
					i++
				}
			})
			msgs := make([]*pb.RateLimitRequest, len(reqs))
			for i, m := range reqs {
				msgs[i] = new(pb.RateLimitRequest)
				if err := proto.Unmarshal(m, msgs[i]); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("grpc", func(b *testing.B) {
				b.ReportAllocs()
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
				defer redistest.ReportProcessCPU(b)()
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
