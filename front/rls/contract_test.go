package rls

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
)

const (
	ok   = pb.RateLimitResponse_OK
	over = pb.RateLimitResponse_OVER_LIMIT
)

// st is an expected descriptor status: code, then the limit
// ("20/minute", "" for none, "unlimited") and the remaining count.
type st struct {
	code      pb.RateLimitResponse_Code
	limit     string
	remaining uint32
}

func (s st) String() string { return fmt.Sprintf("%v %s remaining %d", s.code, s.limit, s.remaining) }

func statusOf(s *pb.RateLimitResponse_DescriptorStatus) st {
	out := st{code: s.GetCode(), remaining: s.GetLimitRemaining()}
	if l := s.GetCurrentLimit(); l != nil {
		out.limit = fmt.Sprintf("%d/%s", l.GetRequestsPerUnit(), strings.ToLower(l.GetUnit().String()))
		if l.GetName() != "" {
			out.limit += " " + l.GetName()
		}
	} else if s.GetLimitRemaining() == math.MaxUint32 {
		out.limit, out.remaining = "unlimited", 0
	}
	return out
}

// check asserts the overall code and every status, in order.
func check(t *testing.T, what string, r *pb.RateLimitResponse, overall pb.RateLimitResponse_Code, want ...st) {
	t.Helper()
	var got []string
	for _, s := range r.GetStatuses() {
		got = append(got, statusOf(s).String())
	}
	var exp []string
	for _, s := range want {
		exp = append(exp, s.String())
	}
	if r.GetOverallCode() != overall || strings.Join(got, "; ") != strings.Join(exp, "; ") {
		t.Fatalf("%s: %v [%s], want %v [%s]", what, r.GetOverallCode(), strings.Join(got, "; "), overall, strings.Join(exp, "; "))
	}
}

// The integration test's "another" configuration: 20 per minute admits 20,
// then OVER_LIMIT with nothing remaining; two descriptors in one request
// are decided together.
const another = `
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 20}
`

// The integration test's "basic" configuration.
const basic = `
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
`

func TestTwentyPerMinute(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, another, basic)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		for i := 1; i <= 20; i++ {
			r := e.ask(t, "another", desc("key2", "value1"))
			check(t, fmt.Sprintf("request %d", i), r, ok, st{ok, "20/minute", uint32(20 - i)})
			if d := r.Statuses[0].GetDurationUntilReset().AsDuration(); d <= 0 || d > time.Minute {
				t.Fatalf("request %d: duration_until_reset %v, want within the minute", i, d)
			}
		}
		for i := 0; i < 3; i++ {
			check(t, "request 21+", e.ask(t, "another", desc("key2", "value1")), over, st{over, "20/minute", 0})
		}
		// Another value is another counter.
		check(t, "another value", e.ask(t, "another", desc("key2", "value2")), ok, st{ok, "20/minute", 19})
		// One per minute.
		check(t, "one_per_minute", e.ask(t, "basic", desc("one_per_minute", "x")), ok, st{ok, "1/minute", 0})
		check(t, "one_per_minute again", e.ask(t, "basic", desc("one_per_minute", "x")), over, st{over, "1/minute", 0})
	})
}

func TestTwoDescriptorsAllOrNothing(t *testing.T) {
	t.Parallel()
	eachStoreAndCluster(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, another)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		for i := 1; i <= 10; i++ {
			check(t, fmt.Sprintf("request %d", i), e.ask(t, "another", desc("key2", "a"), desc("key3", "b")), ok,
				st{ok, "20/minute", uint32(20 - i)}, st{ok, "10/hour", uint32(10 - i)})
		}
		// key3 is used up: the request is denied, and key2 counts nothing
		// (envoyproxy/ratelimit would count it).
		check(t, "key3 over", e.ask(t, "another", desc("key2", "a"), desc("key3", "b")), over,
			st{ok, "20/minute", 10}, st{over, "10/hour", 0})
		// The guard's deny cache knows key3's denial, but leaves a request
		// of several limits to the store: key2's status has its count.
		hits := e.counters(t)["authlimit_deny_cache_hits_total{}"]
		for i := 0; i < 3; i++ {
			check(t, "key3 over again", e.ask(t, "another", desc("key2", "a"), desc("key3", "b")), over,
				st{ok, "20/minute", 10}, st{over, "10/hour", 0})
		}
		if got := e.counters(t)["authlimit_deny_cache_hits_total{}"]; got != hits {
			t.Errorf("deny cache hits %v, want %v: a request of several limits is the store's", got, hits)
		}
		// key3 alone: the deny cache answers it, whole.
		check(t, "key3 alone", e.ask(t, "another", desc("key3", "b")), over, st{over, "10/hour", 0})
		if got := e.counters(t)["authlimit_deny_cache_hits_total{}"]; got != hits+1 {
			t.Errorf("deny cache hits %v, want %v: a request of key3 alone is the cache's", got, hits+1)
		}
		check(t, "key2 alone", e.ask(t, "another", desc("key2", "a")), ok, st{ok, "20/minute", 9})
		// A descriptor without a limit answers OK with none.
		check(t, "unknown descriptor beside", e.ask(t, "another", desc("nope", "x"), desc("key4", "c")), ok,
			st{ok, "", 0}, st{ok, "20/day", 19})
	})
}

func TestHitsAddend(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, another)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		check(t, "request hits 5", e.askHits(t, "another", 5, desc("key2", "h")), ok, st{ok, "20/minute", 15})
		// The descriptor's own hits_addend wins over the request's.
		check(t, "descriptor hits 10", e.askHits(t, "another", 5, withHits(desc("key2", "h"), 10)), ok, st{ok, "20/minute", 5})
		check(t, "hits 6 of 5 left", e.askHits(t, "another", 6, desc("key2", "h")), over, st{over, "20/minute", 5})
		check(t, "hits 5 of 5 left", e.askHits(t, "another", 5, desc("key2", "h")), ok, st{ok, "20/minute", 0})
		// A descriptor hits_addend of 0 counts nothing.
		check(t, "hits 0", e.ask(t, "another", withHits(desc("key2", "h0"), 0)), ok, st{ok, "", 0})
		check(t, "after hits 0", e.ask(t, "another", desc("key2", "h0")), ok, st{ok, "20/minute", 19})
		// A cost no limit ever admits is over the limit, counting nothing.
		check(t, "huge hits", e.ask(t, "another", withHits(desc("key2", "h1"), math.MaxUint64)), over, st{over, "20/minute", 20})
		check(t, "after huge hits", e.ask(t, "another", desc("key2", "h1")), ok, st{ok, "20/minute", 19})
	})
}

// A configuration shaped as envoyproxy/ratelimit's integration test's
// replaces scenario: a banned value with a limit of 0 that a more specific
// descriptor replaces, and one limit replacing two.
const replaces = `
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      unit: minute
      requests_per_unit: 4
      replaces: [{name: bkthomps}, {name: fake_name}]
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit: {unit: minute, requests_per_unit: 2, replaces: [{name: bkthomps}]}
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: destination_cluster
        value: override
        rate_limit: {unit: minute, requests_per_unit: 2, replaces: [{name: banned_limit}]}
      - key: destination_cluster
        value: fake
        rate_limit: {unit: minute, requests_per_unit: 2, name: fake_name}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: bkthomps
        rate_limit: {unit: minute, requests_per_unit: 1, name: bkthomps}
      - key: bar
        value: banned
        rate_limit: {unit: minute, requests_per_unit: 0, name: banned_limit}
`

func TestReplaces(t *testing.T) {
	t.Parallel()
	eachStoreAndCluster(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, replaces)
		awayFromWindowEdge(t, time.Minute, 20*time.Second)
		two := func(foo, bar string) []*rlDesc { return []*rlDesc{desc("foo", foo, "bar", bar)} }
		four := func(foo, bar, dst string) []*rlDesc {
			return append(two(foo, bar), desc("source_cluster", "proxy", "destination_cluster", dst))
		}
		five := func(foo, bar, dst string) []*rlDesc { return append(four(foo, bar, dst), desc("category", "account")) }
		steps := []struct {
			ds      []*rlDesc
			overall pb.RateLimitResponse_Code
		}{
			// The banned value is limited; replacing its limit lifts it.
			{two("bkthomps", "banned"), over},
			{four("bkthomps", "banned", "mock"), over},
			{four("bkthomps", "banned", "override"), ok},
			{four("bkthomps", "banned", "override"), ok},
			{four("bkthomps", "banned", "override"), over},
			// Replacing does not touch the replaced limit's count.
			{four("my_foo", "bkthomps", "bkthomps"), ok},
			{four("my_foo", "bkthomps", "bkthomps"), ok},
			{four("my_foo", "bkthomps", "bkthomps"), over},
			{four("my_foo", "bkthomps", "not_bkthomps"), ok},
			{four("my_foo", "bkthomps", "not_bkthomps"), over},
			{four("my_foo", "bkthomps", "bkthomps"), over},
			// One limit replaces two.
			{five("my_foo", "bkthomps", "fake"), ok},
			{five("my_foo", "bkthomps", "fake"), ok},
			{five("my_foo", "bkthomps", "fake"), ok},
			{five("my_foo", "bkthomps", "fake"), ok},
			{five("my_foo", "bkthomps", "fake"), over},
			{two("foo_2", "bkthomps"), ok},
			{two("foo_2", "bkthomps"), over},
			{four("foo_3", "bar_3", "fake"), ok},
			{four("foo_3", "bar_3", "fake"), ok},
			{four("foo_3", "bar_3", "fake"), over},
			{five("my_foo", "bkthomps", "fake"), over},
		}
		for i, s := range steps {
			if got := e.ask(t, "rl", s.ds...).GetOverallCode(); got != s.overall {
				t.Fatalf("step %d (%v): %v, want %v", i+1, s.ds, got, s.overall)
			}
		}
	})
}

func TestReadmeExamples(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind,
			// Example 1: two values of one key.
			`
domain: mongo_cps
descriptors:
  - {key: database, value: users, rate_limit: {unit: second, requests_per_unit: 500}}
  - {key: database, value: default, rate_limit: {unit: second, requests_per_unit: 500}}
`,
			// Example 2: nested descriptors and a key without value.
			`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`,
			// Example 3: the most specific match; 0 per unit denies.
			`
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
`,
			// Example 4: a descriptor matches a path of its own length.
			`
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
  - key: key2
    value: value
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 300, unit: second}
`,
			// Example 5: unlimited.
			`
domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: azure
    rate_limit: {unit: minute, requests_per_unit: 100}
`,
			// Example 6: shadow_mode.
			`
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 10, unit: minute}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 20, unit: minute}
`,
			// Example 7: replaces.
			`
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: minute}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {replaces: [{name: specific_limit}], requests_per_unit: 10, unit: minute}
`,
			// Example 8: detailed_metric.
			`
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
`,
			// Example 9: wildcards, trailing, middle and several.
			`
domain: example9
descriptors:
  - {key: key1, value: value*, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: path, value: /api/*/action, rate_limit: {unit: minute, requests_per_unit: 21}}
  - {key: route, value: /api/*/resource/*/action, rate_limit: {unit: minute, requests_per_unit: 22}}
`,
			// Example 10: value_to_metric.
			`
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
`,
			// Example 11: share_threshold.
			`
domain: example11
descriptors:
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: files_no_share, value: files_no_share/*, share_threshold: false, rate_limit: {unit: hour, requests_per_unit: 10}}
`)
		awayFromWindowEdge(t, time.Minute, 20*time.Second)

		t.Run("1", func(t *testing.T) {
			check(t, "users", e.ask(t, "mongo_cps", desc("database", "users")), ok, st{ok, "500/second", 499})
			check(t, "other", e.ask(t, "mongo_cps", desc("database", "other")), ok, st{ok, "", 0})
		})
		t.Run("2", func(t *testing.T) {
			both := func() []*rlDesc {
				return []*rlDesc{desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111")}
			}
			for i := 1; i <= 5; i++ {
				check(t, "marketing", e.ask(t, "messaging", both()...), ok, st{ok, "5/day", uint32(5 - i)}, st{ok, "100/day", uint32(100 - i)})
			}
			check(t, "sixth marketing", e.ask(t, "messaging", both()...), over, st{over, "5/day", 0}, st{ok, "100/day", 95})
			check(t, "another number", e.ask(t, "messaging", desc("message_type", "marketing", "to_number", "2062222222")), ok, st{ok, "5/day", 4})
			check(t, "to_number alone", e.ask(t, "messaging", desc("to_number", "2061111111")), ok, st{ok, "100/day", 94})
		})
		t.Run("3", func(t *testing.T) {
			for i := 0; i < 3; i++ {
				check(t, "blocked address", e.ask(t, "edge_proxy_per_ip", desc("remote_address", "50.0.0.5")), over, st{over, "0/second", 0})
			}
			for i := 1; i <= 10; i++ {
				check(t, "other address", e.ask(t, "edge_proxy_per_ip", desc("remote_address", "50.0.0.1")), ok, st{ok, "10/minute", uint32(10 - i)})
			}
			check(t, "other address, 11th", e.ask(t, "edge_proxy_per_ip", desc("remote_address", "50.0.0.1")), over, st{over, "10/minute", 0})
			// A blocked descriptor denies the request; the other counts nothing.
			check(t, "blocked beside", e.ask(t, "edge_proxy_per_ip", desc("remote_address", "50.0.0.2"), desc("remote_address", "50.0.0.5")), over,
				st{ok, "", 0}, st{over, "0/second", 0})
			check(t, "after blocked beside", e.ask(t, "edge_proxy_per_ip", desc("remote_address", "50.0.0.2")), ok, st{ok, "10/minute", 9})
		})
		t.Run("4", func(t *testing.T) {
			check(t, "longer than the limit's path", e.ask(t, "example4", desc("key", "value", "subkey", "subvalue")), ok, st{ok, "", 0})
			check(t, "its own length", e.ask(t, "example4", desc("key2", "value", "subkey", "subvalue")), ok, st{ok, "300/second", 299})
			check(t, "shorter", e.ask(t, "example4", desc("key2", "value")), ok, st{ok, "", 0})
		})
		t.Run("5", func(t *testing.T) {
			for i := 0; i < 120; i++ {
				check(t, "ldap", e.ask(t, "internal", desc("ldap", "x")), ok, st{ok, "unlimited", 0})
			}
			check(t, "azure", e.ask(t, "internal", desc("azure", "x")), ok, st{ok, "100/minute", 99})
		})
		t.Run("6", func(t *testing.T) {
			for i := 1; i <= 10; i++ {
				check(t, "user-a", e.ask(t, "example6", desc("service", "auth-service", "user", "user-a")), ok, st{ok, "10/minute", uint32(10 - i)})
			}
			for i := 0; i < 5; i++ {
				check(t, "user-a past its limit", e.ask(t, "example6", desc("service", "auth-service", "user", "user-a")), ok, st{ok, "10/minute", 0})
			}
			for i := 1; i <= 20; i++ {
				e.ask(t, "example6", desc("service", "auth-service", "user", "user-b"))
			}
			check(t, "user-b", e.ask(t, "example6", desc("service", "auth-service", "user", "user-b")), over, st{over, "20/minute", 0})
		})
		t.Run("7", func(t *testing.T) {
			both := []*rlDesc{desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")}
			for i := 1; i <= 10; i++ {
				check(t, "both", e.ask(t, "example7", both...), ok, st{ok, "", 0}, st{ok, "10/minute", uint32(10 - i)})
			}
			check(t, "both, 11th", e.ask(t, "example7", both...), over, st{ok, "", 0}, st{over, "10/minute", 0})
			check(t, "specific alone", e.ask(t, "example7", desc("key_1", "value_1", "user", "bkthomps")), ok, st{ok, "5/minute specific_limit", 4})
		})
		t.Run("8", func(t *testing.T) {
			check(t, "unspecified", e.ask(t, "example8", desc("key1", "unspecified_value")), ok, st{ok, "10/minute", 9})
			check(t, "unspecified2", e.ask(t, "example8", desc("key1", "unspecified_value2")), ok, st{ok, "10/minute", 9})
			check(t, "value1", e.ask(t, "example8", desc("key1", "value1")), ok, st{ok, "20/minute", 19})
		})
		t.Run("9", func(t *testing.T) {
			check(t, "value1", e.ask(t, "example9", desc("key1", "value1")), ok, st{ok, "20/minute", 19})
			check(t, "valueXYZ", e.ask(t, "example9", desc("key1", "valueXYZ")), ok, st{ok, "20/minute", 19})
			check(t, "middle", e.ask(t, "example9", desc("path", "/api/123/action")), ok, st{ok, "21/minute", 20})
			check(t, "middle, other suffix", e.ask(t, "example9", desc("path", "/api/123/other")), ok, st{ok, "", 0})
			check(t, "several", e.ask(t, "example9", desc("route", "/api/v1/resource/123/action")), ok, st{ok, "22/minute", 21})
			check(t, "several, out of order", e.ask(t, "example9", desc("route", "/api/v1/action/123/resource")), ok, st{ok, "", 0})
		})
		t.Run("10", func(t *testing.T) {
			check(t, "api", e.ask(t, "example10", desc("route", "api", "http_method", "GET", "subject_id", "123")), ok, st{ok, "60/minute", 59})
			check(t, "web", e.ask(t, "example10", desc("route", "web", "http_method", "POST", "subject_id", "456")), ok, st{ok, "60/minute", 59})
		})
		t.Run("11", func(t *testing.T) {
			for i := 0; i < 5; i++ {
				e.ask(t, "example11", desc("files", "files/a.pdf"))
				e.ask(t, "example11", desc("files", "files/b.csv"))
			}
			check(t, "shared threshold", e.ask(t, "example11", desc("files", "files/c.txt")), over, st{over, "10/hour", 0})
			for i := 0; i < 10; i++ {
				e.ask(t, "example11", desc("files_no_share", "files_no_share/a.pdf"))
			}
			check(t, "isolated threshold", e.ask(t, "example11", desc("files_no_share", "files_no_share/b.csv")), ok, st{ok, "10/hour", 9})
		})
		t.Run("unknown domain", func(t *testing.T) {
			check(t, "unknown domain", e.ask(t, "no_such_domain", desc("database", "users"), desc("x", "y")), ok, st{ok, "", 0}, st{ok, "", 0})
		})
	})
}

func TestOverride(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, another)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		for i := 1; i <= 3; i++ {
			check(t, "override", e.ask(t, "another", withOverride(desc("key2", "o"), 3, typepb.RateLimitUnit_MINUTE)), ok, st{ok, "3/minute", uint32(3 - i)})
		}
		check(t, "override, 4th", e.ask(t, "another", withOverride(desc("key2", "o"), 3, typepb.RateLimitUnit_MINUTE)), over, st{over, "3/minute", 0})
		// The configured limit of the same descriptor keeps its own count.
		check(t, "configured", e.ask(t, "another", desc("key2", "o")), ok, st{ok, "20/minute", 19})
		// An override applies to a descriptor the configuration does not know.
		check(t, "override, unknown key", e.ask(t, "another", withOverride(desc("zzz", "o"), 1, typepb.RateLimitUnit_HOUR)), ok, st{ok, "1/hour", 0})
		check(t, "override of 0", e.ask(t, "another", withOverride(desc("zzz", "p"), 0, typepb.RateLimitUnit_HOUR)), over, st{over, "0/hour", 0})
		// In an unknown domain, nothing applies, as in envoyproxy/ratelimit.
		check(t, "override, unknown domain", e.ask(t, "nope", withOverride(desc("key2", "o"), 1, typepb.RateLimitUnit_HOUR)), ok, st{ok, "", 0})
	})
}

func TestHeaders(t *testing.T) {
	e := start(t, memoryStore, another)
	awayFromWindowEdge(t, time.Minute, 15*time.Second)
	r := e.ask(t, "another", desc("key2", "hd"), desc("key3", "hd"))
	h := map[string]string{}
	for _, v := range r.GetResponseHeadersToAdd() {
		h[v.GetKey()] = v.GetValue()
	}
	cfg := e.svc.rules.Load().RLS()
	p2, p3 := cfg.Policies()[0].Name(), cfg.Policies()[1].Name()
	want := map[string]string{
		"RateLimit-Policy":      fmt.Sprintf(`"%s";q=20;w=60, "%s";q=10;w=3600`, p2, p3),
		"X-RateLimit-Limit":     "10",
		"X-RateLimit-Remaining": "9",
		"RateLimit":             fmt.Sprintf(`"%s";r=9;t=`, p3),
	}
	for k, v := range want {
		if got := h[k]; !strings.HasPrefix(got, v) {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if _, ok := h["Retry-After"]; ok {
		t.Errorf("Retry-After on an admitted request")
	}
	for i := 0; i < 20; i++ {
		e.ask(t, "another", desc("key2", "hd2"))
	}
	r = e.ask(t, "another", desc("key2", "hd2"))
	found := false
	for _, v := range r.GetResponseHeadersToAdd() {
		if v.GetKey() == "Retry-After" {
			found = true
			if n := v.GetValue(); n < "1" {
				t.Errorf("Retry-After %q", n)
			}
		}
	}
	if !found {
		t.Errorf("no Retry-After on a denial: %v", r.GetResponseHeadersToAdd())
	}
}

func TestSeveralLimitsAndAlgorithms(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := start(t, kind, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket, burst: 3}
`)
		awayFromWindowEdge(t, time.Minute, 15*time.Second)
		for i := 1; i <= 3; i++ {
			// The status describes the limit with the fewest remaining.
			check(t, "burst", e.ask(t, "api", desc("user", "u")), ok, st{ok, "100/hour", uint32(3 - i)})
		}
		check(t, "bucket empty", e.ask(t, "api", desc("user", "u")), over, st{over, "100/hour", 0})
	})
}

func TestMetrics(t *testing.T) {
	e := start(t, memoryStore, another, `
domain: s
descriptors:
  - {key: k, shadow_mode: true, rate_limit: {unit: hour, requests_per_unit: 1}}
`)
	awayFromWindowEdge(t, time.Minute, 15*time.Second)
	for i := 0; i < 21; i++ {
		e.ask(t, "another", desc("key2", "m"))
	}
	e.ask(t, "s", desc("k", "m"))
	e.ask(t, "s", desc("k", "m"))
	e.ask(t, "another", withOverride(desc("key2", "m"), 1, typepb.RateLimitUnit_HOUR))
	e.ask(t, "another", withOverride(desc("key2", "m"), 2, typepb.RateLimitUnit_HOUR))
	_, _ = e.client.ShouldRateLimit(t.Context(), &pb.RateLimitRequest{})
	got := e.counters(t)
	cfg := e.svc.rules.Load().RLS()
	key2, shadow := cfg.Policies()[0].Name(), cfg.Policies()[3].Name()
	// The front counts its answers; the engine counts the decisions, once,
	// with those of /auth and Check.
	for k, v := range map[string]float64{
		"authlimit_rls_requests_total{result=ok}":                              24,
		"authlimit_rls_requests_total{result=over_limit}":                      1,
		"authlimit_rls_requests_total{result=invalid}":                         1,
		"authlimit_requests_total{front=rls,result=allowed}":                   24,
		"authlimit_requests_total{front=rls,result=denied}":                    1,
		"authlimit_requests_total{front=rls,result=invalid}":                   0,
		"authlimit_decisions_total{outcome=allowed,rule=" + key2 + "}":         20,
		"authlimit_decisions_total{outcome=denied,rule=" + key2 + "}":          1,
		"authlimit_decisions_total{outcome=allowed,rule=" + shadow + "}":       1,
		"authlimit_decisions_total{outcome=shadow_denied,rule=" + shadow + "}": 1,
		"authlimit_decisions_total{outcome=allowed,rule=override}":             2,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "authlimit_rls_decisions_total") {
			t.Errorf("%s: decisions are counted twice", k)
		}
	}
}

// counters gathers every counter of the registry by name and labels, as
// name{label=value,...} with the labels sorted.
func (e *env) counters(t *testing.T) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	return got
}

// TestEngineShadow: with the engine's shadow setting (AUTHLIMIT_SHADOW),
// every limit is decided and counted but denies nothing, a limit of 0
// too.
func TestEngineShadow(t *testing.T) {
	cfg := parseConfig(t, `
domain: sh
descriptors:
  - {key: one, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: none, rate_limit: {unit: hour, requests_per_unit: 0}}
`)
	m := algo.NewMemory(algo.MemoryOptions{})
	t.Cleanup(func() { _ = m.Close() })
	reg := prometheus.NewRegistry()
	h := newHolder(t, cfg)
	g, err := guard.New(guard.Options{Store: m, Rules: h, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{Rules: h, Engine: newEngine(t, h, g, reg, true), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(ds ...*rlDesc) *pb.RateLimitResponse {
		t.Helper()
		r, err := svc.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "sh", Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	check(t, "first", ask(desc("one", "x")), ok, st{ok, "1/hour", 0})
	check(t, "over, in shadow", ask(desc("one", "x")), ok, st{ok, "1/hour", 0})
	check(t, "a limit of 0, in shadow", ask(desc("one", "y"), desc("none", "x")), ok, st{ok, "1/hour", 0}, st{ok, "0/hour", 0})
	if r := ask(desc("one", "x")); len(r.GetResponseHeadersToAdd()) != 0 {
		t.Errorf("headers of shadow limits: %v", r.GetResponseHeadersToAdd())
	}
}
