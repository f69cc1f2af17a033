package algo

import "math"

// This file is the arithmetic of the six algorithms in Go. scripts/decide.lua
// does the same arithmetic in Lua, step for step and in the same order of
// floating-point operations, so that both stores give identical answers: Lua
// numbers are IEEE doubles like float64, and every product below is rounded
// by an explicit float64 conversion so the Go compiler cannot fuse it into a
// multiply-add that Lua would not do. Times are Unix microseconds.
//
// State validity never depends on expiry: stale state (an old window, a
// refilled bucket, a past arrival time) reads the same as no state, so a key
// that outlives its TTL, or a TTL that outlives its key, changes no answer.

// state is one rule's state for one key. The fields each algorithm uses:
//
//	fixed_window            w window index, n count
//	sliding_window_log      log entries, n their total cost
//	sliding_window_counter  w current window index, n its count, p the previous window's count
//	token_bucket            x tokens, t last update
//	leaky_bucket            x level, t last update
//	gcra                    x theoretical arrival time
type state struct {
	present bool
	expires int64 // after this instant the state reads as none; only for sweeping
	w, n, p int64
	x       float64
	t       int64
	log     entryLog
}

// outcome is one rule's answer before it is known whether every rule of the
// decision admits the request.
type outcome struct {
	// held is the answer if nothing is consumed: Allowed says whether
	// this rule would admit the request; the counts describe the state as
	// it is; RetryAfter is set when the rule denies.
	held Result
	// taken is the answer once the request is admitted (when
	// held.Allowed): the counts after consuming, and any Delay.
	taken Result
	// next is the state to store once the request is admitted.
	next state
}

// decide computes rule r's outcome at now for a request of the given cost
// against s. It does not change what s means (it may drop expired log
// entries). If every rule admits, commit(s, o.next, now, cost) records it.
func (r *Rule) decide(s *state, now, cost int64) (o outcome) {
	switch r.spec.Algorithm {
	case FixedWindow:
		r.fixedWindow(s, now, cost, &o)
	case SlidingWindowLog:
		r.slidingLog(s, now, cost, &o)
	case SlidingWindowCounter:
		r.slidingCounter(s, now, cost, &o)
	case TokenBucket:
		r.tokenBucket(s, now, cost, &o)
	case LeakyBucket:
		r.leakyBucket(s, now, cost, &o)
	case GCRA:
		r.gcra(s, now, cost, &o)
	}
	o.held.Limit = r.Capacity()
	switch {
	case o.held.Allowed:
		o.taken.Allowed = true
		o.taken.Limit = o.held.Limit
	case cost > r.capacity:
		o.held.Reason = ReasonCostTooHigh
		o.held.RetryAfter = 0
	default:
		o.held.Reason = ReasonLimited
	}
	return o
}

// commit stores an admitted request's state.
func (r *Rule) commit(s *state, next state, now, cost int64) {
	if r.spec.Algorithm == SlidingWindowLog {
		s.log.push(now, cost)
		s.n += cost
		s.present = true
		s.expires = next.expires
		return
	}
	log := s.log
	*s = next
	s.log = log
}

func (r *Rule) fixedWindow(s *state, now, cost int64, o *outcome) {
	W, L := r.window, r.spec.Limit
	idx := now / W
	var n int64
	if s.present && s.w >= idx {
		// A later window than now's means the clock stepped back:
		// stay in the later window rather than open a fresh one.
		idx, n = s.w, s.n
	}
	end := (idx+1)*W - now
	o.held.Remaining = L - n
	if n > 0 {
		o.held.ResetAfter = micros(end)
	}
	if cost > r.capacity || n+cost > L {
		o.held.RetryAfter = micros(end)
		return
	}
	o.held.Allowed = true
	o.taken.Remaining = L - n - cost
	o.taken.ResetAfter = micros(end)
	o.next = state{present: true, expires: now + end, w: idx, n: n + cost}
}

func (r *Rule) slidingLog(s *state, now, cost int64, o *outcome) {
	W, L := r.window, r.spec.Limit
	if s.present {
		s.n -= s.log.dropThrough(now - W)
	}
	n := s.n
	o.held.Remaining = L - n
	if n > 0 {
		o.held.ResetAfter = micros(s.log.newest() + W - now)
	}
	if cost > r.capacity || n+cost > L {
		// The oldest entries must leave until the request fits.
		if ts, ok := s.log.freeing(n + cost - L); ok {
			o.held.RetryAfter = micros(ts + W - now)
		}
		return
	}
	o.held.Allowed = true
	o.taken.Remaining = L - n - cost
	o.taken.ResetAfter = micros(W)
	o.next = state{expires: now + W}
}

func (r *Rule) slidingCounter(s *state, now, cost int64, o *outcome) {
	W, L := r.window, r.spec.Limit
	idx := now / W
	var cur, prev int64
	if s.present {
		switch {
		case s.w >= idx:
			idx, cur, prev = s.w, s.n, s.p
		case s.w == idx-1:
			prev = s.n
		}
	}
	e := max(now-idx*W, 0) // elapsed in the current window
	fW, fL := float64(W), float64(L)
	est := float64(float64(prev)*float64(W-e))/fW + float64(cur)
	o.held.Remaining = max(int64(math.Floor(fL-est)), 0)
	switch {
	case cur > 0:
		o.held.ResetAfter = micros(2*W - e)
	case prev > 0:
		o.held.ResetAfter = micros(W - e)
	}
	switch {
	case cost > r.capacity:
	case est+float64(cost) <= fL:
		o.held.Allowed = true
		o.taken.Remaining = max(int64(math.Floor(fL-est-float64(cost))), 0)
		o.taken.ResetAfter = micros(2*W - e)
		o.next = state{present: true, expires: now + 2*W - e, w: idx, n: cur + cost, p: prev}
	case cur+cost <= L:
		// Only the previous window's weight must shrink: wait until
		// prev·(W−e′)/W ≤ L−cur−cost.
		at := fW - float64(float64(L-cur-cost)*fW)/float64(prev)
		o.held.RetryAfter = micros(max(int64(math.Ceil(at-float64(e))), 1))
	default:
		// Wait into the next window, where this window's count becomes
		// the previous one: cur·(W−e″)/W ≤ L−cost.
		at := fW - float64(float64(L-cost)*fW)/float64(cur)
		o.held.RetryAfter = micros(W - e + max(int64(math.Ceil(at)), 0))
	}
}

func (r *Rule) tokenBucket(s *state, now, cost int64, o *outcome) {
	W, L, B := float64(r.window), float64(r.spec.Limit), float64(r.spec.Burst)
	tokens := B
	if s.present {
		tokens = math.Min(B, s.x+float64(float64(max(now-s.t, 0))*L)/W)
	}
	c := float64(cost)
	o.held.Remaining = int64(math.Floor(tokens))
	o.held.ResetAfter = micros(ceilMicros(float64((B-tokens)*W) / L))
	if cost > r.capacity || tokens < c {
		o.held.RetryAfter = micros(ceilMicros(float64((c-tokens)*W) / L))
		return
	}
	tokens -= c
	full := ceilMicros(float64((B-tokens)*W) / L)
	o.held.Allowed = true
	o.taken.Remaining = int64(math.Floor(tokens))
	o.taken.ResetAfter = micros(full)
	o.next = state{present: true, expires: now + full, x: tokens, t: now}
}

func (r *Rule) leakyBucket(s *state, now, cost int64, o *outcome) {
	W, L, B := float64(r.window), float64(r.spec.Limit), float64(r.spec.Burst)
	var level float64
	if s.present {
		level = math.Max(0, s.x-float64(float64(max(now-s.t, 0))*L)/W)
	}
	c := float64(cost)
	o.held.Remaining = max(int64(math.Floor(B-level)), 0)
	o.held.ResetAfter = micros(ceilMicros(float64(level*W) / L))
	if cost > r.capacity {
		return
	}
	// The request waits until enough has drained for it to fit.
	var wait int64
	if over := level + c - B; over > 0 {
		wait = ceilMicros(float64(over*W) / L)
	}
	if wait > r.delay {
		o.held.RetryAfter = micros(wait - r.delay)
		return
	}
	level += c
	empty := ceilMicros(float64(level*W) / L)
	o.held.Allowed = true
	o.taken.Remaining = max(int64(math.Floor(B-level)), 0)
	o.taken.ResetAfter = micros(empty)
	o.taken.Delay = micros(wait)
	o.next = state{present: true, expires: now + empty, x: level, t: now}
}

func (r *Rule) gcra(s *state, now, cost int64, o *outcome) {
	T := float64(r.window) / float64(r.spec.Limit) // emission interval
	tolerance := float64(T * float64(r.spec.Burst))
	fnow := float64(now)
	tat := fnow
	if s.present {
		tat = math.Max(s.x, fnow)
	}
	o.held.Remaining = max(int64(math.Floor((tolerance-(tat-fnow))/T)), 0)
	o.held.ResetAfter = micros(ceilMicros(tat - fnow))
	if cost > r.capacity {
		return
	}
	newTAT := tat + float64(T*float64(cost))
	if wait := newTAT - tolerance - fnow; wait > 0 {
		o.held.RetryAfter = micros(ceilMicros(wait))
		return
	}
	o.held.Allowed = true
	o.taken.Remaining = max(int64(math.Floor((tolerance-(newTAT-fnow))/T)), 0)
	o.taken.ResetAfter = micros(ceilMicros(newTAT - fnow))
	o.next = state{present: true, expires: now + ceilMicros(newTAT-fnow), x: newTAT}
}

func ceilMicros(us float64) int64 { return int64(math.Ceil(us)) }
