package decide

import (
	"context"
	"errors"
	"fmt"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/rules"
)

// ErrBadTag is the error of TagQuota and ResetTag for a tag that
// algo.AppendTag cannot have made.
var ErrBadTag = errors.New("not a key tag")

// tagRequests returns a request per policy of rule (its own, its tiers',
// its overrides') for the key tag, as the stores keep their state.
func (e *Engine) tagRequests(rule, tag string) ([]algo.Request, bool, error) {
	if tag == "" || len(tag) > 64 || string(algo.AppendTag(nil, []byte(tag))) != tag {
		return nil, false, fmt.Errorf("decide: tag %q: %w", tag, ErrBadTag)
	}
	for _, r := range e.rules.Load().Rules() {
		if r.Name != rule {
			continue
		}
		var reqs []algo.Request
		for _, p := range r.Policies() {
			reqs = append(reqs, algo.Request{Policy: p, Key: []byte(tag), Shadow: r.Shadow || e.shadow})
		}
		return reqs, r.Shadow || e.shadow, nil
	}
	return nil, false, fmt.Errorf("decide: rule %q: %w", rule, ErrNoRule)
}

// TagQuota reads the standing of a key tag (as the top limited clients
// list it) under each policy of the named rule, from s, consuming nothing.
// A rule not in force is ErrNoRule; a tag AppendTag cannot make,
// ErrBadTag.
func (e *Engine) TagQuota(ctx context.Context, rule, tag string, s QuotaStore) ([]RuleQuota, error) {
	reqs, shadow, err := e.tagRequests(rule, tag)
	if err != nil {
		return nil, err
	}
	var out []RuleQuota
	for _, q := range reqs {
		res := make([]algo.Result, 1)
		if _, err := s.Peek(ctx, []algo.Request{q}, res); err != nil {
			return nil, fmt.Errorf("decide: tag quota: %w", err)
		}
		r := e.ruleNamed(rule)
		out = append(out, RuleQuota{Rule: r, Policy: q.Policy, Tag: tag, Shadow: shadow, Cost: q.EffectiveCost(), Result: res[0]})
	}
	return out, nil
}

// ResetTag forgets, in s, the state of a key tag under every policy of the
// named rule. Errors as TagQuota's.
func (e *Engine) ResetTag(ctx context.Context, rule, tag string, s QuotaStore) ([]RuleQuota, error) {
	reqs, shadow, err := e.tagRequests(rule, tag)
	if err != nil {
		return nil, err
	}
	if err := s.Reset(ctx, reqs); err != nil {
		return nil, fmt.Errorf("decide: reset tag: %w", err)
	}
	var out []RuleQuota
	for _, q := range reqs {
		out = append(out, RuleQuota{Rule: e.ruleNamed(rule), Policy: q.Policy, Tag: tag, Shadow: shadow, Cost: q.EffectiveCost()})
	}
	return out, nil
}

// ruleNamed returns the rule in force of that name, or nil.
func (e *Engine) ruleNamed(name string) *rules.Rule {
	for _, r := range e.rules.Load().Rules() {
		if r.Name == name {
			return r
		}
	}
	return nil
}
