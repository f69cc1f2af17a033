package decide

import (
	"context"
	"errors"
	"fmt"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/rules"
)

// QuotaStore reads and forgets a client's state without deciding: a
// guard.Guard.
type QuotaStore interface {
	// Peek reports what a decision of reqs would answer, consuming
	// nothing (see algo.Peek).
	Peek(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error)
	// Reset forgets each request's policy's state for its key.
	Reset(ctx context.Context, reqs []algo.Request) error
}

// ErrNoRule is Reset's error when the rule it is asked to reset does not
// apply to the request.
var ErrNoRule = errors.New("no rule of that name applies to the request")

// Quota is what Decide would answer for a request, read without deciding
// it: nothing is consumed and no metric counts it.
type Quota struct {
	// Verdict is Allow or Deny when the rules were asked; Blocked,
	// Allowlisted, Invalid or Unmatched when they were not, as Decide
	// would answer.
	Verdict Verdict
	// Kind and Detail say why a request is not admitted, as Outcome's
	// do; empty when it is.
	Kind, Detail string
	// Rules are the rules that apply, in rule order.
	Rules []RuleQuota
}

// RuleQuota is one rule's standing for a client.
type RuleQuota struct {
	// Rule is the rule, from the set in force.
	Rule *rules.Rule
	// Policy is the limit the rule applies to this request.
	Policy *algo.Policy
	// Parts are the rule's key parts with the request's values.
	Parts []KeyPart
	// Tag is the key tag the state is stored under (algo.AppendTag).
	Tag string
	// Shadow: the rule is decided as a shadow rule.
	Shadow bool
	// Cost is what the request would cost under the rule.
	Cost int64
	// Result is the rule's answer with the counts that stand: Remaining
	// is what is left before this request's cost, Allowed whether the
	// rule would admit it.
	algo.Result
}

// KeyPart is one key part of a rule and its value in a request.
type KeyPart struct {
	Part, Value string
}

// Quota reads what Decide would answer for in, from s, consuming nothing:
// the same screening (block and allow lists, unreadable requests), the
// same rules, keys and costs, the same store.
func (e *Engine) Quota(ctx context.Context, in *Input, s QuotaStore) (Quota, error) {
	var o Outcome
	q, ok := e.applied(in, &o)
	if !ok || len(o.reqs) == 0 {
		return q, nil
	}
	res := make([]algo.Result, len(o.reqs))
	admitted, err := s.Peek(ctx, o.reqs, res)
	if err != nil {
		return Quota{}, fmt.Errorf("decide: quota: %w", err)
	}
	neverAdmits(o.reqs, res)
	for i := range o.reqs {
		if !res[i].Allowed && !o.reqs[i].Shadow {
			admitted = false
		}
		q.Rules = append(q.Rules, e.ruleQuota(&o, i, &in.Request, res[i]))
	}
	q.Verdict = Allow
	if !admitted {
		q.Verdict, q.Kind, q.Detail = Deny, "rate-limited", "Too many requests."
		for i := range res {
			if !o.reqs[i].Shadow && res[i].Reason == algo.ReasonCostTooHigh {
				q.Kind, q.Detail = "cost-too-high", "The request costs more than the limit ever admits."
			}
		}
	}
	return q, nil
}

// Reset forgets, in s, the state of the rules that apply to in for its
// client: every such rule, or only the one named rule when rule is not
// empty. It returns the rules reset; a named rule that does not apply to
// in is an error, and resets nothing.
func (e *Engine) Reset(ctx context.Context, in *Input, rule string, s QuotaStore) (Quota, error) {
	var o Outcome
	q, ok := e.applied(in, &o)
	if !ok {
		return q, nil
	}
	var reqs []algo.Request
	for i := range o.reqs {
		if rule != "" && o.ruleOf[i].Name != rule {
			continue
		}
		reqs = append(reqs, o.reqs[i])
		q.Rules = append(q.Rules, e.ruleQuota(&o, i, &in.Request, algo.Result{}))
	}
	if rule != "" && len(reqs) == 0 {
		return Quota{}, fmt.Errorf("decide: reset: rule %q: %w", rule, ErrNoRule)
	}
	if len(reqs) == 0 {
		return q, nil
	}
	if err := s.Reset(ctx, reqs); err != nil {
		return Quota{}, fmt.Errorf("decide: reset: %w", err)
	}
	return q, nil
}

// applied screens in and finds the rules that apply, as Decide does, into
// o. It reports false, with the Quota saying why, when the rules are not
// asked.
func (e *Engine) applied(in *Input, o *Outcome) (Quota, bool) {
	set := e.viewOf(e.rules.Load())
	o.reset()
	switch {
	case contains(e.block, in.Client):
		return Quota{Verdict: Blocked, Kind: "blocked", Detail: "The client address is blocked."}, false
	case contains(e.allow, in.Client):
		return Quota{Verdict: Allowlisted}, false
	case in.Invalid != "":
		return Quota{Verdict: Invalid, Kind: in.Invalid, Detail: in.InvalidDetail}, false
	}
	if !e.apply(set, &in.Request, in.TrustedPeer, o) {
		return Quota{Verdict: o.Verdict, Kind: o.Kind, Detail: o.Detail}, false
	}
	for i, s := range o.spans {
		o.reqs[i].Key = o.tags[s.from:s.to]
	}
	if len(o.reqs) == 0 {
		return Quota{Verdict: Unmatched}, false
	}
	return Quota{}, true
}

func (e *Engine) ruleQuota(o *Outcome, i int, q *rules.Request, r algo.Result) RuleQuota {
	rule := o.ruleOf[i]
	rq := RuleQuota{Rule: rule, Policy: o.reqs[i].Policy, Tag: string(o.reqs[i].Key), Shadow: o.reqs[i].Shadow, Cost: o.reqs[i].EffectiveCost(), Result: r}
	for _, p := range rule.Key {
		var v []byte
		switch p.Kind {
		case rules.PartIP:
			v = q.ClientKey
		case rules.PartHeader:
			v, _ = q.Header.Lookup(p.Header)
		case rules.PartHost:
			v = q.Host
		case rules.PartMethod:
			v = q.Method
		case rules.PartPath:
			v = q.Path
		}
		rq.Parts = append(rq.Parts, KeyPart{Part: p.String(), Value: string(v)})
	}
	return rq
}
