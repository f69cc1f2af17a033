package algo

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestNewPolicyRejectsBadInput(t *testing.T) {
	ok := Spec{Name: "ok", Algorithm: TokenBucket, Limit: 10, Window: time.Second}
	with := func(f func(*Spec)) Spec { s := ok; f(&s); return s }
	tests := []struct {
		name  string
		spec  Spec
		field string
		msg   string
	}{
		{"zero limit", with(func(s *Spec) { s.Limit = 0 }), "limit", "0 is not positive"},
		{"negative limit", with(func(s *Spec) { s.Limit = -5 }), "limit", "-5 is not positive"},
		{"limit 2^62", with(func(s *Spec) { s.Limit = 1 << 62 }), "limit", "above the maximum"},
		{"zero window", with(func(s *Spec) { s.Window = 0 }), "window", "shorter than the minimum"},
		{"negative window", with(func(s *Spec) { s.Window = -time.Second }), "window", "shorter than the minimum"},
		{"window 1ns", with(func(s *Spec) { s.Window = time.Nanosecond }), "window", "shorter than the minimum 1ms"},
		{"window 10 years", with(func(s *Spec) { s.Window = 10 * 365 * 24 * time.Hour }), "window", "longer than the maximum"},
		{"window with nanoseconds", with(func(s *Spec) { s.Window = time.Second + time.Nanosecond }), "window", "whole number of microseconds"},
		{"negative burst", with(func(s *Spec) { s.Burst = -1 }), "burst", "-1 is not positive"},
		{"burst 2^62", with(func(s *Spec) { s.Burst = 1 << 62 }), "burst", "above the maximum"},
		{"burst on fixed_window", with(func(s *Spec) { s.Algorithm, s.Burst = FixedWindow, 5 }), "burst", "fixed_window has no burst"},
		{"negative cost", with(func(s *Spec) { s.Cost = -1 }), "cost", "-1 is not positive"},
		{"cost 2^62", with(func(s *Spec) { s.Cost = 1 << 62 }), "cost", "above the maximum"},
		{"delay on gcra", with(func(s *Spec) { s.Algorithm, s.Delay = GCRA, time.Second }), "delay", "only leaky_bucket"},
		{"negative delay", with(func(s *Spec) { s.Algorithm, s.Delay = LeakyBucket, -time.Second }), "delay", "negative"},
		{"delay of an hour", with(func(s *Spec) { s.Algorithm, s.Delay = LeakyBucket, time.Hour }), "delay", "longer than the maximum"},
		{"no algorithm", with(func(s *Spec) { s.Algorithm = 0 }), "algorithm", "not an algorithm"},
		{"unknown algorithm", with(func(s *Spec) { s.Algorithm = 99 }), "algorithm", "not an algorithm"},
		{"empty name", with(func(s *Spec) { s.Name = "" }), "name", "empty"},
		{"name with a brace", with(func(s *Spec) { s.Name = "a{b}" }), "name", `contains '{'`},
		{"upper-case name", with(func(s *Spec) { s.Name = "Login" }), "name", `contains 'L'`},
		{"long name", with(func(s *Spec) { s.Name = strings.Repeat("a", 65) }), "name", "65 bytes long"},
		{"a burst that takes 10^12 years to refill", with(func(s *Spec) { s.Limit, s.Window, s.Burst = 1, MaxWindow, MaxLimit }), "burst", "longer than"},
		{"a gcra burst of 11 at 1 a year", with(func(s *Spec) { s.Algorithm, s.Limit, s.Window, s.Burst = GCRA, 1, MaxWindow, 11 }), "burst", "to refill"},
		{"a fixed cost above the limit", with(func(s *Spec) { s.Algorithm, s.Limit, s.Cost = FixedWindow, 10, 20 }), "cost", "more than the policy ever admits"},
		{"a fixed cost above the burst", with(func(s *Spec) { s.Burst, s.Cost = 3, 4 }), "cost", "more than the policy ever admits"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewPolicy(tc.spec)
			if err == nil {
				t.Fatalf("NewPolicy(%+v) = %+v, want an error about %s", tc.spec, r, tc.field)
			}
			var re *SpecError
			if !errors.As(err, &re) {
				t.Fatalf("NewRule error %v is not a *SpecError", err)
			}
			if re.Field != tc.field {
				t.Errorf("error field = %q, want %q (%v)", re.Field, tc.field, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestNewPolicyReportsEveryProblem(t *testing.T) {
	_, err := NewPolicy(Spec{Name: "x", Algorithm: FixedWindow, Limit: 0, Window: 0, Burst: 3})
	for _, field := range []string{"limit:", "window:", "burst:"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("NewPolicy error %v does not name %s", err, field)
		}
	}
}

func TestNewPolicyAcceptsExtremesWithinBounds(t *testing.T) {
	for _, a := range Algorithms() {
		for _, s := range []Spec{
			{Limit: 1, Window: MinWindow},
			{Limit: MaxLimit, Window: MinWindow},
			{Limit: MaxLimit, Window: MaxWindow},
			{Limit: 1, Window: MaxWindow},
			{Limit: MaxLimit, Window: MinWindow, Delay: MaxDelay},
			{Limit: 1, Window: MaxWindow, Cost: 1},
		} {
			s.Name, s.Algorithm = "x", a
			if a != LeakyBucket {
				s.Delay = 0
			}
			r, err := NewPolicy(s)
			if err != nil {
				t.Errorf("NewPolicy(%+v): %v", s, err)
				continue
			}
			if r.MaxCost() < r.Capacity() || r.MaxCost() > MaxLimit {
				t.Errorf("%s %+v: MaxCost %d, want between Capacity %d and 2^50", a, s, r.MaxCost(), r.Capacity())
			}
			// A decision at the extremes stays sane: the first request
			// of cost 1 passes, one of the most the policy admits passes
			// on a fresh key, a request above it is refused.
			m := NewMemory(MemoryOptions{SweepInterval: -1})
			res := decideOne(t, m, Request{Policy: r, Key: []byte("k")})
			if !res.Allowed || res.Remaining != r.Capacity()-1 {
				t.Errorf("%s %+v: first request = %+v, want allowed with %d remaining", a, s, res, r.Capacity()-1)
			}
			if res := decideOne(t, m, Request{Policy: r, Key: []byte("fresh"), Cost: r.MaxCost()}); !res.Allowed {
				t.Errorf("%s %+v: a request of MaxCost %d on a fresh key = %+v, want allowed", a, s, r.MaxCost(), res)
			}
			if r.MaxCost() < MaxLimit {
				if res := decideOne(t, m, Request{Policy: r, Key: []byte("fresh2"), Cost: r.MaxCost() + 1}); res.Reason != ReasonCostTooHigh {
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
	for _, a := range Algorithms() {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
	}
	if _, err := ParseAlgorithm("leaky"); err == nil || !strings.Contains(err.Error(), "token_bucket") {
		t.Errorf("ParseAlgorithm(leaky) error = %v, want one listing the algorithms", err)
	}
}

func TestDecideRejectsBadRequests(t *testing.T) {
	clock := newFakeClock(epoch)
	for _, st := range bothStores(t, clock) {
		a := mustPolicy(t, Spec{Name: "a", Algorithm: FixedWindow, Limit: 5, Window: time.Second})
		tests := []struct {
			name string
			reqs []Request
			res  int
		}{
			{"no requests", nil, 0},
			{"negative cost", []Request{{Policy: a, Key: []byte("k"), Cost: -1}}, 1},
			{"cost 2^62", []Request{{Policy: a, Key: []byte("k"), Cost: 1 << 62}}, 1},
			{"short result slice", []Request{{Policy: a, Key: []byte("k")}}, 0},
			{"nil policy", []Request{{Key: []byte("k")}}, 1},
			{"policy twice for one key", []Request{{Policy: a, Key: []byte("k")}, {Policy: a, Key: []byte("j")}, {Policy: a, Key: []byte("k")}}, 3},
			{"a key that is not a tag", []Request{{Policy: a, Key: []byte("{k}")}}, 1},
			{"an empty key", []Request{{Policy: a, Key: nil}}, 1},
			{"too many rules", make([]Request, MaxRules+1), MaxRules + 1},
		}
		for _, tc := range tests {
			t.Run(st.name+"/"+tc.name, func(t *testing.T) {
				_, err := st.store.Decide(context.Background(), tc.reqs, make([]Result, tc.res))
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("Decide = %v, want an error wrapping ErrInvalid", err)
				}
			})
		}
	}
}
