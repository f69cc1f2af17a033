package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// TestHostileKeysAreIsolated: keys built to collide, inject hash tags or
// look like hashes keep separate state in both stores.
func TestHostileKeysAreIsolated(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	long := strings.Repeat("y", 5000)
	keys := []string{"victim", "{victim}", "victim}", "#victim", string(algo.Tag(long)), long, long + "z", ""}
	for _, st := range bothStores(t, clock) {
		r := algotest.MustPolicy(t, algo.Spec{Name: "iso", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Minute})
		for _, k := range keys {
			if got := algotest.DecideOne(t, st.store, algo.Request{Policy: r, Key: algo.Tag(k)}); !got.Allowed {
				t.Errorf("%s: first request for %.20q denied: its state is shared with another key", st.name, k)
			}
		}
		for _, k := range keys {
			if got := algotest.DecideOne(t, st.store, algo.Request{Policy: r, Key: algo.Tag(k)}); got.Allowed {
				t.Errorf("%s: second request for %.20q allowed: limit 1 not kept", st.name, k)
			}
		}
	}
}

func TestDecideHonoursContext(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, st := range bothStores(t, clock) {
		r := algotest.MustPolicy(t, algo.Spec{Name: "c", Algorithm: algo.GCRA, Limit: 5, Window: time.Second})
		if _, err := st.store.Decide(ctx, []algo.Request{{Policy: r, Key: []byte("k")}}, make([]algo.Result, 1)); err == nil {
			t.Errorf("%s: Decide with a cancelled context succeeded", st.name)
		}
	}
}
