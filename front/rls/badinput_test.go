package rls

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/guard"
)

// rawCodec sends bytes as they are, as the proto codec's name, so that the
// server reads them as a protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// twice is a domain whose descriptor k has two limits.
const twice = `
domain: twice
descriptors:
  - {key: k, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: k, rate_limit: {unit: hour, requests_per_unit: 50}}
`

func TestBadInput(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, another, twice)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		many := func(n int) []*rlDesc {
			var ds []*rlDesc
			for i := 0; i < n; i++ {
				ds = append(ds, desc("key2", "bad"))
			}
			return ds
		}
		longEntries := desc()
		for i := 0; i < MaxEntries+1; i++ {
			longEntries.Entries = append(longEntries.Entries, desc("key2", "bad").Entries[0])
		}
		for _, tc := range []struct {
			name string
			req  *pb.RateLimitRequest
			code codes.Code
			msg  string
		}{
			{"empty domain", &pb.RateLimitRequest{Descriptors: many(1)}, codes.InvalidArgument, "rate limit domain must not be empty"},
			{"no descriptors", &pb.RateLimitRequest{Domain: "another"}, codes.InvalidArgument, "rate limit descriptor list must not be empty"},
			{"too many descriptors", &pb.RateLimitRequest{Domain: "another", Descriptors: many(MaxDescriptors + 1)}, codes.InvalidArgument, "65 descriptors; the most is 64"},
			{"too many entries", &pb.RateLimitRequest{Domain: "another", Descriptors: append(many(1), longEntries)}, codes.InvalidArgument, "descriptor 1 has 65 entries; the most is 64"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := e.client.ShouldRateLimit(context.Background(), tc.req)
				if s := status.Convert(err); s.Code() != tc.code || s.Message() != tc.msg {
					t.Fatalf("ShouldRateLimit: %v %q, want %v %q", s.Code(), s.Message(), tc.code, tc.msg)
				}
			})
		}
		for _, tc := range []struct {
			name string
			raw  []byte
			code codes.Code
			msg  string
		}{
			{"garbage", []byte{0xff, 0xff, 0xff, 0xff, 0xff}, codes.Internal, "unmarshal"},
			{"truncated", []byte{0x0a, 0x10, 'a', 'n'}, codes.Internal, "unmarshal"},
			// A field of another wire type is an unknown field: the
			// request has no domain.
			{"wrong wire type", []byte{0x0d, 0x01, 0x02, 0x03, 0x04}, codes.InvalidArgument, "rate limit domain must not be empty"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var out []byte
				err := e.conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &tc.raw, &out, grpc.ForceCodec(rawCodec{}))
				if s := status.Convert(err); s.Code() != tc.code || !strings.Contains(s.Message(), tc.msg) {
					t.Fatalf("malformed request: %v %q, want %v %q", s.Code(), s.Message(), tc.code, tc.msg)
				}
			})
		}
		// Nothing above was counted.
		check(t, "after the bad requests", e.ask(t, "another", desc("key2", "bad")), ok, st{ok, "20/minute", 19})

		// Values of any bytes and length are counted apart.
		long := strings.Repeat("\x00é\x7f", 100_000)
		check(t, "long value", e.ask(t, "another", desc("key2", long+"1")), ok, st{ok, "20/minute", 19})
		check(t, "long value, one byte apart", e.ask(t, "another", desc("key2", long+"2")), ok, st{ok, "20/minute", 19})
		check(t, "long value again", e.ask(t, "another", desc("key2", long+"1")), ok, st{ok, "20/minute", 18})
		check(t, "empty value", e.ask(t, "another", desc("key2", "")), ok, st{ok, "20/minute", 19})
		check(t, "long unknown domain", e.ask(t, strings.Repeat("d", 1<<20), desc("key2", "x")), ok, st{ok, "", 0})
		check(t, "descriptor without entries", e.ask(t, "another", desc()), ok, st{ok, "", 0})
	})
}

func TestStoreDown(t *testing.T) {
	for _, tc := range []struct {
		mode guard.FailMode
		code codes.Code
	}{
		{guard.FailClosed, codes.Unavailable},
		{guard.FailOpen, codes.OK},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			e := startWith(t, redisStore, tc.mode, another)
			check(t, "before", e.ask(t, "another", desc("key2", "down")), ok, st{ok, "20/minute", 19})
			e.redis.Stop(t)
			deadline := time.Now().Add(10 * time.Second)
			for {
				r, err := e.client.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "another", Descriptors: []*rlDesc{desc("key2", "down")}})
				if status.Code(err) == tc.code {
					if tc.code == codes.OK {
						check(t, "failed open", r, ok, st{ok, "", 0})
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("store down, fail mode %v: %v, %v; want %v", tc.mode, r, err, tc.code)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func TestJSON(t *testing.T) {
	e := start(t, memoryStore, `
domain: j
descriptors:
  - {key: k, rate_limit: {unit: minute, requests_per_unit: 1}}
`)
	awayFromWindowEdge(t, time.Minute, 15*time.Second)
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{Handler: e.svc.ServeJSON}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	c := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	post := func(method, body string) (int, string) {
		t.Helper()
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://authlimit/json")
		req.Header.SetMethod(method)
		req.SetBodyString(body)
		if err := c.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode(), string(resp.Body())
	}
	type answer struct {
		OverallCode string `json:"overallCode"`
		Statuses    []struct {
			Code         string `json:"code"`
			CurrentLimit struct {
				RequestsPerUnit int
				Unit            string
			}
			LimitRemaining int `json:"limitRemaining"`
		} `json:"statuses"`
	}
	body := `{"domain": "j", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`
	code, b := post("POST", body)
	var a answer
	if err := json.Unmarshal([]byte(b), &a); err != nil || code != 200 || a.OverallCode != "OK" || a.Statuses[0].CurrentLimit.RequestsPerUnit != 1 || a.Statuses[0].CurrentLimit.Unit != "MINUTE" {
		t.Fatalf("first: %d %s (%v)", code, b, err)
	}
	code, b = post("POST", body)
	if err := json.Unmarshal([]byte(b), &a); err != nil || code != 429 || a.OverallCode != "OVER_LIMIT" || a.Statuses[0].Code != "OVER_LIMIT" {
		t.Fatalf("second: %d %s (%v)", code, b, err)
	}
	for _, tc := range []struct {
		name, method, body string
		code               int
	}{
		{"not JSON", "POST", "{", 400},
		{"unknown field", "POST", `{"domain": "j", "descriptor": []}`, 400},
		{"empty domain", "POST", `{"descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`, 400},
		{"GET", "GET", "", 405},
	} {
		if code, b := post(tc.method, tc.body); code != tc.code {
			t.Errorf("%s: %d %q, want %d", tc.name, code, b, tc.code)
		}
	}
}

// TestCallerDeadlineDoesNotTripTheBreaker: a caller whose deadline has
// passed still gets the store's decision, and the store's circuit (opened
// here by a single failure) stays closed.
func TestCallerDeadlineDoesNotTripTheBreaker(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, another)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for i := 1; i <= 3; i++ {
			r, err := e.svc.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "another", Descriptors: []*rlDesc{desc("key2", "hurry")}})
			if err != nil {
				t.Fatalf("cancelled caller %d: %v", i, err)
			}
			check(t, "cancelled caller", r, ok, st{ok, "20/minute", uint32(20 - i)})
		}
		check(t, "after", e.ask(t, "another", desc("key2", "hurry")), ok, st{ok, "20/minute", 16})
	})
}

// TestClientInputIsAnAnswer: what the values of a request decide is never
// an error, which Envoy's rate-limit filter admits: two descriptors that
// reach one limit are each counted, as envoyproxy/ratelimit counts them; a
// request reaching more limits than one decision holds, and an override
// that cannot be served, are over the limit and count nothing.
func TestClientInputIsAnAnswer(t *testing.T) {
	t.Parallel()
	eachStoreAndCluster(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, another, twice+`
  - key: user
    value: "*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 4}
`)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		// One limit, two keys: two counts.
		check(t, "key2 a, key3 b, key2 c", e.ask(t, "another", desc("key2", "a"), desc("key3", "b"), desc("key2", "c")), ok,
			st{ok, "20/minute", 19}, st{ok, "10/hour", 9}, st{ok, "20/minute", 19})
		check(t, "key2 a after", e.ask(t, "another", desc("key2", "a")), ok, st{ok, "20/minute", 18})
		check(t, "key2 c after", e.ask(t, "another", desc("key2", "c")), ok, st{ok, "20/minute", 18})
		// One limit, one key: one count of both costs.
		check(t, "key2 a twice", e.ask(t, "another", desc("key2", "a"), desc("key2", "a")), ok,
			st{ok, "20/minute", 16}, st{ok, "20/minute", 16})
		// ... and of a share_threshold pattern's values, one key.
		check(t, "user u6 and x1", e.ask(t, "twice", desc("user", "u6"), desc("user", "x1")), ok,
			st{ok, "4/minute", 2}, st{ok, "4/minute", 2})
		check(t, "user u6 and x1 again", e.ask(t, "twice", desc("user", "u6"), desc("user", "x1")), ok,
			st{ok, "4/minute", 0}, st{ok, "4/minute", 0})
		check(t, "user u6 and x1 a third time", e.ask(t, "twice", desc("user", "u6"), desc("user", "x1")), over,
			st{over, "4/minute", 0}, st{over, "4/minute", 0})

		// 33 descriptors of two limits each: 66 limits, more than one
		// decision holds.
		var many []*rlDesc
		for i := 0; i < 33; i++ {
			many = append(many, desc("k", fmt.Sprintf("v%d", i)))
		}
		r := e.ask(t, "twice", many...)
		if r.GetOverallCode() != over {
			t.Fatalf("66 limits: %v, want OVER_LIMIT", r.GetOverallCode())
		}
		for i, s := range r.GetStatuses() {
			if got := statusOf(s); got != (st{over, "5/minute", 0}) {
				t.Fatalf("66 limits, status %d: %v, want OVER_LIMIT 5/minute", i, got)
			}
		}
		check(t, "v0 after", e.ask(t, "twice", desc("k", "v0")), ok, st{ok, "5/minute", 4})

		// An override that is not a unit.
		check(t, "override without a unit", e.ask(t, "another", desc("key2", "bad"), withOverride(desc("key2", "bad"), 5, typepb.RateLimitUnit_UNKNOWN)), over,
			st{ok, "", 0}, st{over, "5/unknown", 0})
		check(t, "key2 bad after", e.ask(t, "another", desc("key2", "bad")), ok, st{ok, "20/minute", 19})
	})
}

// TestTooManyOverrides: past envoyconf.MaxOverrides distinct overrides, a
// new one is over the limit, and the ones known still count.
func TestTooManyOverrides(t *testing.T) {
	e := start(t, memoryStore, another)
	awayFromWindowEdge(t, time.Minute, 15*time.Second)
	for i := 1; i <= envoyconf.MaxOverrides; i++ {
		e.ask(t, "another", withOverride(desc("key2", "o"), uint32(i+100), typepb.RateLimitUnit_MINUTE))
	}
	check(t, "one override more", e.ask(t, "another", withOverride(desc("key2", "o"), 7, typepb.RateLimitUnit_MINUTE)), over,
		st{over, "7/minute", 0})
	check(t, "a known override", e.ask(t, "another", withOverride(desc("key2", "o"), 101, typepb.RateLimitUnit_MINUTE)), ok,
		st{ok, "101/minute", 99})
}

// TestValuesNotUTF8: Envoy puts a client's header value in a descriptor as
// it came, bytes above 0x7f included, which proto.Unmarshal refuses in a
// string: such a request is decided and counted by its bytes, never an
// error (which Envoy's filter admits); its dynamic_metadata holds the value
// made UTF-8.
func TestValuesNotUTF8(t *testing.T) {
	e := startOpts(t, memoryStore, guard.FailClosed, func(o *Options) { o.ResponseMetadata = true }, another)
	awayFromWindowEdge(t, time.Minute, 15*time.Second)
	ask := func(value string) *pb.RateLimitResponse {
		t.Helper()
		var entry, d, req []byte
		entry = protowire.AppendTag(entry, entryKey, protowire.BytesType)
		entry = protowire.AppendString(entry, "key2")
		entry = protowire.AppendTag(entry, entryValue, protowire.BytesType)
		entry = protowire.AppendString(entry, value)
		d = protowire.AppendTag(d, descriptorEntries, protowire.BytesType)
		d = protowire.AppendBytes(d, entry)
		req = protowire.AppendTag(req, requestDomain, protowire.BytesType)
		req = protowire.AppendString(req, "another")
		req = protowire.AppendTag(req, requestDescriptors, protowire.BytesType)
		req = protowire.AppendBytes(req, d)
		var out []byte
		if err := e.conn.Invoke(context.Background(), ShouldRateLimitMethod, &req, &out, grpc.ForceCodec(rawCodec{})); err != nil {
			t.Fatalf("value %q: %v", value, err)
		}
		var r pb.RateLimitResponse
		if err := proto.Unmarshal(out, &r); err != nil {
			t.Fatalf("value %q: the answer does not decode: %v", value, err)
		}
		return &r
	}
	check(t, "\\xff\\xfe", ask("\xff\xfe"), ok, st{ok, "20/minute", 19})
	check(t, "\\xff\\xfe again", ask("\xff\xfe"), ok, st{ok, "20/minute", 18})
	check(t, "\\xff\\xfd, another value", ask("\xff\xfd"), ok, st{ok, "20/minute", 19})
	if got := ask("\xff\xfe").GetDynamicMetadata().GetFields()["descriptors"].GetListValue().GetValues()[0].GetStructValue().GetFields()["entries"].GetListValue().GetValues()[0].GetStringValue(); got != "key2=\uFFFD" {
		t.Errorf("dynamic_metadata entry %q, want the value made UTF-8 (a run of invalid bytes one U+FFFD)", got)
	}
}
