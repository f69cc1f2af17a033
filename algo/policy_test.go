package algo_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

func TestNewPolicyRejectsBadInput(t *testing.T) {
	ok := algo.Spec{Name: "ok", Algorithm: algo.TokenBucket, Limit: 10, Window: time.Second}
	with := func(f func(*algo.Spec)) algo.Spec { s := ok; f(&s); return s }
	tests := []struct {
		name  string
		spec  algo.Spec
		field string
		msg   string
	}{
		{"zero limit", with(func(s *algo.Spec) { s.Limit = 0 }), "limit", "0 is not positive"},
		{"negative limit", with(func(s *algo.Spec) { s.Limit = -5 }), "limit", "-5 is not positive"},
		{"limit 2^62", with(func(s *algo.Spec) { s.Limit = 1 << 62 }), "limit", "above the maximum"},
		{"zero window", with(func(s *algo.Spec) { s.Window = 0 }), "window", "shorter than the minimum"},
		{"negative window", with(func(s *algo.Spec) { s.Window = -time.Second }), "window", "shorter than the minimum"},
		{"window 1ns", with(func(s *algo.Spec) { s.Window = time.Nanosecond }), "window", "shorter than the minimum 1ms"},
		{"window 10 years", with(func(s *algo.Spec) { s.Window = 10 * 365 * 24 * time.Hour }), "window", "longer than the maximum"},
		{"window with nanoseconds", with(func(s *algo.Spec) { s.Window = time.Second + time.Nanosecond }), "window", "whole number of microseconds"},
		{"negative burst", with(func(s *algo.Spec) { s.Burst = -1 }), "burst", "-1 is not positive"},
		{"burst 2^62", with(func(s *algo.Spec) { s.Burst = 1 << 62 }), "burst", "above the maximum"},
		{"burst on fixed_window", with(func(s *algo.Spec) { s.Algorithm, s.Burst = algo.FixedWindow, 5 }), "burst", "fixed_window has no burst"},
		{"negative cost", with(func(s *algo.Spec) { s.Cost = -1 }), "cost", "-1 is not positive"},
		{"cost 2^62", with(func(s *algo.Spec) { s.Cost = 1 << 62 }), "cost", "above the maximum"},
		{"delay on gcra", with(func(s *algo.Spec) { s.Algorithm, s.Delay = algo.GCRA, time.Second }), "delay", "only leaky_bucket"},
		{"negative delay", with(func(s *algo.Spec) { s.Algorithm, s.Delay = algo.LeakyBucket, -time.Second }), "delay", "negative"},
		{"delay of an hour", with(func(s *algo.Spec) { s.Algorithm, s.Delay = algo.LeakyBucket, time.Hour }), "delay", "longer than the maximum"},
		{"no algorithm", with(func(s *algo.Spec) { s.Algorithm = 0 }), "algorithm", "not an algorithm"},
		{"unknown algorithm", with(func(s *algo.Spec) { s.Algorithm = 99 }), "algorithm", "not an algorithm"},
		{"empty name", with(func(s *algo.Spec) { s.Name = "" }), "name", "empty"},
		{"name with a brace", with(func(s *algo.Spec) { s.Name = "a{b}" }), "name", `contains '{'`},
		{"upper-case name", with(func(s *algo.Spec) { s.Name = "Login" }), "name", `contains 'L'`},
		{"long name", with(func(s *algo.Spec) { s.Name = strings.Repeat("a", 65) }), "name", "65 bytes long"},
		{"a burst that takes 10^12 years to refill", with(func(s *algo.Spec) { s.Limit, s.Window, s.Burst = 1, algo.MaxWindow, algo.MaxLimit }), "burst", "longer than"},
		{"a gcra burst of 11 at 1 a year", with(func(s *algo.Spec) { s.Algorithm, s.Limit, s.Window, s.Burst = algo.GCRA, 1, algo.MaxWindow, 11 }), "burst", "to refill"},
		{"a fixed cost above the limit", with(func(s *algo.Spec) { s.Algorithm, s.Limit, s.Cost = algo.FixedWindow, 10, 20 }), "cost", "more than the policy ever admits"},
		{"a fixed cost above the burst", with(func(s *algo.Spec) { s.Burst, s.Cost = 3, 4 }), "cost", "more than the policy ever admits"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := algo.NewPolicy(tc.spec)
			if err == nil {
				t.Fatalf("NewPolicy(%+v) = %+v, want an error about %s", tc.spec, r, tc.field)
			}
			var re *algo.SpecError
			if !errors.As(err, &re) {
				t.Fatalf("NewRule error %v is not a *SpecError", err)
			}
			if re.Field != tc.field {
				t.Errorf("error field = %q, want %q (%v)", re.Field, tc.field, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
			if !errors.Is(err, algo.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestNewPolicyReportsEveryProblem(t *testing.T) {
	_, err := algo.NewPolicy(algo.Spec{Name: "x", Algorithm: algo.FixedWindow, Limit: 0, Window: 0, Burst: 3})
	for _, field := range []string{"limit:", "window:", "burst:"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("NewPolicy error %v does not name %s", err, field)
		}
	}
}

func TestNewPolicyAcceptsExtremesWithinBounds(t *testing.T) {
	for _, a := range algo.Algorithms() {
		for _, s := range []algo.Spec{
			{Limit: 1, Window: algo.MinWindow},
			{Limit: algo.MaxLimit, Window: algo.MinWindow},
			{Limit: algo.MaxLimit, Window: algo.MaxWindow},
			{Limit: 1, Window: algo.MaxWindow},
			{Limit: algo.MaxLimit, Window: algo.MinWindow, Delay: algo.MaxDelay},
			{Limit: 1, Window: algo.MaxWindow, Cost: 1},
		} {
			s.Name, s.Algorithm = "x", a
			if a != algo.LeakyBucket {
				s.Delay = 0
			}
			r, err := algo.NewPolicy(s)
			if err != nil {
				t.Errorf("NewPolicy(%+v): %v", s, err)
				continue
			}
			if r.MaxCost() < r.Capacity() || r.MaxCost() > algo.MaxLimit {
				t.Errorf("%s %+v: MaxCost %d, want between Capacity %d and 2^50", a, s, r.MaxCost(), r.Capacity())
			}
			// A decision at the extremes stays sane: the first request
			// of cost 1 passes, one of the most the policy admits passes
			// on a fresh key, a request above it is refused.
			m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
			res := algotest.DecideOne(t, m, algo.Request{Policy: r, Key: []byte("k")})
			if !res.Allowed || res.Remaining != r.Capacity()-1 {
				t.Errorf("%s %+v: first request = %+v, want allowed with %d remaining", a, s, res, r.Capacity()-1)
			}
			if res := algotest.DecideOne(t, m, algo.Request{Policy: r, Key: []byte("fresh"), Cost: r.MaxCost()}); !res.Allowed {
				t.Errorf("%s %+v: a request of MaxCost %d on a fresh key = %+v, want allowed", a, s, r.MaxCost(), res)
			}
			if r.MaxCost() < algo.MaxLimit {
				if res := algotest.DecideOne(t, m, algo.Request{Policy: r, Key: []byte("fresh2"), Cost: r.MaxCost() + 1}); res.Reason != algo.ReasonCostTooHigh {
					t.Errorf("%s %+v: a request above MaxCost = %+v, want cost too high", a, s, res)
				}
			}
			if res.ResetAfter < 0 || res.RetryAfter < 0 {
				t.Errorf("%s %+v: negative durations %+v", a, s, res)
			}
			_ = m.Close()
		}
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, a := range algo.Algorithms() {
		got, err := algo.ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
	}
	if _, err := algo.ParseAlgorithm("leaky"); err == nil || !strings.Contains(err.Error(), "token_bucket") {
		t.Errorf("ParseAlgorithm(leaky) error = %v, want one listing the algorithms", err)
	}
}
