package extauthz

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/internal/redistest"
)

// benchRequests are the encoded Checks of n clients, as Envoy's ext_authz
// filter sends them for a GET of / (package bench's ips workload).
func benchRequests(b *testing.B, n int) [][]byte {
	b.Helper()
	out := make([][]byte, n)
	for i := range out {
		ip := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		m, err := proto.Marshal(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source:      &authv3.AttributeContext_Peer{Address: benchAddress(ip.String(), 40000)},
			Destination: &authv3.AttributeContext_Peer{Address: benchAddress("127.0.0.1", 8000)},
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Id: "1", Method: "GET", Path: "/", Host: "127.0.0.1", Scheme: "http", Protocol: "HTTP/1.1",
				Headers: map[string]string{":authority": "127.0.0.1", ":method": "GET", ":path": "/", ":scheme": "http", "user-agent": "authlimit-bench"},
			}},
		}})
		if err != nil {
			b.Fatal(err)
		}
		out[i] = m
	}
	return out
}

// BenchmarkCheck measures one call, as front/rls's BenchmarkShouldRateLimit
// does for the rate-limit service: "server" is the server's share as
// front/grpcwire runs it (checkWire: read, decide, encode), "grpc" a whole call from
// a grpc-go client over loopback.
func BenchmarkCheck(b *testing.B) {
	for _, name := range []string{"memory", "redis"} {
		b.Run(name, func(b *testing.B) {
			be := backend{name: name}
			if name == "redis" {
				be.redis = redistest.New(b)
			}
			st := newStack(b, be, "name=bench key=ip limit=1000000/1m", nil)
			reqs := benchRequests(b, 10_000)
			b.Run("server", func(b *testing.B) {
				b.ReportAllocs()
				var out []byte
				i := 0
				defer be.redis.ReportScripts(b)()
				for b.Loop() {
					var err error
					if out, err = st.server.checkWire(context.Background(), reqs[i%len(reqs)], out[:0]); err != nil {
						b.Fatal(err)
					}
					i++
				}
				var resp authv3.CheckResponse
				if err := proto.Unmarshal(out, &resp); err != nil || resp.GetStatus().GetCode() != int32(codes.OK) {
					b.Fatalf("Check = %v, %v", &resp, err)
				}
			})
			b.Run("grpc", func(b *testing.B) {
				b.ReportAllocs()
				msgs := make([]*authv3.CheckRequest, len(reqs))
				for i, m := range reqs {
					msgs[i] = new(authv3.CheckRequest)
					if err := proto.Unmarshal(m, msgs[i]); err != nil {
						b.Fatal(err)
					}
				}
				i := 0
				for b.Loop() {
					resp, err := st.client.Check(context.Background(), msgs[i%len(msgs)])
					if err != nil || resp.GetStatus().GetCode() != int32(codes.OK) {
						b.Fatalf("Check = %v, %v", resp, err)
					}
					i++
				}
			})
			b.Run("grpc-parallel", func(b *testing.B) {
				b.ReportAllocs()
				msgs := make([]*authv3.CheckRequest, len(reqs))
				for i, m := range reqs {
					msgs[i] = new(authv3.CheckRequest)
					if err := proto.Unmarshal(m, msgs[i]); err != nil {
						b.Fatal(err)
					}
				}
				defer redistest.ReportProcessCPU(b)()
				var next atomic.Int64
				b.SetParallelism(25)
				b.RunParallel(func(p *testing.PB) {
					for p.Next() {
						resp, err := st.client.Check(context.Background(), msgs[next.Add(1)%int64(len(msgs))])
						if err != nil || resp.GetStatus().GetCode() != int32(codes.OK) {
							b.Errorf("Check = %v, %v", resp, err)
							return
						}
					}
				})
			})
		})
	}
}

func benchAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}
