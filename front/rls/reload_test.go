package rls

import (
	"context"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
)

// TestReplacedServiceSharesMetricsAndCounts: a Service built for a new
// configuration with the Metrics of the one it replaces continues its
// counts, in the metrics and in the store, also after the old one is
// closed; a second Service registering its own metrics with the same
// registry is refused.
func TestReplacedServiceSharesMetricsAndCounts(t *testing.T) {
	yaml := "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 2}}\n"
	oldCfg := parseConfig(t, yaml)
	newCfg := parseConfig(t, yaml+"  - {key: other, rate_limit: {unit: hour, requests_per_unit: 5}}\n")
	m := algo.NewMemory(algo.MemoryOptions{})
	t.Cleanup(func() { _ = m.Close() })
	reg := prometheus.NewRegistry()
	g, err := guard.New(guard.Options{Store: m, Policies: oldCfg.Policies(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, g, reg, false)
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	old, err := New(Options{Config: oldCfg, Engine: e, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(s *Service) pb.RateLimitResponse_Code {
		t.Helper()
		r, err := s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlDesc{desc("k", "v")}})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetOverallCode()
	}
	if got := ask(old); got != ok {
		t.Fatalf("first request: %v", got)
	}
	next, err := New(Options{Config: newCfg, Engine: e, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Errorf("closing twice: %v", err)
	}
	if got := ask(next); got != ok {
		t.Errorf("second request, on the new service: %v, want OK", got)
	}
	if got := ask(next); got != over {
		t.Errorf("third request, on the new service: %v, want OVER_LIMIT: the count did not carry over", got)
	}
	// A request the old service still answers after its Close decides
	// with the same counts.
	if got := ask(old); got != over {
		t.Errorf("a request on the closed service: %v, want OVER_LIMIT", got)
	}
	for result, want := range map[string]float64{"ok": 2, "over_limit": 2} {
		c, err := metricsCounter(reg, result)
		if err != nil {
			t.Fatal(err)
		}
		if c != want {
			t.Errorf("authlimit_rls_requests_total{result=%q} = %v, want %v", result, c, want)
		}
	}
	if _, err := New(Options{Config: newCfg, Engine: e, Registry: reg}); err == nil {
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
