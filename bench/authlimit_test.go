package main

// Tests of reading authlimit's health from /metrics.

import "testing"

func TestParseHealth(t *testing.T) {
	tests := []struct {
		name, body string
		want       string // String() of the result, or "error"
	}{
		{"no series yet", "# HELP authlimit_store_errors_total x\n# TYPE authlimit_store_errors_total counter\nauthlimit_decisions_total{result=\"allowed\"} 5\n",
			"authlimit_store_errors_total 0, authlimit_fail_mode_decisions_total 0"},
		{"zero series are not named", "authlimit_store_errors_total{kind=\"timeout\"} 0\n",
			"authlimit_store_errors_total 0, authlimit_fail_mode_decisions_total 0"},
		{"kinds summed and named", "authlimit_store_errors_total{kind=\"timeout\",shard=\"a\"} 3\nauthlimit_store_errors_total{kind=\"closed\",shard=\"a\"} 1\nauthlimit_fail_mode_decisions_total{mode=\"local\"} 4\n",
			`authlimit_store_errors_total 4, authlimit_fail_mode_decisions_total 4 (authlimit_fail_mode_decisions_total{mode="local"} 4, authlimit_store_errors_total{kind="closed",shard="a"} 1, authlimit_store_errors_total{kind="timeout",shard="a"} 3)`},
		{"a label value with a space", "authlimit_store_errors_total{kind=\"a b\"} 2\n",
			`authlimit_store_errors_total 2, authlimit_fail_mode_decisions_total 0 (authlimit_store_errors_total{kind="a b"} 2)`},
		{"no value", "authlimit_store_errors_total\n", "error"},
		{"bad value", "authlimit_store_errors_total{kind=\"timeout\"} many\n", "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := parseHealth(tt.body)
			got := "error"
			if err == nil {
				got = h.String()
			}
			if got != tt.want {
				t.Errorf("parseHealth = %s (err %v), want %s", got, err, tt.want)
			}
		})
	}
}

func TestHealthAdd(t *testing.T) {
	a, _ := parseHealth("authlimit_store_errors_total{kind=\"timeout\"} 3\n")
	b, _ := parseHealth("authlimit_store_errors_total{kind=\"timeout\"} 2\nauthlimit_fail_mode_decisions_total{mode=\"open\"} 1\n")
	var sum authlimitHealth
	if sum.bad() {
		t.Fatal("an empty health is bad")
	}
	sum.add(&a)
	sum.add(&b)
	want := `authlimit_store_errors_total 5, authlimit_fail_mode_decisions_total 1 (authlimit_fail_mode_decisions_total{mode="open"} 1, authlimit_store_errors_total{kind="timeout"} 5)`
	if got := sum.String(); got != want || !sum.bad() {
		t.Errorf("sum = %s (bad %v), want %s", got, sum.bad(), want)
	}
}
