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
			_, err := NewHolder(set).WithRules(parse(tt.next), time.Now())
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
	h := NewHolder(set)
	now := time.Now()
	if _, err := h.WithRLS(mustRLS(t, strings.Replace(limit("minute"), "5", "9", 1)), now); err != nil {
		t.Errorf("a new requests_per_unit: %v", err)
	}
	if _, err := h.WithRLS(mustRLS(t, limit("hour")), now); err == nil || !strings.Contains(err.Error(), "rate_limit.unit: changes from minute to hour") {
		t.Errorf("a new unit: %v, want refused", err)
	}
	if _, err := h.WithRLS(mustRLS(t, limit("hour")+"  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), now); err == nil {
		t.Error("a new unit beside a new limit: accepted")
	}
}

// TestWindowChangeNotSlippedThrough: a window change is refused while
// state of the old window may live, whatever the reloads between: another
// algorithm, or no such rule, and back with a new window. Once two old
// windows have passed, the state is gone and the new window is taken.
func TestWindowChangeNotSlippedThrough(t *testing.T) {
	parse := func(text string) []*rules.Rule {
		t.Helper()
		rs, err := rules.Parse(text)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, between := range []string{"name=a limit=10/1m algorithm=token_bucket", "name=other limit=10/1m"} {
		t.Run(between, func(t *testing.T) {
			first, err := New(parse("name=a limit=10/1m algorithm=fixed_window"), nil)
			if err != nil {
				t.Fatal(err)
			}
			h := NewHolder(first)
			mid, err := h.WithRules(parse(between), now)
			if err != nil {
				t.Fatalf("%s: %v", between, err)
			}
			h.Store(mid, now)
			back := parse("name=a limit=10/1h algorithm=fixed_window")
			_, err = h.WithRules(back, now.Add(time.Minute))
			if err == nil || !strings.Contains(err.Error(), "the window changes from 1m0s to 1h0m0s") || !strings.Contains(err.Error(), "2026-03-01T12:02:00Z") {
				t.Fatalf("back with a 1h window a minute later: %v, want refused until 12:02", err)
			}
			if _, err := h.WithRules(parse("name=a limit=99/1m algorithm=fixed_window"), now.Add(time.Minute)); err != nil {
				t.Errorf("back with the same window: %v, want taken (its counts carry over)", err)
			}
			if _, err := h.WithRules(back, now.Add(2*time.Minute)); err != nil {
				t.Errorf("back with a 1h window once two minutes passed: %v, want taken", err)
			}
		})
	}
}

// TestRLSUnitChangeNotSlippedThrough: a limit's unit change is refused
// while counts of the old unit may live, even with another algorithm in
// between.
func TestRLSUnitChangeNotSlippedThrough(t *testing.T) {
	cfg := func(rl string) *envoyconf.Config {
		t.Helper()
		return mustRLS(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: "+rl+"}\n")
	}
	rs, err := rules.Parse("name=r limit=1/1m")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	first, err := New(rs, cfg("{unit: minute, requests_per_unit: 5}"))
	if err != nil {
		t.Fatal(err)
	}
	h := NewHolder(first)
	mid, err := h.WithRLS(cfg("{unit: minute, requests_per_unit: 5, algorithm: gcra}"), now)
	if err != nil {
		t.Fatalf("to gcra: %v", err)
	}
	h.Store(mid, now)
	back := cfg("{unit: hour, requests_per_unit: 5}")
	if _, err := h.WithRLS(back, now.Add(time.Minute)); err == nil || !strings.Contains(err.Error(), "rate_limit.unit: changes from 1m0s to hour") {
		t.Errorf("back to fixed_window by the hour: %v, want refused", err)
	}
	if _, err := h.WithRLS(back, now.Add(2*time.Minute)); err != nil {
		t.Errorf("back to fixed_window by the hour, two minutes on: %v, want taken", err)
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

// TestLimitNamedAsARule: a rate-limit service's limit named as a rule
// would merge their metrics: a set with both is refused, at start and on a
// reload of either, naming the limit and the name.
func TestLimitNamedAsARule(t *testing.T) {
	rs, err := rules.Parse("name=per_key key=ip limit=1/1m")
	if err != nil {
		t.Fatal(err)
	}
	clash := mustRLS(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: per_key, unit: hour, requests_per_unit: 1}\n")
	const want = `limit d.k is named "per_key", as a rule is`
	if _, err := New(rs, clash); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("New = %v, want %q", err, want)
	}
	other := mustRLS(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: per_other, unit: hour, requests_per_unit: 1}\n")
	set, err := New(rs, other)
	if err != nil {
		t.Fatalf("New without a clash: %v", err)
	}
	if _, err := NewHolder(set).WithRLS(clash, time.Now()); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("WithRLS = %v, want %q", err, want)
	}
	renamed, err := rules.Parse("name=per_other key=ip limit=1/1m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewHolder(set).WithRules(renamed, time.Now()); err == nil || !strings.Contains(err.Error(), `limit d.k is named "per_other", as a rule is`) {
		t.Errorf("WithRules = %v, want the clash refused", err)
	}
}
