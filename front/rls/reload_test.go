package rls

import (
	"context"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
)

// TestNewConfigurationKeepsCounts: a rule set with a new configuration,
// swapped in as a reload does, is answered from at once; its limits
// continue the counts of the previous configuration's under the same
// policy, in the store and in the metrics; a second Service registering
// its metrics with the same registry is refused.
func TestNewConfigurationKeepsCounts(t *testing.T) {
	yaml := "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 2}}\n"
	m := algo.NewMemory(algo.MemoryOptions{})
	t.Cleanup(func() { _ = m.Close() })
	reg := prometheus.NewRegistry()
	h := newHolder(t, parseConfig(t, yaml))
	g, err := guard.New(guard.Options{Store: m, Rules: h, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, h, g, reg, false)
	svc, err := New(Options{Rules: h, Engine: e, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(key string) pb.RateLimitResponse_Code {
		t.Helper()
		r, err := svc.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlDesc{desc(key, "v")}})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetOverallCode()
	}
	if got := ask("k"); got != ok {
		t.Fatalf("first request: %v", got)
	}
	set, err := h.WithRLS(parseConfig(t, yaml+"  - {key: other, rate_limit: {unit: hour, requests_per_unit: 1}}\n"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	h.Store(set, time.Now())
	if got := ask("k"); got != ok {
		t.Errorf("second request, under the new configuration: %v, want OK", got)
	}
	if got := ask("k"); got != over {
		t.Errorf("third request, under the new configuration: %v, want OVER_LIMIT: the count did not carry over", got)
	}
	// The new configuration's own limit is in force.
	for want, i := ok, 0; i < 2; want, i = over, i+1 {
		if got := ask("other"); got != want {
			t.Errorf("the new limit, request %d: %v, want %v", i+1, got, want)
		}
	}
	for result, want := range map[string]float64{"ok": 3, "over_limit": 2} {
		c, err := metricsCounter(reg, result)
		if err != nil {
			t.Fatal(err)
		}
		if c != want {
			t.Errorf("authlimit_rls_requests_total{result=%q} = %v, want %v", result, c, want)
		}
	}
	if _, err := New(Options{Rules: h, Engine: e, Registry: reg}); err == nil {
		t.Error("a second set of metrics on one registry was accepted")
	}
}

// metricsCounter reads authlimit_rls_requests_total{result} from reg.
func metricsCounter(reg *prometheus.Registry, result string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != "authlimit_rls_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue(), nil
				}
			}
		}
	}
	return 0, nil
}
