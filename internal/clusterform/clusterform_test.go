package clusterform_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/internal/clusterform"
	"github.com/authlimit/authlimit/internal/redistest"
)

// startNodes starts n cluster-enabled redis-servers, each with a bus port
// of its own, stopped when t ends.
func startNodes(t *testing.T, n int) []clusterform.Node {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not on PATH (apt-get install redis-server): %v", err)
	}
	var nodes []clusterform.Node
	for range n {
		bus, err := redistest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		s, err := redistest.Start(t, path, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", strconv.Itoa(bus))
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, clusterform.Node{Addr: s.Addr, Bus: bus})
	}
	return nodes
}

func client(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestForm: three fresh nodes make one cluster, each serving its share of
// the slots in order, each with an epoch of its own, met on their buses.
func TestForm(t *testing.T) {
	t.Parallel()
	nodes := startNodes(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := clusterform.Form(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		c := client(t, n.Addr)
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"cluster_state:ok", "cluster_known_nodes:3", "cluster_slots_assigned:16384", fmt.Sprintf("cluster_my_epoch:%d", i+1)} {
			if !strings.Contains(info, want) {
				t.Errorf("node %d (%s): CLUSTER INFO lacks %s:\n%s", i, n.Addr, want, info)
			}
		}
		// Every node sees each node's share and bus alike.
		lines, err := c.ClusterNodes(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for j, m := range nodes {
			lo, hi := j*clusterform.Slots/3, (j+1)*clusterform.Slots/3-1
			want := fmt.Sprintf("%s@%d", m.Addr, m.Bus)
			found := false
			for _, l := range strings.Split(strings.TrimSpace(lines), "\n") {
				f := strings.Fields(l)
				if len(f) >= 9 && f[1] == want {
					found = true
					if got := strings.Join(f[8:], " "); got != fmt.Sprintf("%d-%d", lo, hi) {
						t.Errorf("node %d sees %s serve %q; want %d-%d", i, want, got, lo, hi)
					}
				}
			}
			if !found {
				t.Errorf("node %d does not know %s:\n%s", i, want, lines)
			}
		}
	}
}

// TestFormErrors: a node that is no cluster node is named; a cluster that
// does not come up ends with ctx, saying what Form last saw.
func TestFormErrors(t *testing.T) {
	t.Parallel()
	if err := clusterform.Form(context.Background(), nil); err == nil {
		t.Error("Form of no nodes: no error")
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not on PATH (apt-get install redis-server): %v", err)
	}
	plain, err := redistest.Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	nodes := startNodes(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = clusterform.Form(ctx, []clusterform.Node{nodes[0], {Addr: plain.Addr, Bus: nodes[1].Bus}})
	if err == nil || !strings.Contains(err.Error(), plain.Addr) {
		t.Errorf("a server without cluster support: %v; want an error naming %s", err, plain.Addr)
	}
	// The others meet the first on a bus nobody listens on: they never
	// know each other.
	free, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	err = clusterform.Form(short, []clusterform.Node{{Addr: nodes[1].Addr, Bus: free}, nodes[2]})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "cluster_known_nodes:2") {
		t.Errorf("a cluster that cannot meet: %v; want the deadline and what was missing", err)
	}
}
