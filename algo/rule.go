// Package algo decides whether a request may pass: the rule and result
// types, the six rate-limiting algorithms, and the two stores that evaluate
// them with one meaning (Redis, through the Lua script in package scripts,
// and an in-memory store that is the embedded default, the local fallback and
// the reference the script is tested against).
package algo

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Algorithm names one rate-limiting algorithm. Its numeric values are part of
// the Lua script's argument layout; do not reorder them.
type Algorithm uint8

// The algorithms. The zero value is not an algorithm.
const (
	// FixedWindow keeps one counter per window aligned to the Unix epoch.
	FixedWindow Algorithm = iota + 1
	// SlidingWindowLog keeps every admitted request in the last window: at
	// most Limit units pass in any span of length Window.
	SlidingWindowLog
	// SlidingWindowCounter weights the previous window's counter by its
	// overlap with the sliding span and adds the current window's counter.
	SlidingWindowCounter
	// TokenBucket holds up to Burst tokens, refilled at Limit per Window.
	TokenBucket
	// LeakyBucket is a meter whose level drains at Limit per Window with
	// capacity Burst; with a Delay it shapes traffic instead of denying it.
	LeakyBucket
	// GCRA is the generic cell rate algorithm: one theoretical arrival time.
	GCRA
)

var algorithmNames = [...]string{
	FixedWindow:          "fixed_window",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	TokenBucket:          "token_bucket",
	LeakyBucket:          "leaky_bucket",
	GCRA:                 "gcra",
}

// keySuffix names each algorithm's state in storage keys, so that a rule
// whose algorithm changes never reads state of another shape.
var keySuffix = [...]string{
	FixedWindow:          "fw",
	SlidingWindowLog:     "swl",
	SlidingWindowCounter: "swc",
	TokenBucket:          "tb",
	LeakyBucket:          "lb",
	GCRA:                 "gcra",
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

// usesBurst reports whether the algorithm has a capacity separate from Limit.
func (a Algorithm) usesBurst() bool { return a == TokenBucket || a == LeakyBucket || a == GCRA }

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

// Bounds on rule values. They keep every quantity the algorithms compute an
// exact integer in a float64 (Lua's only number type), keep windows within
// what a rate limit can mean, and keep a held answer within what a proxy will
// wait for.
const (
	// MaxLimit bounds Limit, Burst and Cost: 2^50, about 10^15.
	MaxLimit = 1 << 50
	// MinWindow is the shortest window.
	MinWindow = time.Millisecond
	// MaxWindow is the longest window: 366 days.
	MaxWindow = 366 * 24 * time.Hour
	// MaxDelay is the longest a shaping leaky bucket holds a request.
	MaxDelay = time.Minute
	// minEmission is the shortest interval between two GCRA cells. The
	// theoretical arrival time is an absolute Unix time in microseconds,
	// kept to a quarter of a microsecond by a float64; faster cells would
	// lose their increments to rounding.
	minEmission = 10 * time.Microsecond
)

// Spec describes a rule as a user writes it. NewRule validates it.
type Spec struct {
	// Name identifies the rule in keys, headers and metrics: [a-z0-9_-]+.
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
	// means 1.
	Cost int64
}

// Rule is a validated Spec, immutable and safe to share between goroutines.
// Build it with NewRule.
type Rule struct {
	spec Spec
	// Derived once so that decisions do not recompute them.
	window   int64 // microseconds
	delay    int64 // microseconds
	capacity int64 // the most cost units the rule ever admits at once
	suffix   string
}

// RuleError reports an invalid rule: which rule and which field.
type RuleError struct {
	Rule  string // the rule's name, possibly empty or invalid itself
	Field string // name, algorithm, limit, window, burst, delay or cost
	Err   error
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("rule %q: %s: %v", e.Rule, e.Field, e.Err)
}

func (e *RuleError) Unwrap() error { return e.Err }

// ErrInvalid is wrapped by every RuleError and by Decide's request errors.
var ErrInvalid = errors.New("invalid")

// invalidError is a message that errors.Is reports as ErrInvalid.
type invalidError string

func (e invalidError) Error() string        { return string(e) }
func (e invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(format string, args ...any) error {
	return invalidError(fmt.Sprintf(format, args...))
}

// NewRule validates s and returns the rule. Every problem is reported as a
// *RuleError naming the field; when several fields are wrong, all are joined.
func NewRule(s Spec) (*Rule, error) {
	var errs []error
	fail := func(field string, err error) {
		errs = append(errs, &RuleError{Rule: s.Name, Field: field, Err: err})
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
		if !s.Algorithm.usesBurst() && s.Algorithm.valid() {
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
	r := &Rule{
		spec:   s,
		window: s.Window.Microseconds(),
		delay:  s.Delay.Microseconds(),
		suffix: keySuffix[s.Algorithm],
	}
	if s.Algorithm == GCRA && s.Window/time.Duration(s.Limit) < minEmission {
		return nil, &RuleError{Rule: s.Name, Field: "limit", Err: invalid(
			"%d per %v is faster than gcra can count (one request per %v at most); use token_bucket", s.Limit, s.Window, minEmission)}
	}
	r.capacity = r.maxCost()
	return r, nil
}

// ValidName checks a rule name: 1 to 64 of [a-z0-9_-].
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

// maxCost is the largest cost the rule can ever admit in one request.
func (r *Rule) maxCost() int64 {
	switch r.spec.Algorithm {
	case FixedWindow, SlidingWindowLog, SlidingWindowCounter:
		return r.spec.Limit
	case LeakyBucket:
		if r.delay > 0 {
			// A request may overflow the bucket by what drains during
			// the longest delay: delay·limit/window units.
			extra := float64(r.delay) * float64(r.spec.Limit) / float64(r.window)
			return r.spec.Burst + int64(extra)
		}
	}
	return r.spec.Burst
}

// Name returns the rule's name.
func (r *Rule) Name() string { return r.spec.Name }

// Spec returns the rule's specification with defaults filled in.
func (r *Rule) Spec() Spec { return r.spec }

// Capacity is the largest number of cost units the rule admits at once: the
// limit for the window algorithms, the burst for the others. It is what the
// rate-limit headers call the limit.
func (r *Rule) Capacity() int64 {
	if r.spec.Algorithm.usesBurst() {
		return r.spec.Burst
	}
	return r.spec.Limit
}

// MaxCost is the largest cost one request can have and still be admitted
// some day; a request that costs more is denied with ReasonCostTooHigh.
func (r *Rule) MaxCost() int64 { return r.capacity }
