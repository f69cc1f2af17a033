package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/internal/redistest"
)

// TestClusterProbe: a shard's probe succeeds only where its primary can
// decide: not while the primary answers CLUSTERDOWN, and not on a slot that
// has moved away from it; it succeeds again once the primary can decide,
// and once the client has learned where the slot went.
func TestClusterProbe(t *testing.T) {
	t.Parallel()
	topo, rs := topologyStore(t)
	ctx := context.Background()
	masters := topo.Masters(t)
	probe := func(m *redistest.ClusterNode) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return rs.Probe(ctx, shardOf(t, topo, rs, m))
	}
	eventually := func(m *redistest.ClusterNode, what string) {
		t.Helper()
		var err error
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if err = probe(m); err == nil {
				return
			}
		}
		t.Fatalf("%s: probe of %s still fails 10s later: %v", what, m, err)
	}
	for _, m := range masters {
		if err := probe(m); err != nil {
			t.Fatalf("probe of %s in a healthy cluster: %v", m, err)
		}
	}

	// A slot moved away: the probe tries the first slot the client believes
	// a primary serves, and that is the one moved.
	a, b := masters[0], masters[1]
	first := topo.View(t, a)
	moved := -1
	for _, v := range first {
		if v.ID == a.ID {
			moved = v.Slots[0].First
			for _, r := range v.Slots {
				moved = min(moved, r.First)
			}
		}
	}
	topo.MoveSlot(t, moved, b, redistest.MoveOptions{})
	if err := probe(a); err == nil || !strings.Contains(err.Error(), "MOVED") {
		t.Errorf("probe of %s after its slot %d moved to %s: %v, want MOVED", a, moved, b, err)
	}
	eventually(a, "slot moved")

	// The cluster down, as b sees it: b no longer covers one of its slots,
	// and answers CLUSTERDOWN (cluster-require-full-coverage yes) though it
	// loads scripts as ever. a still sees the cluster whole.
	var gone int
	for _, v := range topo.View(t, b) {
		if v.ID == b.ID {
			gone = v.Slots[len(v.Slots)-1].Last
		}
	}
	bc := b.Client(t)
	if err := bc.Do(ctx, "CLUSTER", "DELSLOTS", gone).Err(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := bc.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:fail") {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%s still reports its cluster up 10s after DELSLOTS %d: %v %q", b, gone, err, info)
		}
	}
	if err := probe(b); err == nil || !strings.Contains(err.Error(), "CLUSTERDOWN") {
		t.Errorf("probe of %s while it answers CLUSTERDOWN: %v, want CLUSTERDOWN", b, err)
	}
	if err := probe(a); err != nil {
		t.Errorf("probe of %s, which sees the cluster whole: %v", a, err)
	}
	if err := bc.Do(ctx, "CLUSTER", "ADDSLOTS", gone).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(b, "slot covered again")
}

// TestClusterProbeWithinTheBudget: a primary whose link is slower than the
// decision budget keeps its circuit open, as it does a decision: the
// probe's decision has the budget, not the probe's whole timeout.
func TestClusterProbeWithinTheBudget(t *testing.T) {
	topo := redistest.NewClusterTopology(t, 3, 0)
	masters := topo.Masters(t)
	var proxies []*redistest.LatencyProxy
	for _, m := range masters {
		proxies = append(proxies, redistest.NewLatencyProxy(t, m.Addr))
	}
	client := topo.Client(t, func(o *goredis.ClusterOptions) {
		o.Dialer = redistest.DialVia(proxies...)
		o.ContextTimeoutEnabled = true // as authlimit configures it
	})
	const budget = 200 * time.Millisecond
	rs := New(client, Options{Prefix: topo.Prefix(t), Timeout: budget})
	t.Cleanup(func() { _ = rs.Close() })
	ctx := context.Background()
	// Warming loads the scripts within the store's budget, which a loaded
	// machine can miss: it is set-up, not what is tested, so it may retry.
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := rs.Warm(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	probe := func(i int) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // the guard gives a probe at least 1s
		defer cancel()
		return rs.Probe(ctx, shardOf(t, topo, rs, masters[i]))
	}
	proxies[0].SetDelay(budget) // each way: a round trip of twice the budget
	if err := probe(0); err == nil {
		t.Errorf("probe of %s over a link of %v each way, budget %v: succeeded, want its decision timed out", masters[0], budget, budget)
	}
	if err := probe(1); err != nil {
		t.Errorf("probe of %s over a fast link: %v", masters[1], err)
	}
	proxies[0].SetDelay(0)
	if err := probe(0); err != nil {
		t.Errorf("probe of %s once its link is fast again: %v", masters[0], err)
	}
}

// shardOf returns the store's shard number of a primary.
func shardOf(t *testing.T, topo *redistest.ClusterTopology, rs *Store, m *redistest.ClusterNode) int {
	t.Helper()
	for i := 0; ; i++ {
		k := "198.51.100." + strconv.Itoa(i)
		if topo.MasterForKey(t, "x{"+k+"}") == m {
			return rs.Shards(nil, []algo.Request{{Key: []byte(k)}})[0]
		}
	}
}
