package algo

import (
	"time"

	"github.com/authlimit/authlimit/scripts"
)

// Request asks one policy about one key.
type Request struct {
	// Policy is the policy to apply.
	Policy *Policy
	// Key is what the policy limits, such as a client IP or an API key, as
	// a key tag: AppendTag turns any bytes into one. The stores refuse a
	// Key that is not a tag. Key may alias memory the caller reuses once
	// Decide returns: stores copy what they keep.
	Key []byte
	// Cost is the weight of the request; zero means the policy's Cost.
	Cost int64
	// Shadow makes the policy advisory: it is decided, and it consumes when
	// the request is admitted and it allows, but its denial does not deny
	// the request.
	Shadow bool
}

// EffectiveCost is the request's cost, or the policy's when it states none.
func (q *Request) EffectiveCost() int64 {
	if q.Cost == 0 {
		return q.Policy.spec.Cost
	}
	return q.Cost
}

// Reason says why a policy denied a request.
type Reason uint8

// The reasons. Their numeric values are the Lua script's reply's (package
// scripts' wire numbers).
const (
	// ReasonNone: the policy allows the request.
	ReasonNone Reason = scripts.ReasonNone
	// ReasonLimited: the quota is used up; RetryAfter says until when.
	ReasonLimited Reason = scripts.ReasonLimited
	// ReasonCostTooHigh: the request costs more than the policy can ever
	// admit at once; retrying will not help and RetryAfter is zero.
	ReasonCostTooHigh Reason = scripts.ReasonCostTooHigh
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

// Result is one policy's answer to one request.
type Result struct {
	// Allowed reports whether this policy alone admits the request. In a
	// decision that another policy denies, an allowing policy consumes
	// nothing and its other fields describe its unchanged state.
	Allowed bool
	// Reason is ReasonNone when Allowed, else why the policy denied.
	Reason Reason
	// Limit is the policy's capacity (Policy.Capacity).
	Limit int64
	// Remaining is how many cost units the policy would still admit at
	// once after this decision, never negative.
	Remaining int64
	// ResetAfter is the time until the policy's quota is entirely back,
	// or, for the window algorithms, until the window that holds its last
	// admission ends. Zero when nothing is used.
	ResetAfter time.Duration
	// RetryAfter is, when the policy denied with ReasonLimited, the time
	// after which a request of the same cost passes if nothing else
	// consumes meanwhile (waiting it always suffices); zero otherwise.
	// For a new key that a full memory store refused (see
	// MemoryOptions.MaxKeys), it is the time until the soonest state the
	// store knows of expires, after which there may be room.
	RetryAfter time.Duration
	// Delay is, for a shaping leaky bucket that admitted the request, how
	// long the caller should hold it before letting it through.
	Delay time.Duration
	// NotDecided reports that the policy was not asked: another policy's
	// denial answered the request before the store was (the guard's deny
	// cache). Nothing was consumed and the policy's state is unknown:
	// Allowed is true (it denied nothing), Limit is its capacity, and
	// Remaining and the durations are zero. The stores never set it.
	NotDecided bool
}

// micros converts microseconds to a Duration.
func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// SinceEpoch converts a wall-clock time to the stores' microseconds: since
// scripts.EpochMicros, 2020-01-01T00:00:00Z, for both stores. A clock
// before it reads as it.
func SinceEpoch(t time.Time) int64 { return max(t.UnixMicro()-scripts.EpochMicros, 0) }
