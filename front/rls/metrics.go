package rls

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Metrics count the service's requests by how they were answered. The
// decisions of their limits are the engine's to count, with those of /auth
// and Check (authlimit_requests_total, authlimit_decisions_total): these
// add what only the front knows, the requests refused before the engine
// and the answer Envoy got.
//
// Build them once with NewMetrics and give them to every Service of the
// process (Options.Metrics): a Service built by a reload then continues the
// counts of the one it replaces, and Prometheus sees no counter reset. Their
// labels are a fixed set of answers, none per limit, so a reload that
// removes limits leaves no series behind.
type Metrics struct {
	ok, overLimit, failedOpen, invalid, unavailable, errors prometheus.Counter
}

// NewMetrics registers the service's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_rls_requests_total",
		Help: "ShouldRateLimit and /json requests by answer: ok, over_limit, failed_open (the store could not decide; the fail mode admits), invalid (refused with InvalidArgument), unavailable (no decision), error.",
	}, []string{"result"})
	if err := reg.Register(requests); err != nil {
		return nil, fmt.Errorf("rls metrics: %w", err)
	}
	return &Metrics{
		ok:          requests.WithLabelValues("ok"),
		overLimit:   requests.WithLabelValues("over_limit"),
		failedOpen:  requests.WithLabelValues("failed_open"),
		invalid:     requests.WithLabelValues("invalid"),
		unavailable: requests.WithLabelValues("unavailable"),
		errors:      requests.WithLabelValues("error"),
	}, nil
}

// count records how a request was answered.
func (m *Metrics) count(a *answer, failedOpen bool, err error) {
	switch {
	case err == nil && a.overLimit:
		m.overLimit.Inc()
	case err == nil && failedOpen:
		m.failedOpen.Inc()
	case err == nil:
		m.ok.Inc()
	case status.Code(err) == codes.InvalidArgument:
		m.invalid.Inc()
	case status.Code(err) == codes.Unavailable:
		m.unavailable.Inc()
	default:
		m.errors.Inc()
	}
}
