// Package decide is authlimit's one decision engine. Every front (the HTTP
// /auth endpoint, Envoy's ext_authz Check) reads its request into an Input,
// asks an Engine, and writes the Outcome in its own wire format. The engine
// screens the client against the allow and block lists, applies the rules
// (matching, keys, costs, missing and repeated headers, shadow), asks a
// Decider for one atomic decision, maps its errors to the fail modes, counts
// the metrics, and works out once what the rate-limit headers and the
// problem body say. On the request path it allocates nothing.
//
// The rules come from the rule set in force (package ruleset), read once
// per request: a reload swaps the whole set, and a request decides under
// the set it started with.
package decide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset"
)

// Decider decides the policies of one request atomically: a guard.Guard, or
// a store. guard.ErrFailedOpen and guard.ErrUnavailable are answers too.
type Decider interface {
	Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error)
}

// Options configure an Engine. The caller gives every value; the defaults
// live with the configuration that reads them.
type Options struct {
	// Rules holds the rule set in force. Required.
	Rules *ruleset.Holder
	// Decider decides. Required.
	Decider Decider
	// AllowCIDRs are never limited; BlockCIDRs are always denied.
	AllowCIDRs, BlockCIDRs []netip.Prefix
	// IPv4Prefix and IPv6Prefix group addresses for the ip key part.
	IPv4Prefix, IPv6Prefix int
	// DenyStatus is the status of a denial, 400 to 599.
	DenyStatus int
	// Shadow makes every rule a shadow rule: nothing is denied.
	Shadow bool
	// Registry receives the metrics. Default: a new registry.
	Registry prometheus.Registerer
	// Logger logs failed decisions. Default: discard.
	Logger *slog.Logger
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
	// Observer, when set, is told every rule's answer to every decided
	// request (see Observer). Default: none.
	Observer Observer
}

// Engine decides requests. Build it with New; it is safe for concurrent
// use.
type Engine struct {
	rules *ruleset.Holder
	// view is the engine's limits of the last set it decided under,
	// made once per set (see viewOf).
	view         atomic.Pointer[ruleView]
	decider      Decider
	allow, block []netip.Prefix
	v4, v6       int
	denyStatus   int
	shadow       bool
	metrics      *metrics
	log          *slog.Logger
	clock        func() time.Time
	observer     Observer

	frontsMu sync.Mutex
	fronts   map[string]*Front
}

// New validates opts and returns an Engine.
func New(opts Options) (*Engine, error) {
	var errs []error
	if opts.Decider == nil {
		errs = append(errs, errors.New("decide: no decider"))
	}
	if opts.Rules == nil {
		errs = append(errs, errors.New("decide: no rule set"))
	}
	if opts.DenyStatus < 400 || opts.DenyStatus > 599 {
		errs = append(errs, fmt.Errorf("decide: deny status %d is not 4xx or 5xx", opts.DenyStatus))
	}
	if opts.IPv4Prefix < 1 || opts.IPv4Prefix > 32 || opts.IPv6Prefix < 1 || opts.IPv6Prefix > 128 {
		errs = append(errs, fmt.Errorf("decide: IP prefixes /%d and /%d are out of range", opts.IPv4Prefix, opts.IPv6Prefix))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		rules:      opts.Rules,
		decider:    opts.Decider,
		allow:      opts.AllowCIDRs,
		block:      opts.BlockCIDRs,
		v4:         opts.IPv4Prefix,
		v6:         opts.IPv6Prefix,
		denyStatus: opts.DenyStatus,
		shadow:     opts.Shadow,
		metrics:    m,
		log:        opts.Logger,
		clock:      opts.Clock,
		fronts:     map[string]*Front{},
		observer:   opts.Observer,
	}
	return e, nil
}

// viewOf returns the engine's view of set: the limits of its rules, made
// once per set and kept until the next.
func (e *Engine) viewOf(set *ruleset.Set) *ruleView {
	if v := e.view.Load(); v != nil && v.set == set {
		return v
	}
	v := newRuleView(set, e.metrics)
	e.view.Store(v)
	return v
}

// Rules returns the rules in force. The caller must not modify them.
func (e *Engine) Rules() []*rules.Rule { return e.rules.Load().Rules() }

// DenyStatus is the status of a denial.
func (e *Engine) DenyStatus() int { return e.denyStatus }

// Shadow reports whether every rule and limit is a shadow: nothing is
// denied. A front that denies on its own (Envoy's limit of 0) asks it.
func (e *Engine) Shadow() bool { return e.shadow }

// Input is one request as a front read it. Fill it with Read, or set its
// fields directly.
type Input struct {
	// Client is the client's address, already found behind the trusted
	// proxies (rules.Proxies.ClientIP).
	Client netip.Addr
	// Request is what the rules see of the request, normalized.
	Request rules.Request
	// TrustedPeer says that the request came from a trusted proxy (for
	// /auth, the TCP peer; for Check, attributes.source.address), so that
	// the tier header, which such a proxy sets, is believed: see
	// rules.Rule.Select. Read and Refuse reset it; a front sets it after
	// Read.
	TrustedPeer bool
	// Invalid, when set, is the kind of problem that kept the front from
	// reading the request (for example "invalid-url"), and InvalidDetail
	// says what it was. Such a request is refused once the block and
	// allow lists are passed: an allow-listed client is let through
	// whatever it sends.
	Invalid, InvalidDetail string

	buf []byte
}

// Read fills in from the original request's client address, method, URI
// and host, each normalized as rules.Request says, and its headers; the
// values are copied into in's own buffer.
func (e *Engine) Read(in *Input, client netip.Addr, method, uri, host []byte, h rules.Headers) {
	buf := in.buf[:0]
	var at [4]int
	buf = rules.AppendMethod(buf, method)
	at[0] = len(buf)
	buf = rules.AppendPath(buf, uri)
	at[1] = len(buf)
	buf = rules.AppendHost(buf, host)
	at[2] = len(buf)
	buf = rules.AppendClientKey(buf, client, e.v4, e.v6)
	at[3] = len(buf)
	in.buf = buf
	in.Client = client
	in.TrustedPeer = false
	in.Invalid, in.InvalidDetail = "", ""
	in.Request = rules.Request{
		Method:    buf[:at[0]],
		Path:      buf[at[0]:at[1]],
		Host:      buf[at[1]:at[2]],
		ClientKey: buf[at[2]:at[3]],
		Header:    h,
	}
}

// Refuse marks in as a request the front could not read: see
// Input.Invalid. Only the client address is kept.
func (in *Input) Refuse(client netip.Addr, kind, detail string) {
	in.Client = client
	in.Request = rules.Request{}
	in.TrustedPeer = false
	in.Invalid, in.InvalidDetail = kind, detail
}

// Decide decides in and writes the answer into o, which it resets first.
// ctx reaches the store: a deadline shortens the wait, a cancellation
// abandons it, and the guard counts either as the store failing. A front
// passes neither its caller's cancellation nor a caller's deadline, or a
// caller in a hurry would open the circuit for everyone; the store's
// budget bounds the wait. The delay of a shaped request is the front's to
// hold.
func (e *Engine) Decide(ctx context.Context, in *Input, o *Outcome) {
	set := e.viewOf(e.rules.Load())
	o.reset()
	now := e.clock()
	defer e.done(o, now)
	if e.screen(set, in, o) {
		o.seen(in)
		e.decide(ctx, o, now)
	}
}

// screen answers in when the block and allow lists or the rules do
// (blocked, allow-listed, invalid), and reports whether it is left to
// decide, with its requests in o.
func (e *Engine) screen(set *ruleView, in *Input, o *Outcome) bool {
	if contains(e.block, in.Client) {
		o.refuse(Blocked, e.denyStatus, "blocked", "The client address is blocked.")
		return false
	}
	if contains(e.allow, in.Client) {
		o.Verdict = Allowlisted
		return false
	}
	if in.Invalid != "" {
		o.refuse(Invalid, e.denyStatus, in.Invalid, in.InvalidDetail)
		return false
	}
	if !e.apply(set, &in.Request, in.TrustedPeer, o) {
		return false
	}
	return true
}

// AsyncDecider is a Decider that can decide without holding its caller:
// see guard.Guard.DecideAsync.
type AsyncDecider interface {
	DecideAsync(reqs []algo.Request, res []algo.Result, d algo.Done) bool
}

// WholeDecider is a Decider that can answer with every policy's state,
// never leaving one unread (algo.Result.NotDecided): see
// guard.Guard.DecideWhole. DecideLimits asks it so, for a front that
// reports every limit's count.
type WholeDecider interface {
	DecideWhole(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error)
	DecideWholeAsync(reqs []algo.Request, res []algo.Result, d algo.Done) bool
}

var _ WholeDecider = (*guard.Guard)(nil)

// Then is told that the outcome of a DecideAsync is ready.
type Then interface {
	Decided(o *Outcome)
}

// RunThen is a Then that can be told within a run of outcomes (a store's
// batch), whose end it may leave the answer's write to: see algo.Run.
type RunThen interface {
	Then
	DecidedIn(run *algo.Run, o *Outcome)
}

// DecideAsync decides in as Decide does, without holding its caller while
// the store decides: then is told once o holds the answer, on the
// goroutine that completes the decision, maybe before DecideAsync
// returns; in and o must stay untouched until then. No context reaches
// the store: its budget bounds the decision. It reports false, having
// decided nothing, when the Decider cannot decide without holding the
// caller (see AsyncDecider): decide with Decide then.
func (e *Engine) DecideAsync(in *Input, o *Outcome, then Then) bool {
	ad, ok := e.decider.(AsyncDecider)
	if !ok {
		return false
	}
	set := e.viewOf(e.rules.Load())
	o.reset()
	now := e.clock()
	if !e.screen(set, in, o) {
		e.done(o, now)
		then.Decided(o)
		return true
	}
	o.seen(in)
	return e.decideAsync(ad, o, now, then)
}

// decideAsync asks ad about o's requests, as decide asks the Decider.
func (e *Engine) decideAsync(ad AsyncDecider, o *Outcome, now time.Time, then Then) bool {
	if !e.prepare(o) {
		e.done(o, now)
		then.Decided(o)
		return true
	}
	o.eng, o.now, o.then = e, now, then
	var taken bool
	if w, ok := e.decider.(WholeDecider); ok && o.whole {
		taken = w.DecideWholeAsync(o.reqs, o.res[:len(o.reqs)], (*asyncOutcome)(o))
	} else {
		taken = ad.DecideAsync(o.reqs, o.res[:len(o.reqs)], (*asyncOutcome)(o))
	}
	if !taken {
		o.eng, o.then = nil, nil
		return false
	}
	return true
}

// asyncOutcome is an Outcome waiting for its Decider's answer.
type asyncOutcome Outcome

var _ algo.RunDone = (*asyncOutcome)(nil)

// Decided works the Decider's answer out into the outcome, and tells the
// caller's Then. A panic meanwhile is a failed decision (500).
func (a *asyncOutcome) Decided(admitted bool, err error) { a.DecidedIn(nil, admitted, err) }

// DecidedIn is Decided within a run, which the caller's Then is told
// within too if it can be (see RunThen).
func (a *asyncOutcome) DecidedIn(run *algo.Run, admitted bool, err error) {
	o := (*Outcome)(a)
	e, then := o.eng, o.then
	o.eng, o.then = nil, nil
	told := false
	defer func() {
		if p := recover(); p != nil && !told {
			e.log.Error("decide", "panic", fmt.Sprint(p))
			o.reset()
			o.refuse(Failed, 500, "error", "The decision failed.")
			e.done(o, o.now)
			then.Decided(o)
		}
	}()
	e.conclude(o, o.res[:len(o.reqs)], admitted, err, o.now)
	e.done(o, o.now)
	told = true
	if rt, ok := then.(RunThen); ok && run != nil {
		rt.DecidedIn(run, o)
		return
	}
	then.Decided(o)
}

// LimitRequest asks one Limit about one key, for DecideLimits.
type LimitRequest struct {
	// Limit is the limit, from NewLimit.
	Limit *Limit
	// Key is what the limit counts by, any bytes: the engine turns it
	// into a key tag. It may alias memory the caller reuses once
	// DecideLimits returns.
	Key []byte
	// Cost is the weight of the request; zero means the policy's cost.
	Cost int64
	// Shadow makes the limit advisory: decided and counted, never
	// denying.
	Shadow bool
}

// NewLimit returns a Limit of p under name (bounded: it labels metrics),
// for DecideLimits, such as a configured limit of Envoy's rate limit
// service, made once per configuration.
func (e *Engine) NewLimit(name string, p *algo.Policy) *Limit {
	return newLimit(name, name, p, e.metrics)
}

// NewLimitCountedAs returns a limit made on demand, such as one Envoy
// sends with a descriptor: its metrics count under label rather than its
// name, so that such limits share one and the metrics stay bounded while
// the headers name each. A guard.Guard decides a policy its rule set does
// not know all the same, without its deny cache.
func (e *Engine) NewLimitCountedAs(name, label string, p *algo.Policy) *Limit {
	return newLimit(name, label, p, e.metrics)
}

// DecideLimits decides limits a front picked itself, such as the policies
// of Envoy's rate limit descriptors, as one request: every limit that is
// not a shadow admits it, or nothing is consumed. Everything after the
// rule matching is as Decide does it: the fail modes, the metrics, the
// results, the headers and the problem. No rule set and no allow or block
// list applies. No requests is Unmatched; more than algo.MaxRules, or one
// without a Limit, is Invalid; a limit asked twice for one key, or a cost
// out of range, fails (500), as the stores refuse them (one limit for
// several keys is fine). The engine's Shadow setting makes every limit a
// shadow. Every limit's result is read (a WholeDecider is asked to): none
// is left NotDecided by another's cached denial.
func (e *Engine) DecideLimits(ctx context.Context, reqs []LimitRequest, o *Outcome) {
	o.reset()
	now := e.clock()
	defer e.done(o, now)
	o.whole = true
	if e.limits(reqs, o) {
		e.decide(ctx, o, now)
	}
}

// DecideLimitsAsync decides reqs as DecideLimits does, asynchronously as
// DecideAsync decides: then is told once o holds the answer. reqs may be
// reused once it returns.
func (e *Engine) DecideLimitsAsync(reqs []LimitRequest, o *Outcome, then Then) bool {
	ad, ok := e.decider.(AsyncDecider)
	if !ok {
		return false
	}
	o.reset()
	now := e.clock()
	o.whole = true
	if !e.limits(reqs, o) {
		e.done(o, now)
		then.Decided(o)
		return true
	}
	return e.decideAsync(ad, o, now, then)
}

// limits puts reqs in o's requests, and reports false, with o refused,
// when they are invalid.
func (e *Engine) limits(reqs []LimitRequest, o *Outcome) bool {
	if len(reqs) > algo.MaxRules {
		o.refuse(Invalid, e.denyStatus, "too-many-limits", fmt.Sprintf("A request may ask at most %d limits.", algo.MaxRules))
		return false
	}
	for _, q := range reqs {
		if q.Limit == nil || q.Limit.Policy == nil {
			o.refuse(Invalid, e.denyStatus, "no-limit", "A request asked a limit that is not there.")
			return false
		}
		from := len(o.tags)
		o.tags = algo.AppendTag(o.tags, q.Key)
		o.spans = append(o.spans, span{from, len(o.tags)})
		o.reqs = append(o.reqs, algo.Request{Policy: q.Limit.Policy, Cost: q.Cost, Shadow: q.Shadow || e.shadow})
		o.limits = append(o.limits, q.Limit)
		o.ruleOf = append(o.ruleOf, nil)
	}
	return true
}

// decide asks the Decider about o.reqs and works out the answer.
func (e *Engine) decide(ctx context.Context, o *Outcome, now time.Time) {
	if !e.prepare(o) {
		return
	}
	res := o.res[:len(o.reqs)]
	var admitted bool
	var err error
	if w, ok := e.decider.(WholeDecider); ok && o.whole {
		admitted, err = w.DecideWhole(ctx, o.reqs, res)
	} else {
		admitted, err = e.decider.Decide(ctx, o.reqs, res)
	}
	e.conclude(o, res, admitted, err, now)
}

// prepare readies o.reqs and o.res for the Decider; it reports false, with
// o answered, when there is nothing to decide.
func (e *Engine) prepare(o *Outcome) bool {
	if len(o.reqs) == 0 {
		o.Verdict = Unmatched
		return false
	}
	for i, s := range o.spans {
		o.reqs[i].Key = o.tags[s.from:s.to]
	}
	if cap(o.res) < len(o.reqs) {
		o.res = make([]algo.Result, len(o.reqs), algo.MaxRules)
	}
	return true
}

// conclude works the Decider's answer out into o.
func (e *Engine) conclude(o *Outcome, res []algo.Result, admitted bool, err error, now time.Time) {
	switch {
	case errors.Is(err, guard.ErrUnavailable):
		o.RetryAfter = 1
		o.addHeader(retryAfter, append(o.hbuf, '1'))
		o.refuse(Unavailable, 503, "unavailable", "The rate-limit store could not decide; retry shortly.")
		return
	case errors.Is(err, guard.ErrFailedOpen):
		o.Verdict = FailedOpen
		return
	case err != nil:
		e.log.Error("decide", "err", err)
		o.refuse(Failed, 500, "error", "The decision failed.")
		return
	}
	e.respond(o, res, admitted, now)
}

// apply finds the rules that apply to q, with their keys, costs and limits
// (the rule's own, a tier's or an override's: see rules.Rule.Select; the
// tier header is read only when trusted), into o.reqs. It reports false,
// with o refused, when a key, cost or tier header is missing (and the rule
// refuses that), repeated or invalid.
func (e *Engine) apply(set *ruleView, q *rules.Request, trusted bool, o *Outcome) bool {
	for i, r := range set.rules {
		if !r.Match(q) {
			continue
		}
		var status rules.KeyStatus
		var header string
		o.keys, status, header = r.AppendKey(o.keys[:0], q)
		switch status {
		case rules.KeyMissing:
			if r.DenyOnMissing {
				o.refuse(Invalid, e.denyStatus, "missing-key", fmt.Sprintf("Rule %q needs the %s header.", r.Name, header))
				return false
			}
			continue
		case rules.KeyRepeated:
			o.refuse(Invalid, e.denyStatus, "repeated-header", fmt.Sprintf("Rule %q counts by the %s header, which the request has more than once.", r.Name, header))
			return false
		}
		cost, cs := r.Cost(q)
		switch cs {
		case rules.CostMissing:
			o.refuse(Invalid, e.denyStatus, "missing-cost", fmt.Sprintf("Rule %q needs the %s header.", r.Name, r.CostHeader))
			return false
		case rules.CostRepeated:
			o.refuse(Invalid, e.denyStatus, "repeated-header", fmt.Sprintf("Rule %q reads its cost from the %s header, which the request has more than once.", r.Name, r.CostHeader))
			return false
		case rules.CostInvalid:
			o.refuse(Invalid, e.denyStatus, "invalid-cost", fmt.Sprintf("Rule %q: the %s header is not a whole number from 0 to %d.", r.Name, r.CostHeader, int64(algo.MaxLimit)))
			return false
		}
		if cost == 0 && r.CostHeader != "" {
			continue // an empty body counts nothing
		}
		which, ts := r.Select(q, o.keys, trusted)
		if ts == rules.TierRepeated {
			o.refuse(Invalid, e.denyStatus, "repeated-header", fmt.Sprintf("Rule %q reads its tier from the %s header, which the request has more than once.", r.Name, r.TierHeader))
			return false
		}
		l := set.limits[i][which]
		from := len(o.tags)
		o.tags = algo.AppendTag(o.tags, o.keys)
		o.spans = append(o.spans, span{from, len(o.tags)})
		o.reqs = append(o.reqs, algo.Request{Policy: l.Policy, Cost: cost, Shadow: r.Shadow || e.shadow})
		o.limits = append(o.limits, l)
		o.ruleOf = append(o.ruleOf, r)
	}
	return true
}

// respond works out the answer to a decision: metrics, results, headers
// and, on a denial, the problem.
func (e *Engine) respond(o *Outcome, res []algo.Result, admitted bool, now time.Time) {
	var retry, delay time.Duration
	costTooHigh := false
	if !admitted {
		neverAdmits(o.reqs, res)
	}
	for i, r := range res {
		d := &o.limits[i].metrics
		shadow := o.reqs[i].Shadow
		switch {
		case r.NotDecided:
			// Not asked: nothing to count.
		case r.Allowed:
			d.allowed.Inc()
			delay = max(delay, r.Delay)
		case shadow:
			d.shadowDenied.Inc()
		default:
			d.denied.Inc()
			retry = max(retry, r.RetryAfter)
			costTooHigh = costTooHigh || r.Reason == algo.ReasonCostTooHigh
		}
		o.Results = append(o.Results, Result{Rule: o.ruleOf[i], Limit: o.limits[i], Shadow: shadow, Cost: o.reqs[i].EffectiveCost(), Result: r})
	}
	if e.observer != nil {
		e.observe(o, res, now)
	}
	o.setHeaders(admitted, now)
	if admitted {
		o.Verdict = Allow
		if delay > 0 {
			e.metrics.delay.Observe(delay.Seconds())
			o.Delay = delay
		}
		return
	}
	if costTooHigh {
		o.deny(e.denyStatus, "cost-too-high", "The request costs more than the limit ever admits.")
		return
	}
	o.RetryAfter = ceilSeconds(retry, 1)
	o.addHeader(retryAfter, strconv.AppendInt(o.hbuf, o.RetryAfter, 10))
	o.deny(e.denyStatus, "rate-limited", "Too many requests.")
}

// neverAdmits marks as cost-too-high every enforcing rule that the request
// costs more than it ever admits, whatever res says: the deny cache
// answers for one rule alone and reports the others as not decided. A request
// that one of them denies is answered cost-too-high, never rate-limited,
// since no wait admits it.
func neverAdmits(reqs []algo.Request, res []algo.Result) {
	for i := range reqs {
		q := &reqs[i]
		if !q.Shadow && q.EffectiveCost() > q.Policy.MaxCost() && res[i].Reason != algo.ReasonCostTooHigh {
			res[i].Allowed, res[i].Reason, res[i].RetryAfter, res[i].Delay, res[i].NotDecided = false, algo.ReasonCostTooHigh, 0, 0, false
		}
	}
}

func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ceilSeconds rounds d up to whole seconds, at least floor.
func ceilSeconds(d time.Duration, floor int64) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, floor)
}
