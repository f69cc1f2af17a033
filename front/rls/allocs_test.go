package rls

import (
	"context"
	"strconv"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/internal/race"
)

// TestShouldRateLimitAllocates bounds the allocations of a call with one
// descriptor on the memory store (the gRPC server's decoding and encoding
// apart): the response, its messages allocated as one; the headers'
// values, as one string; the decision's context. Translation, the
// engine's decision and the store allocate nothing once a key exists.
func TestShouldRateLimitAllocates(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	e := start(t, memoryStore, benchConfig)
	for _, tc := range []struct {
		name string
		req  *pb.RateLimitRequest
		max  float64
	}{
		{"allowed", &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlDesc{desc("remote_address", "198.18.0.1")}}, 3},
		{"no limit", &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlDesc{desc("other", "x")}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			got := testing.AllocsPerRun(100, func() {
				var resp *pb.RateLimitResponse
				resp, err = e.svc.ShouldRateLimit(context.Background(), tc.req)
				if err == nil && resp.GetOverallCode() != pb.RateLimitResponse_OK {
					t.Errorf("ShouldRateLimit = %v, want OK", resp)
				}
			})
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			if got > tc.max {
				t.Errorf("ShouldRateLimit allocates %v times per call, want at most %v", got, tc.max)
			}
		})
	}
}

// TestReplyHeaders: every header the engine gives is answered, in order,
// names and values as given, more than a reply holds too.
func TestReplyHeaders(t *testing.T) {
	for _, n := range []int{0, 1, maxHeaders, maxHeaders + 2} {
		var hs []decide.Header
		for i := range n {
			name := []string{"RateLimit-Policy", "X-Other", "Retry-After"}[i%3]
			hs = append(hs, decide.Header{Name: []byte(name), Value: []byte(strings.Repeat("v", i) + strconv.Itoa(i))})
		}
		rp := newReply(1)
		buf := rp.setHeaders(hs, []byte("stale"))
		got := rp.resp.GetResponseHeadersToAdd()
		if len(got) != n {
			t.Fatalf("%d headers: answered %d", n, len(got))
		}
		for i, h := range hs {
			if got[i].GetKey() != string(h.Name) || got[i].GetValue() != string(h.Value) {
				t.Errorf("%d headers: header %d = %s: %s, want %s: %s", n, i, got[i].GetKey(), got[i].GetValue(), h.Name, h.Value)
			}
		}
		if n > 0 && !strings.HasPrefix(string(buf), "stale") {
			t.Errorf("%d headers: the buffer lost what it held: %q", n, buf)
		}
	}
}
