package ruleset

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/rules"
)

// TestWindowChangeRefused: a fixed_window or sliding_window_counter rule
// keeps its window across a reload, or takes a new name; the other
// algorithms' state means the same under any window.
func TestWindowChangeRefused(t *testing.T) {
	parse := func(text string) []*rules.Rule {
		t.Helper()
		rs, err := rules.Parse(text)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	old := parse("name=a limit=10/1m algorithm=fixed_window; name=b limit=10/1m; name=c limit=10/1m algorithm=gcra; name=d limit=10/1m algorithm=sliding_window_log; " +
		"name=e key=header:K limit=10/1m algorithm=fixed_window tier=header:X-Plan; tier rule=e name=pro limit=20/1m; override rule=e key=k1 limit=30/1m")
	set, err := New(old, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, next, want string
	}{
		{"same windows, new limits", "name=a limit=5/1m algorithm=fixed_window; name=b limit=50/1m", ""},
		{"fixed window longer", "name=a limit=10/1h algorithm=fixed_window", `rule 1 "a": limit: the window changes from 1m0s to 1h0m0s`},
		{"counter shorter", "name=x limit=1/1s; name=b limit=10/1s", `rule 2 "b": limit: the window changes from 1m0s to 1s`},
		{"renamed", "name=a2 limit=10/1h algorithm=fixed_window", ""},
		{"other algorithm, same name", "name=a limit=10/1h algorithm=token_bucket", ""},
		{"gcra and the log take any window", "name=c limit=10/1h algorithm=gcra; name=d limit=10/1h algorithm=sliding_window_log", ""},
		{"a tier's new limit", "name=e key=header:K limit=10/1m algorithm=fixed_window tier=header:X-Plan; tier rule=e name=pro limit=40/1m; override rule=e key=k1 limit=50/1m", ""},
		{"a tier's window", "name=e key=header:K limit=10/1m algorithm=fixed_window tier=header:X-Plan; tier rule=e name=pro limit=20/1h", `rule 1 "e": tier "pro": limit: the window changes from 1m0s to 1h0m0s`},
		{"an override's window", "name=e key=header:K limit=10/1m algorithm=fixed_window; override rule=e key=k1 limit=30/1s", `rule 1 "e": an override: limit: the window changes from 1m0s to 1s`},
		{"a new tier", "name=e key=header:K limit=10/1m algorithm=fixed_window tier=header:X-Plan; tier rule=e name=gold limit=20/1h", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := set.WithRules(parse(tt.next))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("WithRules = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("WithRules = %v, want %q", err, tt.want)
			}
		})
	}
}

// mustRLS parses an envoyproxy/ratelimit configuration.
func mustRLS(t *testing.T, yaml string) *envoyconf.Config {
	t.Helper()
	cfg, err := envoyconf.Parse([]envoyconf.File{{Name: "ratelimit.yaml", Data: []byte(yaml)}})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestUnitChangeRefused: a fixed_window or sliding_window_counter limit of
// the rate-limit configuration keeps its unit across a reload; the other
// algorithms' state means the same under any unit, and a limit the new
// configuration adds takes any.
func TestUnitChangeRefused(t *testing.T) {
	rs, err := rules.Parse("name=r limit=1/1m")
	if err != nil {
		t.Fatal(err)
	}
	limit := func(unit string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: " + unit + ", requests_per_unit: 5}\n"
	}
	set, err := New(rs, mustRLS(t, limit("minute")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.WithRLS(mustRLS(t, strings.Replace(limit("minute"), "5", "9", 1))); err != nil {
		t.Errorf("a new requests_per_unit: %v", err)
	}
	if _, err := set.WithRLS(mustRLS(t, limit("hour"))); err == nil || !strings.Contains(err.Error(), "rate_limit.unit: changes from minute to hour") {
		t.Errorf("a new unit: %v, want refused", err)
	}
	if _, err := set.WithRLS(mustRLS(t, limit("hour")+"  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 1}\n")); err == nil {
		t.Error("a new unit beside a new limit: accepted")
	}
}

// TestSetNumbersEachIdentityOnce: the set numbers the rules' policies (a
// rule's own, its tiers', its overrides') and the rate-limit
// configuration's, densely, each identity once, and a policy rebuilt with
// another limit finds its predecessor's number.
func TestSetNumbersEachIdentityOnce(t *testing.T) {
	rs, err := rules.Parse("name=a key=header:K limit=10/1m tier=header:X-Plan; tier rule=a name=pro limit=20/1m; override rule=a key=k1 limit=30/1m; name=b limit=5/1m")
	if err != nil {
		t.Fatal(err)
	}
	cfg := mustRLS(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	set, err := New(rs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var want []*algo.Policy
	for _, r := range rs {
		want = append(want, r.Policies()...)
	}
	want = append(want, cfg.Policies()...)
	if got := set.Policies(); !slices.Equal(got, want) {
		t.Fatalf("Policies() = %d policies, want %d", len(got), len(want))
	}
	for i, p := range want {
		if n, ok := set.Index(p); !ok || n != i {
			t.Errorf("Index(%s) = %d, %v; want %d", p.Name(), n, ok, i)
		}
	}
	again, err := rules.Parse("name=b limit=50/1m")
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := set.Index(again[0].Policy); !ok || n != len(rs[0].Policies()) {
		t.Errorf("Index of b rebuilt with another limit = %d, %v; want its predecessor's %d", n, ok, len(rs[0].Policies()))
	}
	other, err := algo.NewPolicy(algo.Spec{Name: "b", Algorithm: algo.TokenBucket, Limit: 5, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := set.Index(other); ok {
		t.Error("Index of b under another algorithm: found, want another identity")
	}
	if _, err := New(nil, nil); err == nil {
		t.Error("New without rules: accepted")
	}
}
