package extauthz

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/internal/pbwire"
)

// envoyRequest is a Check as Envoy sends it, with the attributes Check
// does not read too: destination, time, context extensions, metadata.
func envoyRequest(raw bool) *authv3.CheckRequest {
	m := checkRequest(step{headers: []string{"x-key", "k1", "user-agent", "curl/8"}, proxied: true, length: []string{"12"}, size: 12}, raw)
	a := m.Attributes
	a.Destination = &authv3.AttributeContext_Peer{Address: benchAddress("127.0.0.1", 8000), Principal: "spiffe://x"}
	a.Request.Time = timestamppb.New(timestamppb.Now().AsTime())
	a.Request.Http.Id, a.Request.Http.Scheme, a.Request.Http.Protocol = "1234", "https", "HTTP/2"
	a.ContextExtensions = map[string]string{"virtual_host": "local"}
	st, _ := structpb.NewStruct(map[string]any{"a": "b", "n": 1.5, "l": []any{"x", true}})
	a.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters": st}}
	return m
}

// TestReadRequestVouches: readRequest reads Envoy's requests itself, with
// joined or raw headers, and what it reads is what fromMessage reads of
// the decoded message.
func TestReadRequestVouches(t *testing.T) {
	for _, raw := range []bool{false, true} {
		b, err := proto.Marshal(envoyRequest(raw))
		if err != nil {
			t.Fatal(err)
		}
		var r request
		if !readRequest(&r, b, pbwire.NewShape(checkRequestDesc)) {
			t.Fatalf("raw %v: readRequest does not vouch for Envoy's request", raw)
		}
		if d := differs(b); d != "" {
			t.Errorf("raw %v: %s", raw, d)
		}
	}
}

// FuzzReadRequest holds readRequest to proto.Unmarshal's meaning: when it
// reads a request itself, proto.Unmarshal decodes it without an error and
// fromMessage reads the same of it.
func FuzzReadRequest(f *testing.F) {
	add := func(m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, raw := range []bool{false, true} {
		add(envoyRequest(raw))
		add(checkRequest(step{spoof: "1.2.3.4"}, raw))
	}
	e0, _ := proto.Marshal(envoyRequest(false))
	e1, _ := proto.Marshal(envoyRequest(true))
	f.Add(append(slices.Clone(e0), e1...)) // merged: the raw headers win
	f.Add(append(slices.Clone(e1), e0...))
	pipe := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:  &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/s"}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET"}},
	}}
	add(pipe)
	p, _ := proto.Marshal(pipe)
	f.Add(append(slices.Clone(e0), p...)) // the pipe replaces the socket address
	f.Add(append(p, e0...))
	add(&authv3.CheckRequest{})
	add(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{}}})
	f.Add(append(slices.Clone(e0), 0x0a, 0x02, 0xff, 0xfe))                                                             // attributes that do not parse
	f.Add(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\x22\x06\x12\x04\x12\x02\xc3\x28")) // a method not UTF-8
	f.Add(append(slices.Clone(e0), 0x08, 0x01))                                                                         // attributes as a varint: unknown
	f.Add(append(slices.Clone(e0), 0x98, 0x3e, 0x01))                                                                   // an unknown field
	f.Add([]byte{0x91, 0x91, 0x8e, 0xa6, 0x30, 0, 0, 0, 0, 0, 0, 0, 0})                                                 // a field number above the largest
	f.Add(append(slices.Clone(e0), 0xf8, 0xa8, 0x09, 0x01))                                                             // 19007: reserved, but unknown
	f.Add([]byte{0x0b, 0x0c})                                                                                           // a group
	f.Fuzz(func(t *testing.T, b []byte) {
		if d := differs(b); d != "" {
			t.Fatal(d)
		}
	})
}

var checkRequestDesc = (&authv3.CheckRequest{}).ProtoReflect().Descriptor()

// checkShape is CheckRequest's shape, for differs.
var checkShape = pbwire.NewShape(checkRequestDesc)

// differs says how readRequest's reading of b differs from fromMessage's
// of proto.Unmarshal's decoding, "" when it does not or does not vouch.
func differs(b []byte) string {
	var fast request
	if !readRequest(&fast, b, checkShape) {
		return ""
	}
	if !pbwire.WellFormed(checkShape, b) {
		// A string not UTF-8, which proto.Unmarshal refuses and
		// readRequest reads by its bytes (pbwire.Readable): nothing
		// to compare with.
		return ""
	}
	var m authv3.CheckRequest
	if err := proto.Unmarshal(b, &m); err != nil {
		return fmt.Sprintf("readRequest vouches for %x, which proto.Unmarshal refuses: %v", b, err)
	}
	var slow request
	fromMessage(&slow, &m)
	type scalars struct {
		http, socket               bool
		source, method, path, host string
		size                       int64
	}
	got := scalars{fast.http, fast.socket, fast.source, fast.method, fast.path, fast.host, fast.size}
	want := scalars{slow.http, slow.socket, slow.source, slow.method, slow.path, slow.host, slow.size}
	if got != want {
		return fmt.Sprintf("readRequest(%x) = %+v, proto.Unmarshal gives %+v", b, got, want)
	}
	if fast.hdrs.joined != slow.hdrs.joined {
		return fmt.Sprintf("readRequest(%x): joined %v, proto.Unmarshal gives %v", b, fast.hdrs.joined, slow.hdrs.joined)
	}
	fl, sl := fast.hdrs.list, slow.hdrs.list
	if fast.hdrs.joined {
		// A map's order is not kept.
		key := func(a, b field) int {
			if a.key < b.key {
				return -1
			}
			if a.key > b.key {
				return 1
			}
			return 0
		}
		fl, sl = slices.Clone(fl), slices.Clone(sl)
		slices.SortFunc(fl, key)
		slices.SortFunc(sl, key)
	}
	if len(fl) != len(sl) {
		return fmt.Sprintf("readRequest(%x): headers %q, proto.Unmarshal gives %q", b, fl, sl)
	}
	for i := range fl {
		if fl[i].key != sl[i].key || fl[i].value != sl[i].value || !bytes.Equal(fl[i].raw, sl[i].raw) {
			return fmt.Sprintf("readRequest(%x): header %d %q, proto.Unmarshal gives %q", b, i, fl[i], sl[i])
		}
	}
	return ""
}

// TestCheckWireFallback: a request readRequest does not vouch for is
// decoded whole and answered as Check answers it; one that does not
// decode is INTERNAL, as grpc-go answers it.
func TestCheckWireFallback(t *testing.T) {
	st := newStack(t, backend{name: "memory"}, "name=a key=ip limit=1/1m", nil)
	b, err := proto.Marshal(checkRequest(step{client: "198.51.100.9"}, false))
	if err != nil {
		t.Fatal(err)
	}
	// An unknown group: proto.Unmarshal keeps it, readRequest does not
	// follow it.
	grouped := protowire.AppendTag(protowire.AppendTag(slices.Clone(b), 99, protowire.StartGroupType), 99, protowire.EndGroupType)
	var r request
	if readRequest(&r, grouped, st.server.shape) {
		t.Fatal("readRequest vouches for a request with a group")
	}
	for i, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
		out, err := st.server.checkWire(context.Background(), grouped, nil)
		if err != nil {
			t.Fatalf("checkWire: %v", err)
		}
		var resp authv3.CheckResponse
		if err := proto.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		if got := codes.Code(resp.GetStatus().GetCode()); got != want {
			t.Errorf("call %d: status %v, want %v (the limit is 1 for 198.51.100.9)", i, got, want)
		}
	}
	_, err = st.server.checkWire(context.Background(), append(slices.Clone(b), 0x0a, 0x05, 0x01), nil)
	if got := status.Code(err); got != codes.Internal {
		t.Errorf("a request that does not decode: %v, want INTERNAL", err)
	}
}

// TestAppendOK: the OK response appendOK writes is, byte for byte, what
// proto.Marshal makes of the response Check answers, for any number of
// headers, empty values and names too.
func TestAppendOK(t *testing.T) {
	names := []string{"RateLimit-Policy", "X-RateLimit-Limit", "", "Retry-After"}
	for n := range maxHeaders + 3 {
		var hs []decide.Header
		for i := range n {
			hs = append(hs, decide.Header{Name: []byte(names[i%len(names)]), Value: []byte(strings.Repeat("v", i*40))})
		}
		out := &decide.Outcome{Verdict: decide.Allow, Status: 200, Headers: hs}
		resp, _ := response(out, nil)
		want, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendOK([]byte("prefix"), hs); string(got) != "prefix"+string(want) {
			t.Errorf("%d headers: appendOK = %x, proto.Marshal gives %x", n, got[len("prefix"):], want)
		}
	}
}

// TestAppendDenied: the denied response appendDenied writes is, byte for
// byte, what proto.Marshal makes of the response Check answers, for every
// verdict that is not admitted, any number of headers, with or without a
// kind and a body.
func TestAppendDenied(t *testing.T) {
	names := []string{"RateLimit-Policy", "Retry-After", "", "X-RateLimit-Limit"}
	for _, v := range []decide.Verdict{decide.Deny, decide.Invalid, decide.Blocked, decide.Unavailable, decide.Failed} {
		for _, st := range []int{429, 503, 500, 400, 0} {
			for _, kind := range []string{"rate-limited", ""} {
				for _, body := range []string{`{"type":"urn:authlimit:rate-limited","title":"Too Many Requests","status":429}`, "", strings.Repeat("b", 300)} {
					for n := range maxHeaders + 3 {
						var hs []decide.Header
						for i := range n {
							hs = append(hs, decide.Header{Name: []byte(names[i%len(names)]), Value: []byte(strings.Repeat("v", i*30))})
						}
						out := &decide.Outcome{Verdict: v, Status: st, Kind: kind, Headers: hs, Body: []byte(body)}
						resp, _ := response(out, nil)
						want, err := proto.Marshal(resp)
						if err != nil {
							t.Fatal(err)
						}
						if got := appendDenied([]byte("prefix"), out); string(got) != "prefix"+string(want) {
							t.Fatalf("%v %d %q, %d headers, body %d: appendDenied = %x, proto.Marshal gives %x", v, st, kind, n, len(body), got[len("prefix"):], want)
						}
					}
				}
			}
		}
	}
}
