package decide

import (
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/rules"
)

// Verdict is what the engine decided.
type Verdict uint8

// The verdicts.
const (
	// Allow: the rules that applied admitted the request.
	Allow Verdict = iota
	// Deny: a rule denied it: rate-limited, or it costs more than a rule
	// ever admits (Outcome.Kind says which).
	Deny
	// Invalid: a key or cost header is missing, repeated or malformed, or
	// the front could not read the request (Input.Invalid).
	Invalid
	// Blocked: the client address is on the block list.
	Blocked
	// Unavailable: the store could not decide and the fail mode does not
	// admit; answer 503 with Retry-After.
	Unavailable
	// FailedOpen: the store could not decide and the fail mode admits.
	FailedOpen
	// Unmatched: no rule applied.
	Unmatched
	// Allowlisted: the client address is on the allow list.
	Allowlisted
	// Failed: the decision failed for another reason; answer 500.
	Failed
)

var verdictNames = [...]string{"allow", "deny", "invalid", "blocked", "unavailable", "failed-open", "unmatched", "allowlisted", "failed"}

// String names the verdict.
func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "unknown"
}

// Admitted reports whether the request may pass.
func (v Verdict) Admitted() bool {
	return v == Allow || v == FailedOpen || v == Unmatched || v == Allowlisted
}

// Result is one applied rule's answer.
type Result struct {
	// Rule is the rule, from the set the request was decided under; nil
	// for DecideLimits.
	Rule *rules.Rule
	// Limit is the rule's limit, or the one given to DecideLimits.
	Limit *Limit
	// Shadow: the rule was decided as a shadow rule (its own setting or
	// the engine's), so its denial denied nothing.
	Shadow bool
	// Cost is what the request cost under the rule.
	Cost int64
	algo.Result
}

// Header is a response header the front writes, name as documented.
// Neither slice may be modified; both are valid until the Outcome is
// reused.
type Header struct {
	Name, Value []byte
}

// Outcome is the engine's answer to one request. The zero value is ready
// to use; reusing one (a front pools them) keeps a decision free of
// allocations. Everything in it is valid until it is passed to Decide
// again.
type Outcome struct {
	// Verdict is what was decided.
	Verdict Verdict
	// Status is the HTTP status to answer: 200 when admitted, the deny
	// status, 503 when unavailable, 500 when the decision failed.
	Status int
	// Kind is the problem's kind (urn:authlimit:<Kind>): rate-limited,
	// cost-too-high, blocked, invalid-url, missing-key, missing-cost,
	// repeated-header, invalid-cost, unavailable or error (and, from
	// DecideLimits, too-many-limits or no-limit); empty when admitted.
	// Detail says it in a sentence.
	Kind, Detail string
	// Results holds the answer of every rule that was decided, in rule
	// order; empty when none was (a refusal before the store, an
	// unmatched request, a fail mode).
	Results []Result
	// Most is the index in Results of the most restrictive enforcing
	// rule, the one the rate-limit headers describe; -1 when none.
	Most int
	// RetryAfter is the Retry-After value in seconds; 0 when there is
	// none.
	RetryAfter int64
	// Delay is how long the front holds an admitted request before
	// answering (a shaping leaky bucket).
	Delay time.Duration
	// Headers are the headers to answer with: RateLimit-Policy,
	// X-RateLimit-Limit, -Remaining and -Reset, and RateLimit for the most
	// restrictive enforcing rule, then Retry-After, each when it applies,
	// in that order.
	Headers []Header
	// Body is the application/problem+json body (RFC 9457) of a request
	// that is not admitted; empty otherwise.
	Body []byte
	// Front is the front deciding with this Outcome (Engine.Front), under
	// whose name the metrics count its requests. A front sets it once;
	// deciding keeps it. Without one, requests count under the front
	// "unknown".
	Front *Front

	reqs   []algo.Request
	res    []algo.Result
	limits []*Limit      // reqs[i] decides limits[i]
	ruleOf []*rules.Rule // of the rule it comes from, if any
	spans  []span        // reqs[i].Key is tags[spans[i]]
	keys   []byte        // the rules' keys, one at a time
	tags   []byte        // the keys' tags
	hbuf   []byte        // the headers' values
	hspans []hspan
	hdrs   [6]Header

	// What the Observer is told of the request (see seen), and the one
	// Decision it is handed.
	client       netip.Addr
	method, path []byte
	obs          Decision

	// whole asks a WholeDecider for every result (DecideLimits).
	whole bool

	// An asynchronous decision's (see Engine.DecideAsync).
	eng  *Engine
	now  time.Time
	then Then
}

type span struct{ from, to int }

type hspan struct {
	name     []byte
	from, to int
}

// The response headers' names as written.
var (
	rateLimitPolicy     = []byte("RateLimit-Policy")
	rateLimit           = []byte("RateLimit")
	xRateLimitLimit     = []byte("X-RateLimit-Limit")
	xRateLimitRemaining = []byte("X-RateLimit-Remaining")
	xRateLimitReset     = []byte("X-RateLimit-Reset")
	retryAfter          = []byte("Retry-After")
)

// HeaderName is the name of one of an outcome's Headers as a string,
// without an allocation for the names the engine writes: for fronts whose
// answers carry names as strings (Envoy's gRPC messages).
func HeaderName(b []byte) string {
	switch string(b) {
	case "RateLimit-Policy":
		return "RateLimit-Policy"
	case "RateLimit":
		return "RateLimit"
	case "X-RateLimit-Limit":
		return "X-RateLimit-Limit"
	case "X-RateLimit-Remaining":
		return "X-RateLimit-Remaining"
	case "X-RateLimit-Reset":
		return "X-RateLimit-Reset"
	case "Retry-After":
		return "Retry-After"
	}
	return string(b)
}

func (o *Outcome) reset() {
	o.Verdict, o.Status, o.Kind, o.Detail = Allow, http.StatusOK, "", ""
	o.Results, o.Most, o.RetryAfter, o.Delay = o.Results[:0], -1, 0, 0
	o.whole = false
	o.Headers, o.Body = o.hdrs[:0], o.Body[:0]
	o.reqs, o.limits, o.ruleOf, o.spans, o.tags = o.reqs[:0], o.limits[:0], o.ruleOf[:0], o.spans[:0], o.tags[:0]
	o.hbuf, o.hspans = o.hbuf[:0], o.hspans[:0]
	o.client, o.method, o.path = netip.Addr{}, nil, nil
}

// addHeader adds a header whose value was appended to o.hbuf: b is o.hbuf
// with the value appended.
func (o *Outcome) addHeader(name, b []byte) {
	o.hspans = append(o.hspans, hspan{name, len(o.hbuf), len(b)})
	o.hbuf = b
}

// finish points Headers at the values, once o.hbuf has stopped growing.
func (o *Outcome) finish() {
	for _, s := range o.hspans {
		o.Headers = append(o.Headers, Header{Name: s.name, Value: o.hbuf[s.from:s.to:s.to]})
	}
}

// setHeaders works out X-RateLimit-* and RateLimit for the most restrictive
// enforcing rule, and RateLimit-Policy for every enforcing rule applied.
// Shadow rules stay out of the headers: they do not limit the client.
func (o *Outcome) setHeaders(admitted bool, now time.Time) {
	most := -1
	b := o.hbuf
	from := len(b)
	for i := range o.Results {
		r := &o.Results[i]
		if r.Shadow {
			continue
		}
		if len(b) > from {
			b = append(b, ", "...)
		}
		b = append(b, o.limits[i].item...)
		if most < 0 || moreRestrictive(r.Result, o.Results[most].Result, admitted) {
			most = i
		}
	}
	if most < 0 {
		return
	}
	o.Most = most
	o.addHeader(rateLimitPolicy, b)
	r := o.Results[most].Result
	o.addHeader(xRateLimitLimit, strconv.AppendInt(o.hbuf, r.Limit, 10))
	o.addHeader(xRateLimitRemaining, strconv.AppendInt(o.hbuf, r.Remaining, 10))
	o.addHeader(xRateLimitReset, strconv.AppendInt(o.hbuf, ceilSeconds(time.Duration(now.UnixNano())+r.ResetAfter, 0), 10))
	b = append(o.hbuf, o.limits[most].quoted...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, r.Remaining, 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, ceilSeconds(r.ResetAfter, 0), 10)
	o.addHeader(rateLimit, b)
}

// moreRestrictive orders rules for the headers: on a denial, a denying rule
// over an allowing one, then one that never admits the request over one
// that makes it wait, then the longer wait; otherwise fewer remaining, then
// the later reset.
func moreRestrictive(a, b algo.Result, admitted bool) bool {
	if !admitted && a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if never := algo.ReasonCostTooHigh; !admitted && (a.Reason == never) != (b.Reason == never) {
		return a.Reason == never
	}
	if !admitted && !a.Allowed && a.RetryAfter != b.RetryAfter {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}

// refuse answers with a problem that names no rule.
func (o *Outcome) refuse(v Verdict, status int, kind, detail string) {
	o.Verdict, o.Status, o.Kind, o.Detail = v, status, kind, detail
	o.Body = o.appendProblem(o.Body[:0], false)
}

// deny answers a denial by the rules: the problem names the violated ones,
// those that denied and are not shadows.
func (o *Outcome) deny(status int, kind, detail string) {
	o.Verdict, o.Status, o.Kind, o.Detail = Deny, status, kind, detail
	o.Body = o.appendProblem(o.Body[:0], true)
}

// appendProblem appends the application/problem+json body (RFC 9457),
// listing the violated rules if asked to.
func (o *Outcome) appendProblem(b []byte, violated bool) []byte {
	b = append(b, `{"type":"urn:authlimit:`...)
	b = append(b, o.Kind...)
	b = append(b, `","title":"`...)
	b = append(b, statusText(o.Status)...)
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(o.Status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, o.Detail)
	if violated {
		b = append(b, `,"violated-policies":[`...)
		first := true
		for i, r := range o.Results {
			if r.Allowed || r.Shadow {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = append(b, o.limits[i].quoted...)
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...)
}

// statusText is a status's reason phrase, for the problem's title.
func statusText(status int) string {
	if t := http.StatusText(status); t != "" {
		return t
	}
	return "Unknown Status Code"
}

// appendJSONString quotes s for JSON; rule and header names are ASCII
// tokens, but detail may carry anything.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c >= 0x7f:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
