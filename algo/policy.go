// Package algo decides whether a request may pass: the policy and result
// types, the six rate-limiting algorithms, the contract every store keeps
// (store.go), and the in-memory store: the embedded default, the local
// fallback, and the reference the Redis store (package store/redis, with
// the Lua scripts in package scripts) is tested against. It knows nothing
// of Redis.
package algo

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"time"

	"github.com/authlimit/authlimit/scripts"
)

// Algorithm names one rate-limiting algorithm. Its numeric values are the
// Lua scripts' (package scripts' wire numbers).
type Algorithm uint8

// The algorithms. The zero value is not an algorithm.
const (
	// FixedWindow keeps one counter per window aligned to the epoch.
	FixedWindow Algorithm = scripts.FixedWindow
	// SlidingWindowLog keeps every admitted request of the last window: at
	// most Limit units pass in any span of length Window.
	SlidingWindowLog Algorithm = scripts.SlidingWindowLog
	// SlidingWindowCounter weights the previous window's counter by its
	// overlap with the sliding span and adds the current window's counter.
	SlidingWindowCounter Algorithm = scripts.SlidingWindowCounter
	// TokenBucket holds up to Burst tokens, refilled at Limit per Window.
	TokenBucket Algorithm = scripts.TokenBucket
	// LeakyBucket is a meter whose level drains at Limit per Window with
	// capacity Burst; with a Delay it shapes traffic instead of denying it.
	LeakyBucket Algorithm = scripts.LeakyBucket
	// GCRA is the generic cell rate algorithm: a theoretical arrival time
	// that each request pushes back by its emission interval. It decides
	// as LeakyBucket without a delay does: the two are one algorithm.
	GCRA Algorithm = scripts.GCRA
)

var algorithmNames = [...]string{
	FixedWindow:          "fixed_window",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	TokenBucket:          "token_bucket",
	LeakyBucket:          "leaky_bucket",
	GCRA:                 "gcra",
}

// keySuffix names each algorithm's state in storage keys, so that a policy
// whose algorithm changes never reads state of another shape. The letters
// differ from every suffix earlier versions wrote, whose state had another
// layout.
var keySuffix = [...]string{
	FixedWindow:          "f",
	SlidingWindowLog:     "l",
	SlidingWindowCounter: "c",
	TokenBucket:          "t",
	LeakyBucket:          "k",
	GCRA:                 "g",
}

// Algorithms lists every algorithm in a stable order.
func Algorithms() []Algorithm {
	return []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, LeakyBucket, GCRA}
}

// String returns the name users write in configuration.
func (a Algorithm) String() string {
	if a.valid() {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

func (a Algorithm) valid() bool { return a >= FixedWindow && a <= GCRA }

// UsesBurst reports whether the algorithm has a capacity, Burst, separate
// from Limit: token_bucket, leaky_bucket and gcra.
func (a Algorithm) UsesBurst() bool { return a == TokenBucket || a == LeakyBucket || a == GCRA }

// ParseAlgorithm returns the algorithm with the given configuration name.
func ParseAlgorithm(name string) (Algorithm, error) {
	for _, a := range Algorithms() {
		if algorithmNames[a] == name {
			return a, nil
		}
	}
	names := make([]string, 0, len(algorithmNames))
	for _, a := range Algorithms() {
		names = append(names, a.String())
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", name, strings.Join(names, ", "))
}

// Bounds on policy values. Together they keep every quantity the algorithms
// derive an exact integer in a float64 (Lua's only number type), every key
// expiry within what Redis accepts, and every duration a result reports
// within time.Duration.
const (
	// MaxLimit bounds Limit, Burst and Cost: 2^50, about 10^15.
	MaxLimit = 1 << 50
	// MinWindow is the shortest window.
	MinWindow = time.Millisecond
	// MaxWindow is the longest window: 366 days.
	MaxWindow = 366 * 24 * time.Hour
	// MaxRefill is the longest a token_bucket, leaky_bucket or gcra policy
	// may take to refill (or drain) its whole burst, Burst·Window/Limit:
	// ten times MaxWindow. Longer would make state outlive any meaning.
	MaxRefill = 10 * MaxWindow
	// MaxDelay is the longest a shaping leaky bucket holds a request.
	MaxDelay = time.Minute
	// MaxRules bounds the rules of one decision, and so of a rule set.
	MaxRules = 64
)

// Spec describes a policy as a user writes it. NewPolicy validates it.
type Spec struct {
	// Name identifies the policy in keys, headers and metrics: [a-z0-9_-]+.
	Name string
	// Algorithm decides how requests are counted.
	Algorithm Algorithm
	// Limit is how many cost units pass per Window.
	Limit int64
	// Window is the period of Limit: at least MinWindow, at most MaxWindow,
	// in whole microseconds.
	Window time.Duration
	// Burst is the capacity of TokenBucket, LeakyBucket and GCRA. Zero
	// means Limit. The other algorithms reject a Burst.
	Burst int64
	// Delay, for LeakyBucket only, is the longest a request that does not
	// fit at once may wait for its turn instead of being denied. Zero
	// denies at once (policing); above zero shapes.
	Delay time.Duration
	// Cost is the weight of a request that does not state its own. Zero
	// means 1. It must not exceed what the policy can ever admit.
	Cost int64
}

// Policy is a validated Spec, immutable and safe to share between
// goroutines. Build it with NewPolicy.
type Policy struct {
	spec Spec
	// Derived once so that decisions do not recompute them.
	window  int64 // microseconds
	delay   int64 // microseconds
	maxCost int64 // the largest cost one request can have and still pass
	suffix  string
}

// SpecError reports an invalid Spec: which policy and which field.
type SpecError struct {
	Policy string // the policy's name, possibly empty or invalid itself
	Field  string // name, algorithm, limit, window, burst, delay or cost
	Err    error
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("policy %q: %s: %v", e.Policy, e.Field, e.Err)
}

func (e *SpecError) Unwrap() error { return e.Err }

// ErrInvalid is wrapped by every SpecError and by Decide's request errors.
var ErrInvalid = errors.New("invalid")

// invalidError is a message that errors.Is reports as ErrInvalid.
type invalidError string

func (e invalidError) Error() string        { return string(e) }
func (e invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(format string, args ...any) error {
	return invalidError(fmt.Sprintf(format, args...))
}

// NewPolicy validates s and returns the policy. Every problem is reported as
// a *SpecError naming the field; when several fields are wrong, all are
// joined.
func NewPolicy(s Spec) (*Policy, error) {
	var errs []error
	fail := func(field string, err error) {
		errs = append(errs, &SpecError{Policy: s.Name, Field: field, Err: err})
	}
	if err := ValidName(s.Name); err != nil {
		fail("name", err)
	}
	if !s.Algorithm.valid() {
		fail("algorithm", invalid("%s is not an algorithm", s.Algorithm))
	}
	if err := validCount(s.Limit); err != nil {
		fail("limit", err)
	}
	switch {
	case s.Window < MinWindow:
		fail("window", invalid("%v is shorter than the minimum %v", s.Window, MinWindow))
	case s.Window > MaxWindow:
		fail("window", invalid("%v is longer than the maximum %v (366 days)", s.Window, MaxWindow))
	case s.Window%time.Microsecond != 0:
		fail("window", invalid("%v is not a whole number of microseconds", s.Window))
	}
	if s.Burst != 0 {
		if !s.Algorithm.UsesBurst() && s.Algorithm.valid() {
			fail("burst", invalid("%s has no burst; only token_bucket, leaky_bucket and gcra do", s.Algorithm))
		} else if err := validCount(s.Burst); err != nil {
			fail("burst", err)
		}
	}
	if s.Delay != 0 {
		switch {
		case s.Algorithm != LeakyBucket && s.Algorithm.valid():
			fail("delay", invalid("%s cannot delay requests; only leaky_bucket can", s.Algorithm))
		case s.Delay < 0:
			fail("delay", invalid("%v is negative", s.Delay))
		case s.Delay > MaxDelay:
			fail("delay", invalid("%v is longer than the maximum %v", s.Delay, MaxDelay))
		case s.Delay%time.Microsecond != 0:
			fail("delay", invalid("%v is not a whole number of microseconds", s.Delay))
		}
	}
	if s.Cost != 0 {
		if err := validCount(s.Cost); err != nil {
			fail("cost", err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	if s.Burst == 0 {
		s.Burst = s.Limit
	}
	if s.Cost == 0 {
		s.Cost = 1
	}
	p := &Policy{
		spec:   s,
		window: s.Window.Microseconds(),
		delay:  s.Delay.Microseconds(),
		suffix: keySuffix[s.Algorithm],
	}
	if s.Algorithm.UsesBurst() && refillLonger(s.Burst, p.window, s.Limit, MaxRefill.Microseconds()) {
		field := "burst"
		if s.Burst == s.Limit {
			field = "limit" // the burst is the limit's default
		}
		return nil, &SpecError{Policy: s.Name, Field: field, Err: invalid(
			"a burst of %d at %d per %v takes longer than %v (10 × 366 days) to refill; raise the limit or lower the burst",
			s.Burst, s.Limit, s.Window, MaxRefill)}
	}
	p.maxCost = p.computeMaxCost()
	if s.Cost > p.maxCost {
		return nil, &SpecError{Policy: s.Name, Field: "cost", Err: invalid(
			"%d is more than the policy ever admits at once (%d): every request would be denied", s.Cost, p.maxCost)}
	}
	return p, nil
}

// refillLonger reports whether burst·window/limit > max, in exact 128-bit
// arithmetic: the product can exceed 64 bits.
func refillLonger(burst, window, limit, max int64) bool {
	hi1, lo1 := bits.Mul64(uint64(burst), uint64(window))
	hi2, lo2 := bits.Mul64(uint64(max), uint64(limit))
	return hi1 > hi2 || hi1 == hi2 && lo1 > lo2
}

// ValidName checks a policy name: 1 to 64 of [a-z0-9_-].
func ValidName(name string) error {
	if name == "" {
		return invalid("empty; want [a-z0-9_-]+")
	}
	if len(name) > 64 {
		return invalid("%d bytes long; the maximum is 64", len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return invalid("%q contains %q; want [a-z0-9_-]+", name, c)
		}
	}
	return nil
}

func validCount(n int64) error {
	switch {
	case n < 1:
		return invalid("%d is not positive", n)
	case n > MaxLimit:
		return invalid("%d is above the maximum %d", n, int64(MaxLimit))
	}
	return nil
}

// computeMaxCost is the largest cost the policy can ever admit in one
// request: the limit for the window algorithms, the burst for the others,
// and for a shaping leaky bucket the burst plus what drains during the
// longest delay, found by the same test a decision makes.
func (p *Policy) computeMaxCost() int64 {
	switch p.spec.Algorithm {
	case FixedWindow, SlidingWindowLog, SlidingWindowCounter:
		return p.spec.Limit
	case LeakyBucket:
		if p.delay == 0 {
			return p.spec.Burst
		}
		extra := math.Floor(float64(float64(p.delay)*float64(p.spec.Limit)) / float64(p.window))
		c := int64(min(float64(p.spec.Burst)+extra, MaxLimit))
		// Rounding may put the last unit a microsecond past the delay.
		for c > p.spec.Burst && leakWait(0, c, p) > p.delay {
			c--
		}
		return c
	}
	return p.spec.Burst
}

// Name returns the policy's name.
func (p *Policy) Name() string { return p.spec.Name }

// Identity is what a policy is across rule sets: its name and algorithm.
// Every store keeps a policy's state under its identity (the Redis keys
// hold both), so a policy rebuilt with other limits, a rule set reloaded,
// continues its predecessor's counts; every cache of per-policy state is
// keyed by it too.
type Identity struct {
	Name      string
	Algorithm Algorithm
}

// Identity returns p's identity.
func (p *Policy) Identity() Identity { return Identity{p.spec.Name, p.spec.Algorithm} }

// Spec returns the policy's specification with defaults filled in.
func (p *Policy) Spec() Spec { return p.spec }

// Capacity is the largest number of cost units the policy admits at once
// from a fresh state: the limit for the window algorithms, the burst for the
// others. It is what the rate-limit headers call the limit.
func (p *Policy) Capacity() int64 {
	if p.spec.Algorithm.UsesBurst() {
		return p.spec.Burst
	}
	return p.spec.Limit
}

// MaxCost is the largest cost one request can have and still be admitted
// some day; a request that costs more is denied with ReasonCostTooHigh. It
// exceeds Capacity only for a shaping leaky bucket.
func (p *Policy) MaxCost() int64 { return p.maxCost }

// Params are the numbers a store decides a policy with: what the Redis
// store sends its scripts. Durations are in microseconds; Burst is filled
// in (Limit when the Spec has none).
type Params struct {
	Algorithm Algorithm
	Limit     int64
	Window    int64 // microseconds
	Burst     int64
	Delay     int64 // microseconds
	MaxCost   int64
}

// Params returns the numbers a store decides p with.
func (p *Policy) Params() Params {
	return Params{p.spec.Algorithm, p.spec.Limit, p.window, p.spec.Burst, p.delay, p.maxCost}
}
