package guard

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the guard's Prometheus metrics, each bound to its labels
// once, so that a decision looks nothing up.
type metrics struct {
	primaryLatency prometheus.Observer
	localLatency   prometheus.Observer
	timeouts       prometheus.Counter
	unreachable    prometheus.Counter
	errors         prometheus.Counter
	unavailable    prometheus.Counter
	failMode       map[FailMode]prometheus.Counter
	circuitState   *prometheus.GaugeVec
	circuitChanges map[state]prometheus.Counter
	probes         prometheus.Counter
	denyCacheHits  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "authlimit_store_duration_seconds",
		Help:    "Time to decide in a store: primary (Redis or the embedded memory store) or local (the fallback).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
	}, []string{"store"})
	storeErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_store_errors_total",
		Help: "Failed decisions in the primary store by kind: timeout (the budget passed), unreachable (nothing sent: the store is down) or error.",
	}, []string{"kind"})
	failMode := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_fail_mode_decisions_total",
		Help: "Requests decided by the fail mode (open, closed or local) because the store's circuit was open.",
	}, []string{"mode"})
	unavailable := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "authlimit_store_unavailable_total",
		Help: "Requests answered 503 because their decision failed while the store's circuit was closed.",
	})
	circuitState := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "authlimit_circuit_state",
		Help: "Each store shard's circuit breaker, by shard (0 for a standalone or Sentinel Redis or the memory store; one number per Redis Cluster primary, as the logs number them; all for the breaker that stands for every shard while the store is not ready at start): 0 closed, 2 open.",
	}, []string{"shard"})
	circuitChanges := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_circuit_transitions_total",
		Help: "Circuit breaker state changes by the state entered.",
	}, []string{"state"})
	probes := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "authlimit_store_probes_total",
		Help: "Probes of open circuits (at most one in flight at a time).",
	})
	hits := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "authlimit_deny_cache_hits_total",
		Help: "Requests denied from the local deny cache without asking the store.",
	})
	for _, c := range []prometheus.Collector{latency, storeErrors, failMode, unavailable, circuitState, circuitChanges, probes, hits} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("guard metrics: %w", err)
		}
	}
	m := &metrics{
		primaryLatency: latency.WithLabelValues("primary"),
		localLatency:   latency.WithLabelValues("local"),
		timeouts:       storeErrors.WithLabelValues("timeout"),
		unreachable:    storeErrors.WithLabelValues("unreachable"),
		errors:         storeErrors.WithLabelValues("error"),
		unavailable:    unavailable,
		failMode:       map[FailMode]prometheus.Counter{},
		circuitState:   circuitState,
		circuitChanges: map[state]prometheus.Counter{},
		probes:         probes,
		denyCacheHits:  hits,
	}
	for _, f := range []FailMode{FailLocal, FailOpen, FailClosed} {
		m.failMode[f] = failMode.WithLabelValues(f.String())
	}
	for _, s := range []state{stateClosed, stateOpen} {
		m.circuitChanges[s] = circuitChanges.WithLabelValues(s.String())
	}
	return m, nil
}
