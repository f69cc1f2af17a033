package rls

import (
	"fmt"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// metrics count the service's requests by how they were answered. The
// decisions of their limits are the engine's to count, with those of /auth
// and Check (authlimit_requests_total, authlimit_decisions_total): these
// add what only the front knows, the requests refused before the engine
// and the answer Envoy got.
type metrics struct {
	ok, overLimit, failedOpen, invalid, unavailable, errors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_rls_requests_total",
		Help: "ShouldRateLimit and /json requests by answer: ok, over_limit, failed_open (the store could not decide; the fail mode admits), invalid (refused with InvalidArgument), unavailable (no decision), error.",
	}, []string{"result"})
	if err := reg.Register(requests); err != nil {
		return nil, fmt.Errorf("rls metrics: %w", err)
	}
	return &metrics{
		ok:          requests.WithLabelValues("ok"),
		overLimit:   requests.WithLabelValues("over_limit"),
		failedOpen:  requests.WithLabelValues("failed_open"),
		invalid:     requests.WithLabelValues("invalid"),
		unavailable: requests.WithLabelValues("unavailable"),
		errors:      requests.WithLabelValues("error"),
	}, nil
}

// count records how a request was answered.
func (m *metrics) count(resp *pb.RateLimitResponse, failedOpen bool, err error) {
	switch {
	case err == nil && resp.GetOverallCode() == pb.RateLimitResponse_OVER_LIMIT:
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
