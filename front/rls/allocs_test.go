package rls

import (
	"context"
	"strconv"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/internal/race"
)

// TestShouldRateLimitAllocates bounds the allocations of a call on the
// memory store. As front/grpcwire serves it (ShouldRateLimitWire: the
// request read from its bytes, the response written to the wire), a call
// allocates nothing, with one descriptor or several: translation, the
// engine's decision and the store allocate nothing once a key exists, and
// the decision's context is the call's, detached without an allocation
// (grpcwire.WithoutCancel). ShouldRateLimit, given a decoded request,
// allocates its response: one descriptor's messages as one, the headers'
// values as one string.
func TestShouldRateLimitAllocates(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	e := start(t, memoryStore, benchConfig+`  - key: other
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`)
	for _, tc := range []struct {
		name     string
		req      *pb.RateLimitRequest
		max      float64 // ShouldRateLimit's
		statuses int     // with a current limit
	}{
		{"allowed", &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlDesc{desc("remote_address", "198.18.0.1")}}, 2, 1},
		{"two descriptors", &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlDesc{desc("remote_address", "198.18.0.1"), desc("other", "x")}}, 8, 2},
		{"no limit", &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlDesc{desc("unknown", "x")}}, 1, 0},
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
			b, err := proto.Marshal(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			var out []byte
			got = testing.AllocsPerRun(100, func() {
				out, err = e.svc.ShouldRateLimitWire(context.Background(), b, out[:0])
			})
			if err != nil {
				t.Fatalf("ShouldRateLimitWire: %v", err)
			}
			var resp pb.RateLimitResponse
			if err := proto.Unmarshal(out, &resp); err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, st := range resp.GetStatuses() {
				if st.GetCurrentLimit() != nil {
					n++
				}
			}
			if resp.GetOverallCode() != pb.RateLimitResponse_OK || len(resp.GetStatuses()) != len(tc.req.GetDescriptors()) || n != tc.statuses {
				t.Errorf("ShouldRateLimitWire = %v, want OK with %d current limits", &resp, tc.statuses)
			}
			if got > 0 {
				t.Errorf("ShouldRateLimitWire allocates %v times per call, want none", got)
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

// thenChan is a decide.Then that signals.
type thenChan chan *decide.Outcome

func (c thenChan) Decided(o *decide.Outcome) { c <- o }

// TestShouldRateLimitAsyncAllocates: a call decided asynchronously over
// Redis, as Register serves it (read on the connection's reader, decided
// by whoever sends its batch), allocates nothing of its own: only what
// go-redis allocates per call (algo's goRedisAllocs).
func TestShouldRateLimitAsyncAllocates(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	e := start(t, redisStore, benchConfig)
	b, err := proto.Marshal(&pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlDesc{desc("remote_address", "198.18.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	s := e.svc
	then := make(thenChan, 1)
	var out []byte
	call := func() {
		sc := s.scratch.Get().(*scratch)
		if !readRequest(&sc.req, b, s.shape) {
			t.Fatal("readRequest refused the request")
		}
		now := s.clock()
		if ask, _, err := s.begin(sc, now); !ask || err != nil {
			t.Fatalf("begin = %v, %v", ask, err)
		}
		if !s.engine.DecideLimitsAsync(sc.reqs, &sc.out, then) {
			t.Fatal("DecideLimitsAsync reported false")
		}
		o := <-then
		if _, err := s.conclude(sc, o, now); err != nil || sc.ans.overLimit {
			t.Fatalf("conclude = %v, over limit %v", err, sc.ans.overLimit)
		}
		out = appendResponse(out[:0], &sc.ans)
		s.release(sc)
	}
	for range 10 {
		call()
	}
	const goRedisAllocs = 5
	if got := testing.AllocsPerRun(200, call); got > goRedisAllocs {
		t.Errorf("an asynchronous call allocates %v times, want at most go-redis's %d", got, goRedisAllocs)
	}
}
