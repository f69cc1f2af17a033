package rls

import (
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/authlimit/authlimit/guard"
)

// quotaConfig is envoyproxy/ratelimit's example of quota_mode and
// metadata (examples/ratelimit/config/example.yaml), with a regular limit
// beside.
const quotaConfig = `
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      service_with_quota:
        name: "service_2"
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 3}
    metadata:
      regular: true
`

// TestQuotaMode: a request is over the limit for its quota descriptors
// only when every one of them is, as in envoyproxy/ratelimit's quota
// integration test (service_1 1/min, service_2 2/min: the third request
// is over); each quota descriptor's status says its own; a regular
// descriptor over its limit denies whatever the quota descriptors say.
func TestQuotaMode(t *testing.T) {
	t.Parallel()
	eachStoreAndCluster(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, quotaConfig)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		both := func() []*rlDesc { return []*rlDesc{desc("service", "service_1"), desc("service", "service_2")} }
		check(t, "request 1", e.ask(t, "rl", both()...), ok, st{ok, "1/minute", 0}, st{ok, "2/minute", 1})
		check(t, "request 2: service_1 over, service_2 not", e.ask(t, "rl", both()...), ok, st{over, "1/minute", 0}, st{ok, "2/minute", 0})
		check(t, "request 3: both over", e.ask(t, "rl", both()...), over, st{over, "1/minute", 0}, st{over, "2/minute", 0})
		// service_2 alone is over: every quota descriptor of the request.
		check(t, "service_2 alone", e.ask(t, "rl", desc("service", "service_2")), over, st{over, "2/minute", 0})

		// Beside a regular descriptor: the quota descriptors, all over,
		// make the request over; the regular limit, which admitted it,
		// has counted it, as envoyproxy/ratelimit counts every request.
		check(t, "regular beside quotas all over", e.ask(t, "rl", desc("regular", "r"), desc("service", "service_1"), desc("service", "service_2")), over,
			st{ok, "3/minute", 2}, st{over, "1/minute", 0}, st{over, "2/minute", 0})
		check(t, "regular alone after", e.ask(t, "rl", desc("regular", "r")), ok, st{ok, "3/minute", 1})
	})
}

// TestQuotaModeRegularDenies: a regular descriptor over its limit denies,
// whatever the quota descriptors say, and then nothing is counted.
func TestQuotaModeRegularDenies(t *testing.T) {
	e := start(t, memoryStore, quotaConfig)
	awayFromWindowEdge(t, time.Minute, 15*time.Second)
	for i := 0; i < 3; i++ {
		e.ask(t, "rl", desc("regular", "x"))
	}
	check(t, "regular over, quota with room", e.ask(t, "rl", desc("regular", "x"), desc("service", "service_2")), over,
		st{over, "3/minute", 0}, st{ok, "2/minute", 2})
	check(t, "service_2 counted nothing", e.ask(t, "rl", desc("service", "service_2")), ok, st{ok, "2/minute", 1})
}

// TestResponseMetadata: with ResponseMetadata, the answer carries
// envoyproxy/ratelimit's dynamic_metadata: the domain, each descriptor's
// entries and hits_addend, the request's hits_addend, and the merged
// metadata of the descriptors that are not over their limit; without it,
// none.
func TestResponseMetadata(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := startOpts(t, kind, guard.FailClosed, func(o *Options) { o.ResponseMetadata = true }, quotaConfig)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		meta := func(r *pb.RateLimitResponse) string {
			t.Helper()
			b, err := protojson.Marshal(r.GetDynamicMetadata())
			if err != nil {
				t.Fatal(err)
			}
			return strings.ReplaceAll(string(b), " ", "")
		}
		r := e.askHits(t, "rl", 1, desc("service", "service_1"), withHits(desc("service", "service_2"), 1), desc("regular", "m"))
		want := `{"descriptors":[{"entries":["service=service_1"]},{"entries":["service=service_2"],"hitsAddend":1},{"entries":["regular=m"]}],` +
			`"domain":"rl","hitsAddend":1,"metadata":{"regular":true,"service_with_quota":{"name":"service_1"}}}`
		if got := meta(r); got != want {
			t.Errorf("first: dynamic_metadata %s, want %s", got, want)
		}
		// service_1 is over: service_2's metadata is the one returned.
		r = e.ask(t, "rl", desc("service", "service_1"), desc("service", "service_2"))
		if got := meta(r); !strings.Contains(got, `"metadata":{"service_with_quota":{"name":"service_2"}}`) {
			t.Errorf("service_1 over: dynamic_metadata %s, want service_2's metadata", got)
		}
		// Both over: no descriptor's metadata.
		r = e.ask(t, "rl", desc("service", "service_1"), desc("service", "service_2"))
		if got := meta(r); r.GetOverallCode() != over || strings.Contains(got, `"metadata"`) {
			t.Errorf("both over: %v, dynamic_metadata %s, want OVER_LIMIT without metadata", r.GetOverallCode(), got)
		}

		off := start(t, kind, quotaConfig)
		if r := off.ask(t, "rl", desc("regular", "z")); r.GetDynamicMetadata() != nil {
			t.Errorf("without ResponseMetadata: dynamic_metadata %v, want none", r.GetDynamicMetadata())
		}
	})
}
