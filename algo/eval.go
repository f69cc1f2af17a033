package algo

import "math"

// This file is the arithmetic of the algorithms in Go. scripts/decide.lua
// does the same arithmetic in Lua, step for step and in the same order of
// floating-point operations, so that both stores give identical answers: Lua
// numbers are IEEE doubles like float64, and every product that is then
// added or subtracted is rounded by an explicit float64 conversion so the Go
// compiler cannot fuse it into a multiply-add that Lua would not do. Times
// are microseconds since the epoch (see SinceEpoch); every time and duration
// is an exact integer below 2^53.
//
// State validity never depends on expiry: stale state (an old window, a
// refilled bucket, a paid-back debt) reads the same as no state, so a key
// that outlives its TTL, or a TTL that outlives its key, changes no answer.

// state is one policy's state for one key: three numbers whose meaning
// depends on the algorithm. All are exact integers except where noted.
//
//	fixed_window            a window index, b its count
//	sliding_window_counter  a window index, b its count, c the previous window's count
//	token_bucket            a last update, b tokens (fractional)
//	leaky_bucket, gcra      a last update, b level (fractional)
//
// sliding_window_log keeps an entryLog instead.
type state struct{ a, b, c float64 }

// outcome is one policy's answer before it is known whether every policy of
// the decision admits the request.
type outcome struct {
	// held is the answer if nothing is consumed: Allowed says whether
	// this policy would admit the request; the counts describe the state
	// as it is; RetryAfter is set when the policy denies.
	held Result
	// taken is the answer once the request is admitted (when
	// held.Allowed): the counts after consuming, and any Delay.
	taken Result
	// next is the state to store once the request is admitted.
	next state
}

// maxRetrySteps bounds the microseconds a retry-after estimate is raised by
// when checked: the estimate is a ceiling of the exact wait, off by at most
// a rounding.
const maxRetrySteps = 4

// decide computes p's outcome at now for a request of the given cost against
// s, present or not. Sliding window logs use decideLog.
func (p *Policy) decide(s *state, present bool, now, cost int64) (o outcome) {
	switch p.spec.Algorithm {
	case FixedWindow:
		p.fixedWindow(s, present, now, cost, &o)
	case SlidingWindowCounter:
		p.slidingCounter(s, present, now, cost, &o)
	case TokenBucket:
		p.tokenBucket(s, present, now, cost, &o)
	case LeakyBucket, GCRA:
		p.leakyBucket(s, present, now, cost, &o)
	}
	p.finish(&o, cost)
	return o
}

// finish fills what every algorithm's outcome shares.
func (p *Policy) finish(o *outcome, cost int64) {
	o.held.Limit = p.Capacity()
	switch {
	case cost > p.maxCost:
		o.held.Allowed = false
		o.held.Reason = ReasonCostTooHigh
		o.held.RetryAfter = 0
	case o.held.Allowed:
		o.taken.Allowed = true
		o.taken.Limit = o.held.Limit
	default:
		o.held.Reason = ReasonLimited
	}
}

func (p *Policy) fixedWindow(s *state, present bool, now, cost int64, o *outcome) {
	W, L := p.window, p.spec.Limit
	idx := now / W
	var n int64
	if present && int64(s.a) >= idx {
		// A later window than now's means the clock stepped back:
		// stay in the later window rather than open a fresh one.
		idx, n = int64(s.a), int64(s.b)
	}
	end := (idx+1)*W - now
	o.held.Remaining = L - n
	if n > 0 {
		o.held.ResetAfter = micros(end)
	}
	if cost > p.maxCost || n+cost > L {
		o.held.RetryAfter = micros(end)
		return
	}
	o.held.Allowed = true
	o.taken.Remaining = L - n - cost
	o.taken.ResetAfter = micros(end)
	o.next = state{a: float64(idx), b: float64(n + cost)}
}

// counterWindows reads a sliding_window_counter state at now: the current
// window's index, its count and the previous window's count.
func (p *Policy) counterWindows(s *state, present bool, now int64) (idx, cur, prev int64) {
	idx = now / p.window
	if present {
		switch w := int64(s.a); {
		case w >= idx:
			idx, cur, prev = w, int64(s.b), int64(s.c)
		case w == idx-1:
			prev = int64(s.b)
		}
	}
	return idx, cur, prev
}

// counterEstimate is the sliding estimate e microseconds into a window.
func counterEstimate(W, e, cur, prev int64) float64 {
	return float64(float64(prev)*float64(W-e))/float64(W) + float64(cur)
}

func (p *Policy) slidingCounter(s *state, present bool, now, cost int64, o *outcome) {
	W, L := p.window, p.spec.Limit
	idx, cur, prev := p.counterWindows(s, present, now)
	e := max(now-idx*W, 0) // elapsed in the current window
	fL := float64(L)
	est := counterEstimate(W, e, cur, prev)
	o.held.Remaining = max(int64(math.Floor(fL-est)), 0)
	switch {
	case cur > 0:
		o.held.ResetAfter = micros(2*W - e)
	case prev > 0:
		o.held.ResetAfter = micros(W - e)
	}
	switch {
	case cost > p.maxCost:
	case est+float64(cost) <= fL:
		o.held.Allowed = true
		o.taken.Remaining = max(int64(math.Floor(fL-est-float64(cost))), 0)
		o.taken.ResetAfter = micros(2*W - e)
		o.next = state{a: float64(idx), b: float64(cur + cost), c: float64(prev)}
	default:
		var wait int64
		if cur+cost <= L {
			// Only the previous window's weight must shrink: wait
			// until prev·(W−e′)/W ≤ L−cur−cost.
			at := float64(W) - float64(float64(L-cur-cost)*float64(W))/float64(prev)
			wait = max(int64(math.Ceil(at-float64(e))), 1)
		} else {
			// Wait into the next window, where this window's count
			// becomes the previous one: cur·(W−e″)/W ≤ L−cost.
			at := float64(W) - float64(float64(L-cost)*float64(W))/float64(cur)
			wait = W - e + max(int64(math.Ceil(at)), 0)
		}
		for i := 0; i < maxRetrySteps && !p.counterAdmits(s, present, now+wait, cost); i++ {
			wait++
		}
		o.held.RetryAfter = micros(wait)
	}
}

// counterAdmits reports whether the unchanged state admits cost at time at.
func (p *Policy) counterAdmits(s *state, present bool, at, cost int64) bool {
	idx, cur, prev := p.counterWindows(s, present, at)
	e := max(at-idx*p.window, 0)
	return counterEstimate(p.window, e, cur, prev)+float64(cost) <= float64(p.spec.Limit)
}

// tokensAt is a token bucket's tokens at now.
func (p *Policy) tokensAt(s *state, present bool, now int64) float64 {
	B := float64(p.spec.Burst)
	if !present {
		return B
	}
	refill := float64(float64(max(now-int64(s.a), 0))*float64(p.spec.Limit)) / float64(p.window)
	return math.Min(B, s.b+refill)
}

// timeFor is the time, rounded up to a microsecond, that units take to refill
// or drain at the policy's rate.
func (p *Policy) timeFor(units float64) int64 {
	return int64(math.Ceil(float64(units*float64(p.window)) / float64(p.spec.Limit)))
}

func (p *Policy) tokenBucket(s *state, present bool, now, cost int64, o *outcome) {
	B := float64(p.spec.Burst)
	tokens := p.tokensAt(s, present, now)
	c := float64(cost)
	o.held.Remaining = int64(math.Floor(tokens))
	o.held.ResetAfter = micros(p.timeFor(B - tokens))
	if cost > p.maxCost {
		return
	}
	if tokens < c {
		wait := p.timeFor(c - tokens)
		for i := 0; i < maxRetrySteps && p.tokensAt(s, present, now+wait) < c; i++ {
			wait++
		}
		o.held.RetryAfter = micros(wait)
		return
	}
	tokens -= c
	o.held.Allowed = true
	o.taken.Remaining = int64(math.Floor(tokens))
	o.taken.ResetAfter = micros(p.timeFor(B - tokens))
	o.next = state{a: float64(now), b: tokens}
}

// levelAt is a leaky bucket's level at now.
func (p *Policy) levelAt(s *state, present bool, now int64) float64 {
	if !present {
		return 0
	}
	drained := float64(float64(max(now-int64(s.a), 0))*float64(p.spec.Limit)) / float64(p.window)
	return math.Max(0, s.b-drained)
}

// leakWait is how long a request of cost waits at the given level until
// enough has drained for it to fit.
func leakWait(level float64, cost int64, p *Policy) int64 {
	over := level + float64(cost) - float64(p.spec.Burst)
	if over <= 0 {
		return 0
	}
	return p.timeFor(over)
}

// leakyBucket decides leaky_bucket and gcra. GCRA's theoretical arrival
// time, less now, is the bucket's level in emission intervals: the two are
// one algorithm, and counting the level in requests rather than the arrival
// time in microseconds keeps every burst exact, however high the rate
// (gcra has no delay).
func (p *Policy) leakyBucket(s *state, present bool, now, cost int64, o *outcome) {
	B := float64(p.spec.Burst)
	level := p.levelAt(s, present, now)
	o.held.Remaining = max(int64(math.Floor(B-level)), 0)
	o.held.ResetAfter = micros(p.timeFor(level))
	if cost > p.maxCost {
		return
	}
	wait := leakWait(level, cost, p)
	if wait > p.delay {
		retry := wait - p.delay
		for i := 0; i < maxRetrySteps && leakWait(p.levelAt(s, present, now+retry), cost, p) > p.delay; i++ {
			retry++
		}
		o.held.RetryAfter = micros(retry)
		return
	}
	level += float64(cost)
	o.held.Allowed = true
	o.taken.Delay = micros(wait)
	o.taken.Remaining = max(int64(math.Floor(B-level)), 0)
	o.taken.ResetAfter = micros(p.timeFor(level))
	o.next = state{a: float64(now), b: level}
}

// expiry is the time after which s reads the same as no state, for
// sweeping and eviction.
func (p *Policy) expiry(s *state) int64 {
	W := p.window
	switch p.spec.Algorithm {
	case FixedWindow:
		return (int64(s.a) + 1) * W
	case SlidingWindowCounter:
		return (int64(s.a) + 2) * W
	case TokenBucket:
		return int64(s.a) + p.timeFor(float64(p.spec.Burst)-s.b)
	case LeakyBucket, GCRA:
		return int64(s.a) + p.timeFor(s.b)
	}
	return 0
}
