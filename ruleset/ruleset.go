// Package ruleset is the configuration authlimit decides under, as one
// immutable value: the rules, envoyproxy/ratelimit's configuration for the
// rate-limit service, and every policy they decide, each identity once,
// numbered densely. A Holder keeps the set in force; the reloader swaps it
// whole, and every front, the engine and the guard read it once per
// request, so that a request decides under one set from start to end.
package ruleset

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/rules"
)

// Set is one configuration, never modified once built.
type Set struct {
	rules []*rules.Rule
	rls   *envoyconf.Config
	// policies are the rules' (rule by rule: its own, its tiers', its
	// overrides'), then the rate-limit configuration's, each identity
	// once: a policy's number is its index.
	policies []*algo.Policy
	index    map[algo.Identity]int
}

// New returns the set of rs, 1 to algo.MaxRules rules, and cfg, the
// rate-limit service's configuration (nil without one).
func New(rs []*rules.Rule, cfg *envoyconf.Config) (*Set, error) {
	if len(rs) == 0 || len(rs) > algo.MaxRules {
		return nil, fmt.Errorf("ruleset: %d rules; want 1 to %d", len(rs), algo.MaxRules)
	}
	s := &Set{rules: rs, rls: cfg, index: map[algo.Identity]int{}}
	add := func(p *algo.Policy) {
		id := p.Identity()
		if _, ok := s.index[id]; !ok {
			s.index[id] = len(s.policies)
			s.policies = append(s.policies, p)
		}
	}
	for _, r := range rs {
		for _, p := range r.Policies() {
			add(p)
		}
	}
	if cfg != nil {
		for _, p := range cfg.Policies() {
			add(p)
		}
	}
	return s, nil
}

// Rules returns the rules, in order. The caller must not modify them.
func (s *Set) Rules() []*rules.Rule { return s.rules }

// RLS returns the rate-limit service's configuration; nil without one.
func (s *Set) RLS() *envoyconf.Config { return s.rls }

// Policies returns every policy the set decides, each identity once, in
// the order of their numbers. The caller must not modify them.
func (s *Set) Policies() []*algo.Policy { return s.policies }

// Index returns the number of p's identity in the set: a policy of a
// previous set finds its successor's. It reports false for an identity
// the set does not decide (such as a limit Envoy sends with a
// descriptor).
func (s *Set) Index(p *algo.Policy) (int, bool) {
	i, ok := s.index[p.Identity()]
	return i, ok
}

// WithRules returns the set with rs in place of its rules. It refuses
// rules that change the window of a fixed_window or sliding_window_counter
// rule under the same name: their state counts in windows of the old
// length, numbered from the epoch, and read with another length it would
// mean nothing (a window far in the future). A new name starts the rule
// afresh.
func (s *Set) WithRules(rs []*rules.Rule) (*Set, error) {
	if err := checkWindows(s.rules, rs); err != nil {
		return nil, err
	}
	return New(rs, s.rls)
}

// WithRLS returns the set with cfg in place of its rate-limit
// configuration. It refuses a configuration that changes the unit of a
// fixed_window or sliding_window_counter limit in place: its policy keeps
// its name (the domain and the descriptor path), and its counts, kept in
// windows of the old unit, would mean nothing under the new one.
func (s *Set) WithRLS(cfg *envoyconf.Config) (*Set, error) {
	if s.rls != nil && cfg != nil {
		if err := checkUnits(s.rls, cfg); err != nil {
			return nil, err
		}
	}
	return New(s.rules, cfg)
}

// windowed reports whether a's state counts in windows numbered from the
// epoch, which a new window length would misread.
func windowed(a algo.Algorithm) bool {
	return a == algo.FixedWindow || a == algo.SlidingWindowCounter
}

func checkWindows(old, next []*rules.Rule) error {
	windows := map[algo.Identity]time.Duration{}
	for _, r := range old {
		for _, p := range r.Policies() {
			windows[p.Identity()] = p.Spec().Window
		}
	}
	var errs []error
	for i, r := range next {
		for j, p := range r.Policies() {
			s := p.Spec()
			if !windowed(s.Algorithm) {
				continue
			}
			w, ok := windows[p.Identity()]
			if !ok || w == s.Window {
				continue
			}
			what := ""
			switch {
			case j == 0:
			case j <= len(r.Tiers):
				what = fmt.Sprintf("tier %q: ", r.Tiers[j-1].Name)
			default:
				what = "an override: "
			}
			errs = append(errs, fmt.Errorf("rule %d %q: %slimit: the window changes from %v to %v, which %s's counts cannot carry over; give the rule a new name to start it afresh", i+1, r.Name, what, w, s.Window, s.Algorithm))
		}
	}
	return errors.Join(errs...)
}

func checkUnits(old, next *envoyconf.Config) error {
	units := map[algo.Identity]*envoyconf.Limit{}
	for _, l := range old.Limits() {
		if l.Policy != nil {
			units[l.Policy.Identity()] = l
		}
	}
	var errs []error
	for _, l := range next.Limits() {
		if l.Policy == nil || !windowed(l.Policy.Spec().Algorithm) {
			continue
		}
		if o, ok := units[l.Policy.Identity()]; ok && o.Unit != l.Unit {
			a := l.Policy.Spec().Algorithm
			errs = append(errs, fmt.Errorf("%s: rate_limit.unit: changes from %s to %s, which %s's counts cannot carry over; remove the limit, reload, wait one %s for its counts to expire, then add it with the new unit", l.Key, o.Unit, l.Unit, a, o.Unit))
		}
	}
	return errors.Join(errs...)
}

// Holder keeps the set in force. Load is safe from any goroutine; Store is
// the reloader's.
type Holder struct {
	cur atomic.Pointer[Set]
}

// NewHolder returns a holder with s in force.
func NewHolder(s *Set) *Holder {
	h := &Holder{}
	h.cur.Store(s)
	return h
}

// Load returns the set in force. A request reads it once and decides
// under it from start to end.
func (h *Holder) Load() *Set { return h.cur.Load() }

// Store puts s in force: requests already under way finish under the set
// they started with.
func (h *Holder) Store(s *Set) { h.cur.Store(s) }
