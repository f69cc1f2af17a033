package algo

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
)

// TestClusterProbe: a shard's probe succeeds only where its primary can
// decide: not while the primary answers CLUSTERDOWN, and not on a slot that
// has moved away from it; it succeeds again once the primary can decide,
// and once the client has learned where the slot went.
func TestClusterProbe(t *testing.T) {
	topo, rs := topologyStore(t)
	ctx := context.Background()
	masters := topo.Masters(t)
	shardOf := func(m *redistest.ClusterNode) int {
		t.Helper()
		for i := 0; ; i++ {
			k := "198.51.100." + strconv.Itoa(i)
			if topo.MasterForKey(t, "x{"+k+"}") == m {
				return rs.Shards(nil, []Request{{Key: []byte(k)}})[0]
			}
		}
	}
	probe := func(m *redistest.ClusterNode) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return rs.Probe(ctx, shardOf(m))
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
