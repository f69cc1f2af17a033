package algo

import (
	"context"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/race"
)

// goRedisAllocs is what go-redis allocates per call on this path: the
// command object, and three in its health check of the pooled connection
// (net.RawConn and the closure that peeks at the socket).
const goRedisAllocs = 4

// TestRedisAllocatesOnlyInGoRedis: a decision on Redis, standalone or
// Cluster, one request alone in its batch, allocates nothing of the store's
// own once its pools are warm; only what go-redis allocates per call
// remains, and a batch of several requests shares it.
func TestRedisAllocatesOnlyInGoRedis(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts mean nothing under the race detector; make test runs this test without it")
	}
	standalone, _, _ := newRedisStore(t, nil)
	inCluster, _ := newClusterStore(t)
	for _, st := range []struct {
		name string
		rs   *Redis
	}{{"standalone", standalone}, {"cluster", inCluster}} {
		for _, alg := range []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, LeakyBucket, GCRA} {
			t.Run(st.name+"/"+alg.String(), func(t *testing.T) {
				p := mustPolicy(t, Spec{Name: "alloc", Algorithm: alg, Limit: 1 << 40, Window: time.Hour})
				reqs := []Request{{Policy: p, Key: []byte("203.0.113.7")}}
				res := make([]Result, 1)
				run := func() {
					if ok, err := st.rs.Decide(context.Background(), reqs, res); err != nil || !ok {
						t.Fatalf("decide: %v %v", ok, err)
					}
				}
				run()
				run()
				if got := testing.AllocsPerRun(200, run); got > goRedisAllocs {
					t.Errorf("%v allocations per decision, want at most go-redis's %d", got, goRedisAllocs)
				}
			})
		}
	}
}
