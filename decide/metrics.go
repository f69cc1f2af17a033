package decide

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset"
)

// ruleView is a rule set as the engine decides it, never modified once
// built: the set's rules and, for each, a Limit per policy
// (rules.Rule.Policies: its own, its tiers', its overrides'), all under the
// rule's name, so that the headers name the rule and give the limit that
// applied.
type ruleView struct {
	set    *ruleset.Set
	rules  []*rules.Rule
	limits [][]*Limit // rules[i]'s, indexed as rules[i].Policies()
}

func newRuleView(s *ruleset.Set, m *metrics) *ruleView {
	set := &ruleView{set: s, rules: s.Rules()}
	for _, r := range set.rules {
		var ls []*Limit
		for _, p := range r.Policies() {
			ls = append(ls, newLimit(r.Name, r.Name, p, m))
		}
		set.limits = append(set.limits, ls)
	}
	return set
}

// Limit is a policy under a name, as the headers, the problem and the
// metrics give it: the engine makes one per rule, and a front that picks
// its policies itself (Envoy's rate limit service) makes its own with
// NewLimit, once per configuration, and decides them with DecideLimits.
type Limit struct {
	// Name names the limit in RateLimit-Policy, RateLimit, the problem's
	// violated-policies and the metrics' rule label.
	Name string
	// Policy is the enforced limit.
	Policy *algo.Policy

	quoted  []byte // Name, quoted
	item    []byte // the RateLimit-Policy item
	label   string // the metrics' rule label, bounded
	metrics ruleMetrics
}

// newLimit makes a Limit of p under name, counted in the metrics under
// label.
func newLimit(name, label string, p *algo.Policy, m *metrics) *Limit {
	s := p.Spec()
	return &Limit{
		Name:   name,
		Policy: p,
		quoted: []byte(`"` + name + `"`),
		item:   []byte(fmt.Sprintf(`"%s";q=%d;w=%d`, name, s.Limit, ceilSeconds(s.Window, 1))),
		label:  label,
		metrics: ruleMetrics{
			allowed:      m.decisions.WithLabelValues(label, "allowed"),
			denied:       m.decisions.WithLabelValues(label, "denied"),
			shadowDenied: m.decisions.WithLabelValues(label, "shadow_denied"),
		},
	}
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
		Help: "Requests decided by the engine (/auth, ext_authz Check, ShouldRateLimit and /json) by result: allowed, denied, unmatched (no rule applied), allowlisted, blocked, invalid (a bad, missing or repeated key or cost header), unavailable (no decision: 503), error.",
	}, []string{"result"})
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_decisions_total",
		Help: "Rule decisions by rule (for ShouldRateLimit, the limit's policy name, or override for every limit Envoy sends) and outcome: allowed, denied, shadow_denied (a shadow rule that would have denied). A rule the deny cache left unasked is not counted.",
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
