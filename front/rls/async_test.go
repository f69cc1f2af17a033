package rls

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestConcurrentExact: calls for one descriptor from many connections at
// once, decided as they come and answered by whoever completes their
// decisions, admit exactly the limit, on every store.
func TestConcurrentExact(t *testing.T) {
	t.Parallel()
	eachStoreAndCluster(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, `domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 60}
`)
		const conns, perConn, each = 8, 4, 8
		var ok, over, failed atomic.Int64
		var wg sync.WaitGroup
		for range conns {
			conn, err := grpc.NewClient(e.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			c := pb.NewRateLimitServiceClient(conn)
			for range perConn {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						resp, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlDesc{desc("user", "u1")}})
						switch {
						case err != nil:
							failed.Add(1)
						case resp.GetOverallCode() == pb.RateLimitResponse_OK:
							ok.Add(1)
						default:
							over.Add(1)
						}
					}
				}()
			}
		}
		wg.Wait()
		if ok.Load() != 60 || failed.Load() != 0 {
			t.Errorf("%d OK, %d over limit, %d failed of %d; want exactly 60 OK and none failed", ok.Load(), over.Load(), failed.Load(), conns*perConn*each)
		}
	})
}
