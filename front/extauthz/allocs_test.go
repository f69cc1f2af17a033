package extauthz

import (
	"context"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/internal/race"
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

// TestJoinedLookup: joined headers find a name as strings.EqualFold does,
// whether every key is lower-case ASCII (only keys of the name's length
// compared) or not, the key spelled as asked first.
func TestJoinedLookup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		joined map[string]string
		lookup string
		want   string // "" for none
	}{
		{"lower, exact", map[string]string{"x-key": "v"}, "x-key", "v"},
		{"lower, mixed-case name", map[string]string{"x-key": "v"}, "X-Key", "v"},
		{"lower, absent", map[string]string{"x-key": "v"}, "X-Other", ""},
		{"upper-case key", map[string]string{"X-Key": "v"}, "x-key", "v"},
		{"upper-case key, absent", map[string]string{"X-Key": "v"}, "x-other", ""},
		// U+212A, the Kelvin sign, folds to k: a key that is not ASCII is
		// looked for as EqualFold finds it.
		{"kelvin key", map[string]string{"x-\u212aey": "v"}, "X-Key", "v"},
		{"kelvin name", map[string]string{"x-key": "v"}, "x-\u212aey", "v"},
		{"two fold alike, exact wins", map[string]string{"X-Key": "a", "x-key": "b"}, "x-key", "b"},
		{"long name", map[string]string{"x-key": "v"}, strings.Repeat("X", 100), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var list []field
			for k, v := range tc.joined {
				list = append(list, field{key: k, value: v})
			}
			h := headers{list: list, joined: true, lower: lowerKeys(list)}
			v, n := h.lookup(tc.lookup)
			if tc.want == "" {
				if n != 0 {
					t.Errorf("lookup(%q) = %q, %d, want none", tc.lookup, v, n)
				}
			} else if string(v) != tc.want || n != 1 {
				t.Errorf("lookup(%q) = %q, %d, want %q, 1", tc.lookup, v, n, tc.want)
			}
			all := h.all(nil, tc.lookup)
			if len(tc.joined) > 1 {
				return // all finds each
			}
			if tc.want == "" && len(all) != 0 || tc.want != "" && (len(all) != 1 || string(all[0]) != tc.want) {
				t.Errorf("all(%q) = %q, want %q", tc.lookup, all, tc.want)
			}
		})
	}
}
