package handler

import (
	"sync"
	"sync/atomic"
	"time"
)

// circuit states, as the authlimit_circuit_state gauge reports them.
const (
	circuitClosed   int32 = 0 // the store is called
	circuitHalfOpen int32 = 1 // one probe is let through
	circuitOpen     int32 = 2 // the store is not called until the backoff passes
)

func circuitName(s int32) string {
	switch s {
	case circuitClosed:
		return "closed"
	case circuitHalfOpen:
		return "half_open"
	}
	return "open"
}

// breaker stops calling a failing store: after threshold consecutive
// failures it opens for a backoff, then lets one probe through (half open);
// the probe's success closes it, its failure reopens it for twice as long,
// up to maxBackoff. The closed state costs one atomic load per request.
type breaker struct {
	state atomic.Int32

	mu          sync.Mutex
	failures    int
	threshold   int
	minBackoff  time.Duration
	maxBackoff  time.Duration
	backoff     time.Duration
	openUntil   time.Time
	probing     bool
	now         func() time.Time
	onChange    func(from, to int32)
	onTransient func() // called when a failure does not change the state
}

func newBreaker(threshold int, minBackoff, maxBackoff time.Duration, now func() time.Time, onChange func(from, to int32)) *breaker {
	return &breaker{
		threshold:  max(threshold, 1),
		minBackoff: minBackoff,
		maxBackoff: max(maxBackoff, minBackoff),
		backoff:    minBackoff,
		now:        now,
		onChange:   onChange,
	}
}

// allow reports whether to call the store now. While half open it is true
// for one caller, the probe, until that probe reports.
func (b *breaker) allow() bool {
	if b.state.Load() == circuitClosed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case circuitClosed:
		return true
	case circuitOpen:
		if b.now().Before(b.openUntil) {
			return false
		}
		b.set(circuitHalfOpen)
	}
	if b.probing {
		return false
	}
	b.probing = true
	return true
}

// success reports a store call that answered.
func (b *breaker) success() {
	if b.state.Load() == circuitClosed {
		b.mu.Lock()
		b.failures = 0
		b.mu.Unlock()
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	b.failures = 0
	b.backoff = b.minBackoff
	b.set(circuitClosed)
}

// failure reports a store call that failed or timed out.
func (b *breaker) failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case circuitClosed:
		if b.failures++; b.failures < b.threshold {
			return
		}
	case circuitHalfOpen:
		b.probing = false
		b.backoff = min(2*b.backoff, b.maxBackoff)
	case circuitOpen:
		return // a call that started before the circuit opened
	}
	b.openUntil = b.now().Add(b.backoff)
	b.set(circuitOpen)
}

func (b *breaker) set(to int32) {
	from := b.state.Swap(to)
	if from != to && b.onChange != nil {
		b.onChange(from, to)
	}
}
