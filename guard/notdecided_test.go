package guard

import (
	"context"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
)

func policy(t *testing.T, name string, limit int64) *algo.Policy {
	t.Helper()
	p, err := algo.NewPolicy(algo.Spec{Name: name, Algorithm: algo.FixedWindow, Limit: limit, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPolicyNotGivenIsDivided: a policy the guard was not given (a limit
// Envoy sends with a descriptor) is divided by the local divisor when the
// local store decides, continuing from what the store admitted.
func TestPolicyNotGivenIsDivided(t *testing.T) {
	f := newFixture(t, FailLocal)
	f.p = policy(t, "later", 8) // local: 8/2 = 4
	for i := 0; i < 2; i++ {
		if _, ok, err := f.decide(t, "a"); err != nil || !ok {
			t.Fatalf("request %d through the store: %v %v", i+1, ok, err)
		}
	}
	f.store.breakShard(1, errDown)
	if got := f.admitted(t, "a", 8); got != 2 {
		t.Errorf("the local store admitted %d of an 8/hour not given divided by 2 after the store admitted 2, want 2", got)
	}
	// A policy rebuilt alike is the same policy to the stores.
	f.p = policy(t, "later", 8)
	if _, ok, err := f.decide(t, "a"); err != nil || ok {
		t.Errorf("the policy rebuilt: %v %v, want denied by the local store", ok, err)
	}
}

// TestPoliciesNotGivenShareNoDenials: a denial of a policy the guard was
// not given denies no other policy's request for the same key.
func TestPoliciesNotGivenShareNoDenials(t *testing.T) {
	f := newFixture(t, FailClosed)
	one, five := policy(t, "one", 1), policy(t, "five", 5)
	decide := func(p *algo.Policy) (bool, error) {
		var res [1]algo.Result
		return f.g.Decide(context.Background(), []algo.Request{{Policy: p, Key: []byte("a")}}, res[:])
	}
	for i, want := range []bool{true, false, false} {
		if ok, err := decide(one); err != nil || ok != want {
			t.Fatalf("one/hour, request %d: %v %v, want %v", i+1, ok, err, want)
		}
	}
	for _, p := range []*algo.Policy{five, f.p} {
		if ok, err := decide(p); err != nil || !ok {
			t.Errorf("%s for the key another policy denied: %v %v, want admitted", p.Name(), ok, err)
		}
	}
}

// TestDenyCacheLeavesOthersNotDecided: a denial the deny cache answers
// reports the policies it did not ask as not decided, not as full.
func TestDenyCacheLeavesOthersNotDecided(t *testing.T) {
	f := newFixture(t, FailClosed)
	other := policy(t, "other", 100)
	reqs := []algo.Request{{Policy: other, Key: []byte("b")}, {Policy: f.p, Key: []byte("b")}}
	var res [2]algo.Result
	for i := 0; i < 11; i++ {
		if _, err := f.g.Decide(context.Background(), reqs, res[:]); err != nil {
			t.Fatal(err)
		}
	}
	if res[0].NotDecided || res[0].Remaining != 90 || res[1].Allowed {
		t.Fatalf("the store's denial: %+v", res)
	}
	ok, err := f.g.Decide(context.Background(), reqs, res[:])
	if err != nil || ok || f.metric(t, "authlimit_deny_cache_hits_total") != 1 {
		t.Fatalf("deny cache: %v %v", ok, err)
	}
	if want := (algo.Result{Allowed: true, Limit: 100, NotDecided: true}); res[0] != want {
		t.Errorf("the policy not asked: %+v, want %+v", res[0], want)
	}
	if res[1].Allowed || res[1].NotDecided {
		t.Errorf("the cached denial: %+v", res[1])
	}
}
