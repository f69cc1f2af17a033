package ruleset

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/rules"
)

// Holder keeps the set in force, and the windows of every fixed_window and
// sliding_window_counter policy that has been in force until the state it
// kept may have expired. Load is safe from any goroutine; WithRules,
// WithRLS and Store are the reloader's.
//
// The windows outlive the sets: a reload that gives such a policy another
// window is refused while state of the old window may live, whatever came
// in between. Without that, changing the algorithm (or removing the rule)
// in one reload and coming back with a new window in the next would read
// the old windows' counts under the new length, where they mean nothing: a
// window far in the future, or a fresh quota.
type Holder struct {
	cur atomic.Pointer[Set]

	mu   sync.Mutex
	seen map[algo.Identity]windowSeen
}

// windowSeen is a policy's window, and until when its state may live: the
// zero time while the policy is in force.
type windowSeen struct {
	window time.Duration
	until  time.Time
}

// stateLife bounds, in windows, how long a windowed policy's state lives
// after its last decision: a sliding_window_counter's key holds the
// previous window too.
const stateLife = 2

// NewHolder returns a holder with s in force.
func NewHolder(s *Set) *Holder {
	h := &Holder{seen: map[algo.Identity]windowSeen{}}
	h.cur.Store(s)
	h.replace(nil, s.policies, time.Time{})
	return h
}

// Load returns the set in force. A request reads it once and decides
// under it from start to end.
func (h *Holder) Load() *Set { return h.cur.Load() }

// Store puts s in force at now: requests already under way finish under
// the set they started with. The state of the windowed policies s drops
// may live on for two of their windows.
func (h *Holder) Store(s *Set, now time.Time) {
	old := h.cur.Swap(s)
	h.replace(old.policies, s.policies, now)
}

// WithRules returns the set in force with rs in place of its rules. It
// refuses rules that change the window of a fixed_window or
// sliding_window_counter rule under the same name while state of the old
// window may live (at now): that state counts in windows of the old
// length, numbered from the epoch, and read with another length it would
// mean nothing (a window far in the future). A new name starts the rule
// afresh.
func (h *Holder) WithRules(rs []*rules.Rule, now time.Time) (*Set, error) {
	var errs []error
	for i, r := range rs {
		for j, p := range r.Policies() {
			old, until, ok := h.conflict(p, now)
			if !ok {
				continue
			}
			what := ""
			switch {
			case j == 0:
			case j <= len(r.Tiers):
				what = fmt.Sprintf("tier %q: ", r.Tiers[j-1].Name)
			default:
				what = "an override: "
			}
			s := p.Spec()
			errs = append(errs, fmt.Errorf("rule %d %q: %slimit: the window changes from %v to %v, which %s's counts cannot carry over%s; give the rule a new name to start it afresh", i+1, r.Name, what, old, s.Window, s.Algorithm, liveUntil(until)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return New(rs, h.Load().rls)
}

// WithRLS returns the set in force with cfg in place of its rate-limit
// configuration. It refuses a configuration that changes the unit of a
// fixed_window or sliding_window_counter limit in place while counts of
// the old unit may live (at now): its policy keeps its name (the domain
// and the descriptor path), and its counts, kept in windows of the old
// unit, would mean nothing under the new one.
func (h *Holder) WithRLS(cfg *envoyconf.Config, now time.Time) (*Set, error) {
	cur := h.Load()
	units := map[algo.Identity]*envoyconf.Limit{}
	if cur.rls != nil {
		for _, l := range cur.rls.Limits() {
			if l.Policy != nil {
				units[l.Policy.Identity()] = l
			}
		}
	}
	var errs []error
	if cfg != nil {
		for _, l := range cfg.Limits() {
			if l.Policy == nil {
				continue
			}
			was, until, ok := h.conflict(l.Policy, now)
			if !ok {
				continue
			}
			from := was.String()
			if o, ok := units[l.Policy.Identity()]; ok {
				from = o.Unit.String()
			}
			errs = append(errs, fmt.Errorf("%s: rate_limit.unit: changes from %s to %s, which %s's counts cannot carry over%s; remove the limit, reload, wait for its counts to expire (two of its old windows), then add it with the new unit", l.Key, from, l.Unit, l.Policy.Spec().Algorithm, liveUntil(until)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return New(cur.rules, cfg)
}

// liveUntil says until when counts of an old window may live, when they
// are no longer in force.
func liveUntil(until time.Time) string {
	if until.IsZero() {
		return ""
	}
	return fmt.Sprintf(" (they were in force before, and may live until %s)", until.UTC().Format(time.RFC3339))
}

// windowed reports whether p's state counts in windows numbered from the
// epoch, which a new window length would misread.
func windowed(p *algo.Policy) bool {
	a := p.Spec().Algorithm
	return a == algo.FixedWindow || a == algo.SlidingWindowCounter
}

// conflict reports the window p's state may still have, when it is not
// p's, and until when it may live (zero: in force).
func (h *Holder) conflict(p *algo.Policy, now time.Time) (old time.Duration, until time.Time, ok bool) {
	if !windowed(p) {
		return 0, time.Time{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	seen, known := h.seen[p.Identity()]
	if !known || seen.window == p.Spec().Window || !seen.until.IsZero() && !now.Before(seen.until) {
		return 0, time.Time{}, false
	}
	return seen.window, seen.until, true
}

// replace records that next's policies are in force instead of old's, at
// now: old's state lives on for stateLife windows, unless next keeps them.
// Entries whose state has expired are forgotten.
func (h *Holder) replace(old, next []*algo.Policy, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, seen := range h.seen {
		if !seen.until.IsZero() && !now.Before(seen.until) {
			delete(h.seen, id)
		}
	}
	for _, p := range old {
		if windowed(p) {
			h.seen[p.Identity()] = windowSeen{p.Spec().Window, now.Add(stateLife * p.Spec().Window)}
		}
	}
	for _, p := range next {
		if windowed(p) {
			h.seen[p.Identity()] = windowSeen{window: p.Spec().Window}
		}
	}
}
