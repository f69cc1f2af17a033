package algo

import "time"

// Request asks one rule about one key.
type Request struct {
	// Rule is the rule to apply.
	Rule *Rule
	// Key is what the rule limits, such as a client IP or an API key, in
	// any bytes: the stores make it safe (see StorageKey).
	Key string
	// Cost is the weight of the request; zero means the rule's Cost.
	Cost int64
	// Shadow makes the rule advisory: it is decided, and it consumes when
	// the request is admitted and it allows, but its denial does not deny
	// the request.
	Shadow bool
}

// EffectiveCost is the request's cost, or the rule's when it states none.
func (q Request) EffectiveCost() int64 {
	if q.Cost == 0 {
		return q.Rule.spec.Cost
	}
	return q.Cost
}

// Reason says why a rule denied a request.
type Reason uint8

// The reasons. Their numeric values are part of the Lua script's reply.
const (
	// ReasonNone: the rule allows the request.
	ReasonNone Reason = iota
	// ReasonLimited: the quota is used up; RetryAfter says until when.
	ReasonLimited
	// ReasonCostTooHigh: the request costs more than the rule can ever
	// admit at once; retrying will not help and RetryAfter is zero.
	ReasonCostTooHigh
)

// String names the reason for logs and response bodies.
func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonLimited:
		return "limited"
	case ReasonCostTooHigh:
		return "cost_too_high"
	}
	return "unknown"
}

// Result is one rule's answer to one request.
type Result struct {
	// Allowed reports whether this rule alone admits the request. In a
	// decision that another rule denies, an allowing rule consumes nothing
	// and its other fields describe its unchanged state.
	Allowed bool
	// Reason is ReasonNone when Allowed, else why the rule denied.
	Reason Reason
	// Limit is the rule's capacity (Rule.Capacity).
	Limit int64
	// Remaining is how many cost units the rule would still admit at once
	// after this decision, never negative.
	Remaining int64
	// ResetAfter is the time until the rule's quota is entirely back, or,
	// for the window algorithms, until the window that holds its last
	// admission ends. Zero when nothing is used.
	ResetAfter time.Duration
	// RetryAfter is, when the rule denied with ReasonLimited, the time until
	// a request of the same cost would pass; zero otherwise.
	RetryAfter time.Duration
	// Delay is, for a shaping leaky bucket that admitted the request, how
	// long the caller should hold it before letting it through.
	Delay time.Duration
}

// micros converts microseconds to a Duration.
func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
