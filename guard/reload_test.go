package guard

import (
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

// renewed returns f's policy rebuilt with another limit: the same name and
// algorithm, as a reloaded rule set gives it.
func (f *fixture) renewed(t *testing.T, limit int64) *algo.Policy {
	t.Helper()
	s := f.p.Spec()
	s.Limit, s.Burst, s.Cost = limit, 0, 0
	p, err := algo.NewPolicy(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNewRuleSetCarriesTheFallbackOver: after a new rule set is in force, the
// local store decides the new limit divided, continuing from what the
// store admitted under the old one.
func TestNewRuleSetCarriesTheFallbackOver(t *testing.T) {
	f := newFixture(t, FailLocal)
	for i := 0; i < 4; i++ {
		if _, ok, err := f.decide(t, "a"); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	f.rules.Store(rulesettest.Holder(t, nil, f.renewed(t, 20)).Load(), time.Now())
	f.p = f.renewed(t, 20) // another pointer again: identity, not pointer, counts
	f.store.breakShard(1, errDown)
	// Local limit 20/2 = 10; 4 already admitted by the store.
	if got := f.admitted(t, "a", 12); got != 6 {
		t.Errorf("the local fallback admitted %d after the store admitted 4 of its 10, want 6", got)
	}
}

// TestNewRuleSetForgetsDenials: a denial the deny cache remembers was
// decided under the previous limit; a raised limit admits at once.
func TestNewRuleSetForgetsDenials(t *testing.T) {
	f := newFixture(t, FailLocal)
	for i := 0; i < 10; i++ {
		f.decide(t, "b")
	}
	for i := 0; i < 2; i++ {
		if _, ok, _ := f.decide(t, "b"); ok {
			t.Fatal("the 11th request of a limit of 10 admitted")
		}
	}
	f.rules.Store(rulesettest.Holder(t, nil, f.renewed(t, 20)).Load(), time.Now())
	f.p = f.renewed(t, 20)
	res, ok, err := f.decide(t, "b")
	if err != nil || !ok {
		t.Fatalf("under a limit raised to 20, the 11th request: %+v %v %v (still denied from the deny cache?)", res, ok, err)
	}
	if got, want := res.Remaining, int64(9); got != want {
		t.Errorf("Remaining = %d, want %d", got, want)
	}
}

// TestNewRuleSetLocalShareFollows: once a policy's limit is raised by a
// new rule set, the local fallback admits this replica's share of
// the new limit (20/2), charging each request twice its cost.
func TestNewRuleSetLocalShareFollows(t *testing.T) {
	f := newFixture(t, FailLocal)
	f.rules.Store(rulesettest.Holder(t, nil, f.renewed(t, 20)).Load(), time.Now())
	f.p = f.renewed(t, 20)
	f.store.breakShard(1, errDown)
	if got := f.admitted(t, "a", 15); got != 10 {
		t.Errorf("the local fallback admitted %d, want the new policy's share, 10", got)
	}
}
