package decide

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/rules"
)

// ruleSet is a rule set as the engine decides it, never modified once
// built: the rules, what the headers and the problem say of each, and each
// rule's metrics bound to its labels.
type ruleSet struct {
	rules   []*rules.Rule
	policy  [][]byte      // rules[i]'s RateLimit-Policy item
	names   [][]byte      // rules[i]'s name, quoted
	metrics []ruleMetrics // rules[i]'s decision counters
}

func newRuleSet(rs []*rules.Rule, m *metrics) *ruleSet {
	set := &ruleSet{rules: rs}
	for _, r := range rs {
		s := r.Policy.Spec()
		set.policy = append(set.policy, []byte(fmt.Sprintf(`"%s";q=%d;w=%d`, r.Name, s.Limit, ceilSeconds(s.Window, 1))))
		set.names = append(set.names, []byte(`"`+r.Name+`"`))
		set.metrics = append(set.metrics, ruleMetrics{
			allowed:      m.decisions.WithLabelValues(r.Name, "allowed"),
			denied:       m.decisions.WithLabelValues(r.Name, "denied"),
			shadowDenied: m.decisions.WithLabelValues(r.Name, "shadow_denied"),
		})
	}
	return set
}

// metrics are the engine's Prometheus metrics, each bound to its labels
// once, so that a request looks nothing up. Labels are bounded: rule names
// come from configuration, every other label from a fixed set; nothing is
// labelled by key or client.
type metrics struct {
	allowed, denied, unmatched, allowlisted, blocked prometheus.Counter
	invalid, unavailable, errors                     prometheus.Counter
	decisions                                        *prometheus.CounterVec
	delay                                            prometheus.Histogram
}

type ruleMetrics struct {
	allowed, denied, shadowDenied prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_requests_total",
		Help: "Auth requests by result: allowed, denied, unmatched (no rule applied), allowlisted, blocked, invalid (a bad, missing or repeated key or cost header), unavailable (no decision: 503), error.",
	}, []string{"result"})
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_decisions_total",
		Help: "Rule decisions by rule and outcome: allowed, denied, shadow_denied (a shadow rule that would have denied).",
	}, []string{"rule", "outcome"})
	delay := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "authlimit_shaping_delay_seconds",
		Help:    "How long admitted requests were held by shaping leaky buckets.",
		Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	})
	for _, c := range []prometheus.Collector{requests, decisions, delay} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("decide metrics: %w", err)
		}
	}
	return &metrics{
		allowed:     requests.WithLabelValues("allowed"),
		denied:      requests.WithLabelValues("denied"),
		unmatched:   requests.WithLabelValues("unmatched"),
		allowlisted: requests.WithLabelValues("allowlisted"),
		blocked:     requests.WithLabelValues("blocked"),
		invalid:     requests.WithLabelValues("invalid"),
		unavailable: requests.WithLabelValues("unavailable"),
		errors:      requests.WithLabelValues("error"),
		decisions:   decisions,
		delay:       delay,
	}, nil
}
