package guard

import (
	"sync"

	"github.com/authlimit/authlimit/algo"
)

// maxLearnt bounds the policies the guard keeps what it learnt of: far
// more than a front makes on demand (envoyconf.MaxOverrides). Past it, the
// guard forgets them all and learns again.
const maxLearnt = 4096

// learnt is what the guard works out, on first sight, for a policy it was
// not given in Options.Policies: one a front makes on demand, such as a
// limit Envoy sends with a descriptor. Such a policy gets its own deny
// cache id and, with fail mode local, its own division by the local
// divisor, as a given one does. Entries are keyed by the policy's Spec,
// its whole meaning, so that policies rebuilt alike share them and one of
// the same name with another limit does not; they are bounded by
// maxLearnt.
type learnt struct {
	mu   sync.Mutex
	m    map[algo.Spec]learntPolicy
	next uint32 // the next id; 0 until the first
}

type learntPolicy struct {
	// id names the policy in the deny cache; learnt ids start at
	// firstLearntID, above any given policy's.
	id uint32
	// divided is the policy divided for the local store; nil when the
	// local store does not decide or the policy does not divide.
	divided *algo.Policy
}

// firstLearntID is the first learnt id: the given policies' ids are their
// indexes in Options.Policies.
const firstLearntID = 1 << 31

// id returns the deny cache's id of p.
func (g *Guard) id(p *algo.Policy) uint32 {
	if id, ok := g.ids[p]; ok {
		return id
	}
	return g.learn(p).id
}

// learn returns what the guard knows of a policy it was not given,
// working it out on first sight. Ids are never reused while the guard
// runs (they wrap after 2^31 policies learnt), so a forgotten policy's
// cached denials, which expire within a second, answer no other.
func (g *Guard) learn(p *algo.Policy) learntPolicy {
	spec := p.Spec()
	l := &g.learnt
	l.mu.Lock()
	defer l.mu.Unlock()
	if lp, ok := l.m[spec]; ok {
		return lp
	}
	if l.m == nil || len(l.m) >= maxLearnt {
		l.m = make(map[algo.Spec]learntPolicy)
	}
	if l.next < firstLearntID {
		l.next = firstLearntID
	}
	lp := learntPolicy{id: l.next}
	l.next++
	if g.remote && g.failMode == FailLocal {
		d, err := p.Divided(g.divisor)
		if err != nil {
			// Every policy a front makes divides (a fixed window's
			// limit divides down to 1); one that did not would be
			// decided whole by the local store.
			g.log.Warn("policy learnt after start does not divide; the local store decides it whole", "policy", p.Name(), "divisor", g.divisor, "err", err)
		}
		lp.divided = d
	}
	l.m[spec] = lp
	return lp
}
