package guard

import (
	"context"
	"fmt"
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

// TestLearntPolicyIsDivided: a policy the guard was not given (a limit
// Envoy sends with a descriptor) is divided by the local divisor when the
// local store decides, continuing from what the store admitted.
func TestLearntPolicyIsDivided(t *testing.T) {
	f := newFixture(t, FailLocal)
	f.p = policy(t, "later", 8) // local: 8/2 = 4
	for i := 0; i < 2; i++ {
		if _, ok, err := f.decide(t, "a"); err != nil || !ok {
			t.Fatalf("request %d through the store: %v %v", i+1, ok, err)
		}
	}
	f.store.breakShard(1, errDown)
	got := 0
	for i := 0; i < 8; i++ {
		if _, ok, err := f.decide(t, "a"); err == nil && ok {
			got++
		}
	}
	if got != 2 {
		t.Errorf("the local store admitted %d of a learnt 8/hour divided by 2 after the store admitted 2, want 2", got)
	}
	// A policy rebuilt alike is the same policy to the guard.
	f.p = policy(t, "later", 8)
	if _, ok, err := f.decide(t, "a"); err != nil || ok {
		t.Errorf("the learnt policy rebuilt: %v %v, want denied by the local store", ok, err)
	}
}

// TestLearntPoliciesHaveTheirOwnDenials: the deny cache keeps a learnt
// policy's denials apart from every other policy's, given or learnt.
func TestLearntPoliciesHaveTheirOwnDenials(t *testing.T) {
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
	if hits := f.metric(t, "authlimit_deny_cache_hits_total"); hits != 1 {
		t.Fatalf("deny cache hits = %v, want 1", hits)
	}
	for _, p := range []*algo.Policy{five, f.p} {
		if ok, err := decide(p); err != nil || !ok {
			t.Errorf("%s for the key another policy denied: %v %v, want admitted", p.Name(), ok, err)
		}
	}
}

// TestLearntIsBounded: the guard keeps at most maxLearnt policies, and a
// policy learnt again after they were forgotten gets a new id.
func TestLearntIsBounded(t *testing.T) {
	f := newFixture(t, FailLocal)
	first := f.g.id(policy(t, "p0", 5))
	for i := 1; i <= maxLearnt; i++ {
		f.g.id(policy(t, fmt.Sprintf("p%d", i), 5))
	}
	if n := len(f.g.learnt.m); n > maxLearnt {
		t.Fatalf("%d policies learnt, want at most %d", n, maxLearnt)
	}
	if again := f.g.id(policy(t, "p0", 5)); again == first {
		t.Errorf("a policy learnt again has its old id %d", again)
	}
	if id := f.g.id(f.p); id != 0 {
		t.Errorf("the given policy's id = %d, want 0", id)
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
