package main

import (
	"sync"
	"time"

	"github.com/authlimit/authlimit/algo"
)

// windowLog remembers the window of every fixed_window and
// sliding_window_counter policy that has been in force, rules' and
// AUTHLIMIT_RLS_CONFIG's, until the state it kept may have expired: a
// reload that gives such a policy another window is refused while state
// of the old window may live, whatever came in between. Without it,
// changing the algorithm (or removing the rule) in one reload and coming
// back with a new window in the next would read the old windows' counts
// under the new length, where they mean nothing: a window far in the
// future, or a fresh quota.
type windowLog struct {
	mu   sync.Mutex
	seen map[policyID]windowSeen
}

// policyID is a policy's identity in the stores: its state's.
type policyID struct {
	name string
	alg  algo.Algorithm
}

// windowSeen is a policy's window, and until when its state may live: the
// zero time while the policy is in force.
type windowSeen struct {
	window time.Duration
	until  time.Time
}

// stateLife bounds how long a windowed policy's state lives after its
// last decision: a sliding_window_counter's key holds the previous window
// too.
const stateLife = 2

func windowed(p *algo.Policy) bool {
	a := p.Spec().Algorithm
	return a == algo.FixedWindow || a == algo.SlidingWindowCounter
}

// newWindowLog starts a log with the policies in force.
func newWindowLog(inForce []*algo.Policy) *windowLog {
	w := &windowLog{seen: map[policyID]windowSeen{}}
	w.replace(nil, inForce, time.Time{})
	return w
}

// conflict reports the window p's state may still have, when it is not
// p's, and until when it may live (zero: in force).
func (w *windowLog) conflict(p *algo.Policy, now time.Time) (old time.Duration, until time.Time, ok bool) {
	if !windowed(p) {
		return 0, time.Time{}, false
	}
	s := p.Spec()
	w.mu.Lock()
	defer w.mu.Unlock()
	seen, known := w.seen[policyID{s.Name, s.Algorithm}]
	if !known || seen.window == s.Window || !seen.until.IsZero() && !now.Before(seen.until) {
		return 0, time.Time{}, false
	}
	return seen.window, seen.until, true
}

// replace records that next's policies are in force instead of old's, at
// now: old's state lives on for stateLife windows, unless next keeps them.
// Entries whose state has expired are forgotten.
func (w *windowLog) replace(old, next []*algo.Policy, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, seen := range w.seen {
		if !seen.until.IsZero() && !now.Before(seen.until) {
			delete(w.seen, id)
		}
	}
	for _, p := range old {
		if s := p.Spec(); windowed(p) {
			w.seen[policyID{s.Name, s.Algorithm}] = windowSeen{s.Window, now.Add(stateLife * s.Window)}
		}
	}
	for _, p := range next {
		if s := p.Spec(); windowed(p) {
			w.seen[policyID{s.Name, s.Algorithm}] = windowSeen{window: s.Window}
		}
	}
}
