package handler

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are authlimit's Prometheus metrics. Labels are bounded: rule names
// come from configuration, every other label from a fixed set; nothing is
// labelled by key or client.
type metrics struct {
	requests       *prometheus.CounterVec
	decisions      *prometheus.CounterVec
	storeLatency   *prometheus.HistogramVec
	storeErrors    *prometheus.CounterVec
	failMode       *prometheus.CounterVec
	circuitState   prometheus.Gauge
	circuitChanges *prometheus.CounterVec
	denyCacheHits  prometheus.Counter
	delay          prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authlimit_requests_total",
			Help: "Auth requests by result: allowed, denied, unmatched (no rule applied), allowlisted, blocked, invalid (bad cost or missing key header), unavailable (store down, fail mode closed), error.",
		}, []string{"result"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authlimit_decisions_total",
			Help: "Rule decisions by rule and outcome: allowed, denied, shadow_denied (a shadow rule that would have denied).",
		}, []string{"rule", "outcome"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "authlimit_store_duration_seconds",
			Help:    "Time to decide in a store: primary (Redis or the embedded memory store) or local (the fallback).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"store"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authlimit_store_errors_total",
			Help: "Failed decisions in the primary store by kind: timeout or error.",
		}, []string{"kind"}),
		failMode: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authlimit_fail_mode_decisions_total",
			Help: "Requests decided by the fail mode (open, closed or local) because the store failed or the circuit was open.",
		}, []string{"mode"}),
		circuitState: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "authlimit_circuit_state",
			Help: "The store circuit breaker: 0 closed, 1 half open, 2 open.",
		}),
		circuitChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authlimit_circuit_transitions_total",
			Help: "Circuit breaker state changes by the state entered.",
		}, []string{"state"}),
		denyCacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "authlimit_deny_cache_hits_total",
			Help: "Requests denied from the local deny cache without asking the store.",
		}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "authlimit_shaping_delay_seconds",
			Help:    "How long admitted requests were held by shaping leaky buckets.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
	}
	reg.MustRegister(m.requests, m.decisions, m.storeLatency, m.storeErrors, m.failMode,
		m.circuitState, m.circuitChanges, m.denyCacheHits, m.delay)
	return m
}
