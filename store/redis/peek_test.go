package redis

import (
	"context"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// TestPeekWritesNothingAndReset: for every algorithm on both stores, Peek
// answers what a decision would with the counts that stand, and writes no
// state (a fresh key stays absent, a used one keeps its count); Reset
// forgets one key's state and no other's.
func TestPeekWritesNothingAndReset(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch.Add(time.Minute))
	stores := bothStores(t, clock)
	mem := stores[0].store.(*algo.Memory)
	rs := stores[1].store.(*Store)
	for _, st := range stores {
		for _, alg := range algo.Algorithms() {
			t.Run(st.name+"/"+alg.String(), func(t *testing.T) {
				ctx := context.Background()
				p := algotest.MustPolicy(t, algo.Spec{Name: "peek-" + alg.String(), Algorithm: alg, Limit: 2, Window: time.Hour})
				keys := func() int {
					if st.name == "memory" {
						return mem.Len()
					}
					n, err := rs.client.Exists(ctx, p.StorageKey(rs.prefix, algo.Tag("a")), p.StorageKey(rs.prefix, algo.Tag("b"))).Result()
					if err != nil {
						t.Fatal(err)
					}
					return int(n)
				}
				before := keys()
				peek := func(key string) (bool, algo.Result) {
					t.Helper()
					var res [1]algo.Result
					ok, err := algo.Peek(ctx, st.store, []algo.Request{{Policy: p, Key: algo.Tag(key)}}, res[:])
					if err != nil {
						t.Fatal(err)
					}
					return ok, res[0]
				}
				for i := 0; i < 3; i++ {
					if ok, r := peek("a"); !ok || !r.Allowed || r.Remaining != 2 {
						t.Fatalf("Peek of a fresh key: %v %+v, want admitted with 2 remaining", ok, r)
					}
				}
				if got := keys(); got != before {
					t.Fatalf("Peek wrote state: %d keys, %d before", got, before)
				}
				for _, k := range []string{"a", "a", "b", "b"} {
					if r := algotest.DecideOne(t, st.store, algo.Request{Policy: p, Key: algo.Tag(k)}); !r.Allowed {
						t.Fatalf("decision for %s denied: %+v", k, r)
					}
				}
				for i := 0; i < 3; i++ {
					if ok, r := peek("a"); ok || r.Allowed || r.Remaining != 0 {
						t.Fatalf("Peek of a used-up key: %v %+v, want denied with 0 remaining", ok, r)
					}
				}
				if err := st.store.(algo.Resetter).Reset(ctx, []algo.Request{{Policy: p, Key: algo.Tag("a")}}); err != nil {
					t.Fatal(err)
				}
				if ok, r := peek("a"); !ok || r.Remaining != 2 {
					t.Errorf("Peek after Reset: %v %+v, want 2 remaining", ok, r)
				}
				if ok, r := peek("b"); ok || r.Remaining != 0 {
					t.Errorf("Peek of another key after Reset: %v %+v, want it still used up", ok, r)
				}
				if r := algotest.DecideOne(t, st.store, algo.Request{Policy: p, Key: algo.Tag("a")}); !r.Allowed || r.Remaining != 1 {
					t.Errorf("decision after Reset: %+v, want admitted with 1 remaining", r)
				}
			})
		}
	}
}
