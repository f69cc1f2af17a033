package algo_test

import (
	"context"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// TestMemoryRegistryGrowsWithIdentities: rebuilding a policy again and
// again (reload after reload) registers one identity, not one per policy.
func TestMemoryRegistryGrowsWithIdentities(t *testing.T) {
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	for i := 0; i < 100; i++ {
		for _, alg := range []algo.Algorithm{algo.FixedWindow, algo.TokenBucket} {
			p := algotest.MustPolicy(t, algo.Spec{Name: "grow", Algorithm: alg, Limit: int64(10 + i), Window: time.Minute})
			res := make([]algo.Result, 1)
			if _, err := m.Decide(context.Background(), []algo.Request{{Policy: p, Key: algo.Tag("k")}}, res); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids, policies := m.Registered()
	if got, want := ids, 2; got != want {
		t.Errorf("registry holds %d identities after 100 rebuilds of 2 policies, want %d", got, want)
	}
	if got, want := policies, 2; got != want {
		t.Errorf("registry holds %d policies, want %d", got, want)
	}
}
