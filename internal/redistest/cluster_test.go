package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

// TestNewClusterBusPorts: NewCluster's nodes serve a cluster whose buses
// are on ports chosen for them, not on Redis's default (the client port
// + 10000, which may be a source port already in use).
func TestNewClusterBusPorts(t *testing.T) {
	t.Setenv(EnvClusterAddrs, "")
	c := NewCluster(t)
	ctx := context.Background()
	seen := map[string]bool{}
	for _, n := range c.Nodes {
		got, err := n.Client(t).ConfigGet(ctx, "cluster-port").Result()
		if err != nil {
			t.Fatal(err)
		}
		bus := got["cluster-port"]
		_, port, _ := strings.Cut(n.Addr, ":")
		client, _ := strconv.Atoi(port)
		if bus == "" || bus == "0" || bus == strconv.Itoa(client+10000) || seen[bus] {
			t.Errorf("node %s: cluster-port %q; want a port of its own", n.Addr, bus)
		}
		seen[bus] = true
	}
	if err := c.Client(t).Set(ctx, c.Prefix(t)+":k", "v", 0).Err(); err != nil {
		t.Errorf("SET through the cluster: %v", err)
	}
}
