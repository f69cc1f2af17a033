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
	if err := sharedLabel(rs, cfg); err != nil {
		return nil, err
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

// sharedLabel refuses a limit of cfg that goes by a rule's name (its
// rate_limit.name): the metrics' rule label would count both as one.
func sharedLabel(rs []*rules.Rule, cfg *envoyconf.Config) error {
	if cfg == nil {
		return nil
	}
	names := make(map[string]bool, len(rs))
	for _, r := range rs {
		names[r.Name] = true
	}
	var errs []error
	for _, l := range cfg.Limits() {
		if l.Policy != nil && names[l.Label()] {
			errs = append(errs, fmt.Errorf("ruleset: the rate limit service's limit %s is named %q, as a rule is: the metrics would count both as one; rename one", l.Key, l.Label()))
		}
	}
	return errors.Join(errs...)
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
