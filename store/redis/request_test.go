package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

func TestDecideRejectsBadRequests(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	for _, st := range bothStores(t, clock) {
		a := algotest.MustPolicy(t, algo.Spec{Name: "a", Algorithm: algo.FixedWindow, Limit: 5, Window: time.Second})
		tests := []struct {
			name string
			reqs []algo.Request
			res  int
		}{
			{"no requests", nil, 0},
			{"negative cost", []algo.Request{{Policy: a, Key: []byte("k"), Cost: -1}}, 1},
			{"cost 2^62", []algo.Request{{Policy: a, Key: []byte("k"), Cost: 1 << 62}}, 1},
			{"short result slice", []algo.Request{{Policy: a, Key: []byte("k")}}, 0},
			{"nil policy", []algo.Request{{Key: []byte("k")}}, 1},
			{"policy twice for one key", []algo.Request{{Policy: a, Key: []byte("k")}, {Policy: a, Key: []byte("j")}, {Policy: a, Key: []byte("k")}}, 3},
			{"a key that is not a tag", []algo.Request{{Policy: a, Key: []byte("{k}")}}, 1},
			{"an empty key", []algo.Request{{Policy: a, Key: nil}}, 1},
			{"too many rules", make([]algo.Request, algo.MaxRules+1), algo.MaxRules + 1},
		}
		for _, tc := range tests {
			t.Run(st.name+"/"+tc.name, func(t *testing.T) {
				_, err := st.store.Decide(context.Background(), tc.reqs, make([]algo.Result, tc.res))
				if !errors.Is(err, algo.ErrInvalid) {
					t.Errorf("Decide = %v, want an error wrapping ErrInvalid", err)
				}
			})
		}
	}
}
