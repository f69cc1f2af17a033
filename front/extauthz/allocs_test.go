package extauthz

import (
	"context"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/internal/redistest"
)

// TestCheckAllocates bounds the allocations of an admitted Check on the
// memory store (the gRPC server's decoding and encoding apart): the
// response with its messages and header options, allocated as one; the
// headers' values, as one string. Reading the
// request, the engine's decision and the store allocate nothing once a
// key exists, whether Envoy sends joined or raw headers, through trusted
// proxies or not, with a path longer than a conversion's stack buffer.
// As front/grpcwire serves it (checkWire: the request read from its bytes,
// the response written to the wire), a call allocates nothing: the
// decision's context is the call's, detached without an allocation
// (grpcwire.WithoutCancel).
func TestCheckAllocates(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	st := newStack(t, backend{name: "memory"}, "name=a key=ip limit=1000000/1m; name=k key=header:X-Key limit=1000000/1m", nil)
	long := "/" + strings.Repeat("segment/", 8)
	for _, tc := range []struct {
		name string
		s    step
		raw  bool
	}{
		{"joined", step{headers: []string{"x-key", "k1"}}, false},
		{"raw", step{headers: []string{"x-key", "k1"}}, true},
		{"proxied", step{headers: []string{"x-key", "k1"}, proxied: true}, false},
		{"long path", step{path: long, host: "a-host-name-longer-than-32-bytes.example.com", headers: []string{"x-key", "k1"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := checkRequest(tc.s, tc.raw)
			var err error
			got := testing.AllocsPerRun(100, func() {
				resp, cerr := st.server.Check(context.Background(), req)
				if cerr != nil {
					err = cerr
					return
				}
				if c := codes.Code(resp.GetStatus().GetCode()); c != codes.OK {
					t.Errorf("Check = %v, want OK", resp)
				}
			})
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if max := 2.0; got > max {
				t.Errorf("Check allocates %v times per call, want at most %v", got, max)
			}
			// The server's share as front/grpcwire runs it: read, decide,
			// encode.
			b, err := proto.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			var out []byte
			got = testing.AllocsPerRun(100, func() {
				out, err = st.server.checkWire(context.Background(), b, out[:0])
			})
			if err != nil {
				t.Fatalf("checkWire: %v", err)
			}
			if max := 0.0; got > max {
				t.Errorf("checkWire allocates %v times per call, want at most %v", got, max)
			}
		})
	}
}

// TestCheckDeniedAllocates: a denied Check, as front/grpcwire serves it
// (the response written to the wire, as an admitted one's), allocates
// nothing once its key is over the limit.
func TestCheckDeniedAllocates(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	st := newStack(t, backend{name: "memory"}, "name=a key=ip limit=1/1h", nil)
	b, err := proto.Marshal(checkRequest(step{client: "198.51.100.77"}, false))
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for range 2 {
		if out, err = st.server.checkWire(context.Background(), b, out[:0]); err != nil {
			t.Fatalf("checkWire: %v", err)
		}
	}
	got := testing.AllocsPerRun(100, func() {
		out, err = st.server.checkWire(context.Background(), b, out[:0])
	})
	if err != nil {
		t.Fatalf("checkWire: %v", err)
	}
	var resp authv3.CheckResponse
	if err := proto.Unmarshal(out, &resp); err != nil {
		t.Fatal(err)
	}
	if c := codes.Code(resp.GetStatus().GetCode()); c != codes.ResourceExhausted || resp.GetDeniedResponse().GetStatus().GetCode() != 429 {
		t.Fatalf("checkWire = %v, want a 429 denial", &resp)
	}
	if got > 0 {
		t.Errorf("a denied checkWire allocates %v times per call, want none", got)
	}
}

// TestJoinedLookup: joined headers find a name as /auth does
// (rules.SameHeader: ASCII case, '-' and '_' alike), each key that gives
// the header counted, a value with a comma counted as two lines; all, for
// X-Forwarded-For, keeps '-' and '_' apart, as /auth's server does.
func TestJoinedLookup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		joined map[string]string
		lookup string
		want   string // the value when found once
		n      int    // how many times
		all    int    // how many values all finds
	}{
		{"lower, exact", map[string]string{"x-key": "v"}, "x-key", "v", 1, 1},
		{"lower, mixed-case name", map[string]string{"x-key": "v"}, "X-Key", "v", 1, 1},
		{"lower, absent", map[string]string{"x-key": "v"}, "X-Other", "", 0, 0},
		{"upper-case key", map[string]string{"X-Key": "v"}, "x-key", "v", 1, 1},
		{"underscore key", map[string]string{"x_key": "v"}, "X-Key", "v", 1, 0},
		{"underscore name", map[string]string{"x-key": "v"}, "X_Key", "v", 1, 0},
		{"two spellings", map[string]string{"x_key": "a", "x-key": "b"}, "x-key", "", 2, 1},
		{"two cases", map[string]string{"X-Key": "a", "x-key": "b"}, "x-key", "", 2, 2},
		{"a comma", map[string]string{"x-key": "a,b"}, "x-key", "", 2, 1},
		// U+212A, the Kelvin sign, folds to k in Unicode, never in an
		// HTTP header name.
		{"kelvin key", map[string]string{"x-\u212aey": "v"}, "X-Key", "", 0, 0},
		{"long name", map[string]string{"x-key": "v"}, strings.Repeat("X", 100), "", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var list []field
			for k, v := range tc.joined {
				list = append(list, field{key: k, value: v})
			}
			h := headers{list: list, joined: true}
			v, n := h.lookup(tc.lookup)
			if string(v) != tc.want || n != tc.n {
				t.Errorf("lookup(%q) = %q, %d, want %q, %d", tc.lookup, v, n, tc.want, tc.n)
			}
			if all := h.all(nil, tc.lookup); len(all) != tc.all {
				t.Errorf("all(%q) = %q, want %d values", tc.lookup, all, tc.all)
			}
		})
	}
}

// thenChan is a decide.Then that signals.
type thenChan chan *decide.Outcome

func (c thenChan) Decided(o *decide.Outcome) { c <- o }

// TestCheckAsyncAllocates: a Check decided asynchronously over Redis, as
// Register serves it (read on the connection's reader, decided by whoever
// sends its batch), allocates nothing of its own: only what go-redis
// allocates per call (algo's goRedisAllocs).
func TestCheckAsyncAllocates(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	st := newStack(t, backend{name: "redis", redis: redistest.New(t)}, "name=a key=ip limit=1000000/1m", nil)
	b, err := proto.Marshal(checkRequest(step{client: "198.51.100.30"}, false))
	if err != nil {
		t.Fatal(err)
	}
	s := st.server
	then := make(thenChan, 1)
	var out []byte
	check := func() {
		sc := s.scratch.Get().(*scratch)
		if !readRequest(&sc.req, b, s.shape) {
			t.Fatal("readRequest refused the request")
		}
		s.read(sc)
		if !s.engine.DecideAsync(&sc.in, &sc.out, then) {
			t.Fatal("DecideAsync reported false")
		}
		o := <-then
		if !o.Verdict.Admitted() {
			t.Fatalf("verdict %v, want admitted", o.Verdict)
		}
		out = appendOK(out[:0], o.Headers)
		s.release(sc)
	}
	for range 10 {
		check()
	}
	const goRedisAllocs = 5
	got := testing.AllocsPerRun(200, check)
	if got > goRedisAllocs {
		t.Errorf("an asynchronous Check allocates %v times per call, want at most go-redis's %d", got, goRedisAllocs)
	}
}
