package rls

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/envoyconf"
)

// metrics are the service's Prometheus metrics, in the handler's style.
// Labels are bounded: policy names come from configuration, every override
// counts under "override", every other label is from a fixed set.
type metrics struct {
	ok, overLimit, failedOpen, invalid, unavailable, errors prometheus.Counter
	decisions                                               map[*algo.Policy]policyMetrics
	override                                                policyMetrics
}

type policyMetrics struct {
	allowed, denied, shadowDenied prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, c *envoyconf.Config) (*metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_rls_requests_total",
		Help: "ShouldRateLimit and /json requests by result: ok, over_limit, failed_open (the store could not decide; the fail mode admits), invalid (refused with InvalidArgument), unavailable (no decision), error.",
	}, []string{"result"})
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_rls_decisions_total",
		Help: "Rate-limit service decisions by policy (derived from the domain and descriptor path; override for limits sent by Envoy) and outcome: allowed, denied, shadow_denied.",
	}, []string{"policy", "outcome"})
	for _, col := range []prometheus.Collector{requests, decisions} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("rls metrics: %w", err)
		}
	}
	bind := func(name string) policyMetrics {
		return policyMetrics{
			allowed:      decisions.WithLabelValues(name, "allowed"),
			denied:       decisions.WithLabelValues(name, "denied"),
			shadowDenied: decisions.WithLabelValues(name, "shadow_denied"),
		}
	}
	m := &metrics{
		ok:          requests.WithLabelValues("ok"),
		overLimit:   requests.WithLabelValues("over_limit"),
		failedOpen:  requests.WithLabelValues("failed_open"),
		invalid:     requests.WithLabelValues("invalid"),
		unavailable: requests.WithLabelValues("unavailable"),
		errors:      requests.WithLabelValues("error"),
		decisions:   map[*algo.Policy]policyMetrics{},
		override:    bind("override"),
	}
	for _, p := range c.Policies() {
		m.decisions[p] = bind(p.Name())
	}
	return m, nil
}

// count records a request answered with an error.
func (m *metrics) count(err error) {
	switch status.Code(err) {
	case codes.InvalidArgument:
		m.invalid.Inc()
	case codes.Unavailable:
		m.unavailable.Inc()
	default:
		m.errors.Inc()
	}
}

// record counts each decided policy's outcome.
func (m *metrics) record(apps []applied, reqs []algo.Request, res []algo.Result, decided bool) {
	if !decided {
		return
	}
	for i, q := range reqs {
		pm, ok := m.decisions[q.Policy]
		if !ok {
			pm = m.override
		}
		switch {
		case res[i].Allowed:
			pm.allowed.Inc()
		case q.Shadow:
			pm.shadowDenied.Inc()
		default:
			pm.denied.Inc()
		}
	}
}
