package redis

import (
	"context"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/race"
)

// goRedisAllocs is what go-redis allocates per call on this path: the
// command object, three in its health check of the pooled connection
// (net.RawConn and the closure that peeks at the socket), and the
// io.LimitReader through which it copies decide.lua's reply, one string.
const goRedisAllocs = 5

// clusterBatchAllocs is what a cluster batch adds: context.WithDeadline
// (its context, timer and channel), which a dial to a primary that just
// died must be able to see done.
const clusterBatchAllocs = 5

// TestRedisAllocatesOnlyInGoRedis: a decision on Redis, standalone or
// Cluster, one request alone in its batch, allocates nothing of the store's
// own once its pools are warm. On a standalone Redis it goes on the store's
// own connection and allocates nothing at all; in a cluster only what
// go-redis allocates per call remains, and the batch's deadline context,
// which a batch of several requests shares.
func TestRedisAllocatesOnlyInGoRedis(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts mean nothing under the race detector; make test runs this test without it")
	}
	standalone, _, _ := newRedisStore(t, nil)
	inCluster, _ := newClusterStore(t)
	for _, st := range []struct {
		name string
		rs   *Store
	}{{"standalone", standalone}, {"cluster", inCluster}} {
		for _, alg := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowLog, algo.SlidingWindowCounter, algo.TokenBucket, algo.LeakyBucket, algo.GCRA} {
			t.Run(st.name+"/"+alg.String(), func(t *testing.T) {
				p := algotest.MustPolicy(t, algo.Spec{Name: "alloc", Algorithm: alg, Limit: 1 << 40, Window: time.Hour})
				reqs := []algo.Request{{Policy: p, Key: []byte("203.0.113.7")}}
				res := make([]algo.Result, 1)
				run := func() {
					if ok, err := st.rs.Decide(context.Background(), reqs, res); err != nil || !ok {
						t.Fatalf("decide: %v %v", ok, err)
					}
				}
				run()
				run()
				want := 0 // the store's own connection
				if st.rs.cluster != nil {
					want = goRedisAllocs + clusterBatchAllocs
				}
				if got := testing.AllocsPerRun(200, run); got > float64(want) {
					t.Errorf("%v allocations per decision, want at most %d (in a cluster go-redis's %d, and the batch's deadline)", got, want, goRedisAllocs)
				}
			})
		}
	}
}
