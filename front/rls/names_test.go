package rls

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
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
	for _, l := range e.svc.config.Limits() {
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

// TestLimitNamedAsARule: a limit named as one of /auth's rules would merge
// their metrics: the service refuses it, and the engine refuses rules
// named as a live limit.
func TestLimitNamedAsARule(t *testing.T) {
	cfg := parseConfig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: default, unit: hour, requests_per_unit: 1}\n")
	m := algo.NewMemory(algo.MemoryOptions{})
	t.Cleanup(func() { _ = m.Close() })
	g, err := guard.New(guard.Options{Store: m, Policies: cfg.Policies()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	reg := prometheus.NewRegistry()
	eng := newEngine(t, g, reg, false) // its rule is named "default"
	if _, err := New(Options{Config: cfg, Engine: eng, Registry: reg}); err == nil || !strings.Contains(err.Error(), `named "default", as a rule is`) {
		t.Errorf("New with a limit named as a rule: %v, want it refused", err)
	}

	cfg = parseConfig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: per_key, unit: hour, requests_per_unit: 1}\n")
	if _, err := New(Options{Config: cfg, Engine: eng, Registry: prometheus.NewRegistry()}); err != nil {
		t.Fatalf("New: %v", err)
	}
	rs, err := rules.Parse("name=per_key key=ip limit=1/1m")
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.SetRules(rs); err == nil || !strings.Contains(err.Error(), `rule "per_key" has the name of a limit`) {
		t.Errorf("SetRules with a rule named as a limit: %v, want it refused", err)
	}
}
