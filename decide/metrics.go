package decide

import (
	"fmt"
	"regexp"
	"time"

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
// come from configuration, front names from the code, every other label
// from a fixed set; nothing is labelled by key or client.
type metrics struct {
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	decisions *prometheus.CounterVec
	delay     prometheus.Histogram
}

type ruleMetrics struct {
	allowed, denied, shadowDenied prometheus.Counter
}

// resultOf is the result label of authlimit_requests_total for each
// verdict: a request the fail mode admitted counts as allowed.
var resultOf = [...]string{
	Allow:       "allowed",
	Deny:        "denied",
	Invalid:     "invalid",
	Blocked:     "blocked",
	Unavailable: "unavailable",
	FailedOpen:  "allowed",
	Unmatched:   "unmatched",
	Allowlisted: "allowlisted",
	Failed:      "error",
}

// requestBuckets span a decision answered from memory (tens of
// microseconds) to one that waited out a long store budget.
var requestBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_requests_total",
		Help: "Requests decided by the engine, by front (http: /auth; extauthz: ext_authz Check; rls: ShouldRateLimit; json: /json; and any other front) and result: allowed, denied, unmatched (no rule applied), allowlisted, blocked, invalid (a bad, missing or repeated key or cost header), unavailable (no decision: 503), error.",
	}, []string{"front", "result"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "authlimit_request_duration_seconds",
		Help:    "Time the engine took to answer a request, by front: from the request read to its answer ready, the store's decision included, a shaping delay not.",
		Buckets: requestBuckets,
	}, []string{"front"})
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_decisions_total",
		Help: "Rule decisions by rule (for ShouldRateLimit, the limit's name, or override for every limit Envoy sends) and outcome: allowed, denied, shadow_denied (a shadow rule that would have denied). A rule the deny cache left unasked is not counted.",
	}, []string{"rule", "outcome"})
	delay := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "authlimit_shaping_delay_seconds",
		Help:    "How long admitted requests were held by shaping leaky buckets.",
		Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	})
	for _, c := range []prometheus.Collector{requests, duration, decisions, delay} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("decide metrics: %w", err)
		}
	}
	return &metrics{requests: requests, duration: duration, decisions: decisions, delay: delay}, nil
}

// Front is a front as the metrics name it: authlimit_requests_total and
// authlimit_request_duration_seconds count its requests under its name.
// A front gets its own from Engine.Front once, and sets it in every
// Outcome it decides with (Outcome.Front).
type Front struct {
	name     string
	results  [len(resultOf)]prometheus.Counter // by Verdict
	duration prometheus.Observer
}

// Name is the front's name, its front label; "unknown" for a nil Front.
func (f *Front) Name() string {
	if f == nil {
		return unknownFront
	}
	return f.name
}

// frontName is what a front may be called: a label value a query can
// name without quoting trouble.
var frontName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// unknownFront names the requests of an Outcome without a Front.
const unknownFront = "unknown"

// Front returns the Front named name (http, extauthz, rls, json, …),
// made on first use: asking again for a name returns the same Front.
func (e *Engine) Front(name string) (*Front, error) {
	if !frontName.MatchString(name) {
		return nil, fmt.Errorf("decide: front name %q: want [a-z][a-z0-9_]*, at most 32 characters", name)
	}
	e.frontsMu.Lock()
	defer e.frontsMu.Unlock()
	if f, ok := e.fronts[name]; ok {
		return f, nil
	}
	f := &Front{name: name, duration: e.metrics.duration.WithLabelValues(name)}
	for v, r := range resultOf {
		f.results[v] = e.metrics.requests.WithLabelValues(name, r)
	}
	e.fronts[name] = f
	return f, nil
}

// done ends a decision that began at start: it finishes o and counts it
// under its front.
func (e *Engine) done(o *Outcome, start time.Time) {
	o.finish()
	f := o.Front
	if f == nil {
		f, _ = e.Front(unknownFront) // a valid name: no error
	}
	if int(o.Verdict) < len(f.results) {
		f.results[o.Verdict].Inc()
	}
	f.duration.Observe(e.clock().Sub(start).Seconds())
}
