package rls

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/internal/pbwire"
)

// requestShape is RateLimitRequest's shape, for differs.
var requestShape = pbwire.NewShape((&pb.RateLimitRequest{}).ProtoReflect().Descriptor())

// envoyRequests are requests as Envoy sends them: one or several
// descriptors, with overrides and hits_addend, the request's hits_addend.
func envoyRequests() []*pb.RateLimitRequest {
	return []*pb.RateLimitRequest{
		{Domain: "bench", Descriptors: []*rlDesc{desc("remote_address", "198.18.0.1")}},
		{Domain: "another", Descriptors: []*rlDesc{desc("key2", "a", "subkey", "é"), withHits(desc("key3", "b"), 7), desc()}, HitsAddend: 3},
		{Domain: "d", Descriptors: []*rlDesc{withOverride(desc("k", "v"), 42, typepb.RateLimitUnit_HOUR), withHits(withOverride(desc("k", ""), 0, typepb.RateLimitUnit_UNKNOWN), 0)}},
		{Domain: "d", Descriptors: []*rlDesc{{}}},
		{Domain: "", Descriptors: nil, HitsAddend: math.MaxUint32},
	}
}

// TestReadRequestVouches: readRequest reads Envoy's requests itself, and
// what it reads is what fromMessage reads of the decoded message.
func TestReadRequestVouches(t *testing.T) {
	for i, m := range envoyRequests() {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var r request
		if !readRequest(&r, b, requestShape) {
			t.Fatalf("request %d: readRequest does not vouch for %v", i, m)
		}
		if d := differs(b); d != "" {
			t.Errorf("request %d: %s", i, d)
		}
	}
}

// TestReadRequestBounds: only MaxDescriptors descriptors and MaxEntries
// entries of each are kept, and the counts say how many came.
func TestReadRequestBounds(t *testing.T) {
	m := &pb.RateLimitRequest{Domain: "d"}
	for range MaxDescriptors + 5 {
		m.Descriptors = append(m.Descriptors, desc("k", "v"))
	}
	long := m.Descriptors[0]
	for range MaxEntries + 2 {
		long.Entries = append(long.Entries, desc("a", "b").Entries[0])
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var r request
	if !readRequest(&r, b, requestShape) {
		t.Fatal("readRequest does not vouch")
	}
	if r.ndesc != MaxDescriptors+5 || len(r.descs) != MaxDescriptors || r.descs[0].nentries != MaxEntries+3 || r.descs[0].to-r.descs[0].from != MaxEntries {
		t.Errorf("ndesc %d, kept %d, entries %d, kept %d", r.ndesc, len(r.descs), r.descs[0].nentries, r.descs[0].to-r.descs[0].from)
	}
	if d := differs(b); d != "" {
		t.Error(d)
	}
}

// FuzzReadRequest holds readRequest to proto.Unmarshal's meaning: when it
// reads a request itself, proto.Unmarshal decodes it without an error and
// fromMessage reads the same of it.
func FuzzReadRequest(f *testing.F) {
	var enc [][]byte
	for _, m := range envoyRequests() {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		enc = append(enc, b)
		f.Add(b)
	}
	e0, e2 := enc[0], enc[2]
	f.Add(append(slices.Clone(e0), e2...)) // merged: the domain is the last, the descriptors added
	// A descriptor whose limit and hits_addend come twice: merged.
	d := protowire.AppendTag(nil, descriptorLimit, protowire.BytesType)
	d = protowire.AppendBytes(d, []byte{0x08, 0x05})
	d = protowire.AppendTag(d, descriptorLimit, protowire.BytesType)
	d = protowire.AppendBytes(d, []byte{0x10, 0x02})
	d = protowire.AppendTag(d, descriptorHits, protowire.BytesType)
	d = protowire.AppendBytes(d, []byte{0x08, 0x09})
	d = protowire.AppendTag(d, descriptorHits, protowire.BytesType)
	d = protowire.AppendBytes(d, nil)
	f.Add(protowire.AppendBytes(protowire.AppendTag(slices.Clone(e0), requestDescriptors, protowire.BytesType), d))
	f.Add(append(slices.Clone(e0), 0x18, 0xff, 0xff, 0xff, 0xff, 0x1f))                                                 // hits_addend above a uint32
	f.Add(append(slices.Clone(e0), 0x12, 0x04, 0x12, 0x02, 0x10, 0x80))                                                 // a unit that does not parse
	f.Add(append(slices.Clone(e0), 0x12, 0x0b, 0x12, 0x09, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)) // a negative unit
	f.Add(append(slices.Clone(e0), 0x12, 0x04, 0x0a, 0x02, 0x0a, 0xc3))                                                 // an entry whose key is cut
	f.Add(append(slices.Clone(e0), 0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01, 0xff))                                           // a key not UTF-8
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe, 0x12, 0x00})                                                                   // a domain not UTF-8
	f.Add([]byte{0x0d, 0x01, 0x02, 0x03, 0x04})                                                                         // the domain as a fixed32: unknown
	f.Add(append(slices.Clone(e0), 0x10, 0x01))                                                                         // descriptors as a varint: unknown
	f.Add(append(slices.Clone(e0), 0x98, 0x3e, 0x01))                                                                   // an unknown field
	f.Add([]byte{0x0b, 0x0c})                                                                                           // a group
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if d := differs(b); d != "" {
			t.Fatal(d)
		}
	})
}

// differs says how readRequest's reading of b differs from fromMessage's
// of proto.Unmarshal's decoding, "" when it does not or does not vouch.
func differs(b []byte) string {
	var fast request
	if !readRequest(&fast, b, requestShape) {
		return ""
	}
	if !pbwire.WellFormed(requestShape, b) {
		// A string not UTF-8, which proto.Unmarshal refuses and
		// readRequest reads by its bytes (pbwire.Readable): nothing
		// to compare with.
		return ""
	}
	var m pb.RateLimitRequest
	if err := proto.Unmarshal(b, &m); err != nil {
		return fmt.Sprintf("readRequest vouches for %x, which proto.Unmarshal refuses: %v", b, err)
	}
	var slow request
	fromMessage(&slow, &m)
	if fast.domain != slow.domain || fast.hits != slow.hits || fast.ndesc != slow.ndesc {
		return fmt.Sprintf("readRequest(%x): domain %q, hits %d, %d descriptors; proto.Unmarshal gives %q, %d, %d", b, fast.domain, fast.hits, fast.ndesc, slow.domain, slow.hits, slow.ndesc)
	}
	if !slices.Equal(fast.descs, slow.descs) {
		return fmt.Sprintf("readRequest(%x): descriptors %+v, proto.Unmarshal gives %+v", b, fast.descs, slow.descs)
	}
	if !slices.Equal(fast.entries, slow.entries) {
		return fmt.Sprintf("readRequest(%x): entries %q, proto.Unmarshal gives %q", b, fast.entries, slow.entries)
	}
	return ""
}

// TestWireFallback: a request readRequest does not vouch for is decoded
// whole and answered as ShouldRateLimit answers it; one that does not
// decode is INTERNAL, as grpc-go answers it.
func TestWireFallback(t *testing.T) {
	e := start(t, memoryStore, benchConfig)
	b, err := proto.Marshal(&pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlDesc{desc("remote_address", "198.51.100.9")}})
	if err != nil {
		t.Fatal(err)
	}
	grouped := protowire.AppendTag(protowire.AppendTag(slices.Clone(b), 99, protowire.StartGroupType), 99, protowire.EndGroupType)
	var r request
	if readRequest(&r, grouped, requestShape) {
		t.Fatal("readRequest vouches for a request with a group")
	}
	for i := range 2 {
		out, err := e.svc.ShouldRateLimitWire(context.Background(), grouped, nil)
		if err != nil {
			t.Fatalf("ShouldRateLimitWire: %v", err)
		}
		var resp pb.RateLimitResponse
		if err := proto.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		if got, want := resp.GetStatuses()[0].GetLimitRemaining(), uint32(1000000-1-i); resp.GetOverallCode() != pb.RateLimitResponse_OK || got != want {
			t.Errorf("call %d: %v, want OK with %d remaining", i, &resp, want)
		}
	}
	_, err = e.svc.ShouldRateLimitWire(context.Background(), append(slices.Clone(b), 0x0a, 0x05, 0x01), nil)
	if got := status.Code(err); got != codes.Internal {
		t.Errorf("a request that does not decode: %v, want INTERNAL", err)
	}
}

// TestAppendResponse: the response appendResponse writes is, byte for
// byte, what proto.Marshal makes of the message of the same answer, over
// many shapes: several descriptors, no limit, unlimited, shadow (OK with a
// limit and counts), every unit, empty names, durations of 0, and any
// number of headers, empty names and values too.
func TestAppendResponse(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	limits := []*envoyconf.Limit{nil, {Unlimited: true}}
	for u := range envoyconf.Unit(8) {
		for _, rpu := range []uint32{0, 1, 1000, math.MaxUint32} {
			for _, name := range []string{"", "per-ip", strings.Repeat("n", 200)} {
				limits = append(limits, &envoyconf.Limit{Name: name, RequestsPerUnit: rpu, Unit: u})
			}
		}
	}
	resets := []time.Duration{0, time.Second, 59 * time.Second, 1500 * time.Millisecond, 24 * time.Hour * 366, -time.Second, -time.Nanosecond}
	remaining := []uint32{0, 1, 127, 128, math.MaxUint32}
	names := []string{"RateLimit-Policy", "X-RateLimit-Limit", "", "Retry-After"}
	for n := range 3000 {
		var a answer
		for range 1 + rng.IntN(4) {
			st := descStatus{overLimit: rng.IntN(2) == 0, limit: limits[rng.IntN(len(limits))]}
			if st.limit != nil || rng.IntN(2) == 0 {
				st.remaining = remaining[rng.IntN(len(remaining))]
			}
			if rng.IntN(3) > 0 {
				st.hasReset, st.reset = true, resets[rng.IntN(len(resets))]
			}
			a.statuses = append(a.statuses, st)
			a.overLimit = a.overLimit || st.overLimit
		}
		for i := range rng.IntN(maxHeaders + 3) {
			a.headers = append(a.headers, decide.Header{Name: []byte(names[rng.IntN(len(names))]), Value: []byte(strings.Repeat("v", rng.IntN(3)*i*30))})
		}
		resp, _ := message(&a, nil)
		want, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendResponse([]byte("prefix"), &a); string(got) != "prefix"+string(want) {
			t.Fatalf("answer %d %+v: appendResponse = %x, proto.Marshal gives %x", n, a, got[len("prefix"):], want)
		}
	}
}

// TestMetadataOutlivesRequestBytes: the dynamic_metadata of an answer
// holds copies of the request's strings, which readRequest reads in
// place: the request's buffer, returned to a pool once the call is
// answered and overwritten by the next call's bytes, changes nothing in
// it.
func TestMetadataOutlivesRequestBytes(t *testing.T) {
	e := startOpts(t, memoryStore, guard.FailClosed, func(o *Options) { o.ResponseMetadata = true }, another)
	req, err := proto.Marshal(&pb.RateLimitRequest{Domain: "another", Descriptors: []*rlDesc{desc("key2", "kept")}})
	if err != nil {
		t.Fatal(err)
	}
	sc := e.svc.scratch.Get().(*scratch)
	defer e.svc.release(sc)
	if !readRequest(&sc.req, req, e.svc.shape) {
		t.Fatal("readRequest did not vouch for a well-formed request")
	}
	if _, err := e.svc.decide(context.Background(), sc); err != nil {
		t.Fatal(err)
	}
	before, err := protojson.Marshal(sc.ans.metadata)
	if err != nil || !strings.Contains(string(before), `"domain":"another"`) {
		t.Fatalf("dynamic_metadata %s, %v", before, err)
	}
	for i := range req {
		req[i] = 'X' // the next call's bytes
	}
	if after, _ := protojson.Marshal(sc.ans.metadata); string(after) != string(before) {
		t.Errorf("dynamic_metadata changed with the request's bytes:\n%s\nthen\n%s", before, after)
	}
}
