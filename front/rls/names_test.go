package rls

import (
	"strings"
	"testing"
	"time"
)

// TestNamedLimits: a limit with a rate_limit.name goes by it in the
// metrics' rule label and in RateLimit-Policy and RateLimit; one without
// goes by its generated name.
func TestNamedLimits(t *testing.T) {
	e := start(t, memoryStore, `
domain: msg
descriptors:
  - key: to
    rate_limit: {name: per_recipient, unit: hour, requests_per_unit: 1}
  - key: from
    rate_limit: {unit: hour, requests_per_unit: 5}
`)
	awayFromWindowEdge(t, time.Hour, 10*time.Second)
	r := e.ask(t, "msg", desc("to", "+15550100"))
	headers := map[string]string{}
	for _, h := range r.GetResponseHeadersToAdd() {
		headers[h.GetKey()] = h.GetValue()
	}
	if got := headers["RateLimit-Policy"]; got != `"per_recipient";q=1;w=3600` {
		t.Errorf("RateLimit-Policy %q, want the limit's name", got)
	}
	if got := headers["RateLimit"]; !strings.HasPrefix(got, `"per_recipient";r=0;`) {
		t.Errorf("RateLimit %q, want the limit's name", got)
	}
	e.ask(t, "msg", desc("to", "+15550100"))
	e.ask(t, "msg", desc("from", "+15550199"))
	generated := ""
	for _, l := range e.svc.rules.Load().RLS().Limits() {
		if l.Name == "" && l.Policy != nil {
			generated = l.Policy.Name()
		}
	}
	got := e.counters(t)
	for k, v := range map[string]float64{
		"authlimit_decisions_total{outcome=allowed,rule=per_recipient}":     1,
		"authlimit_decisions_total{outcome=denied,rule=per_recipient}":      1,
		"authlimit_decisions_total{outcome=allowed,rule=" + generated + "}": 1,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if strings.Contains(k, "rule=rls_msg_to_") {
			t.Errorf("%s: the named limit counted under its generated name", k)
		}
	}
}
