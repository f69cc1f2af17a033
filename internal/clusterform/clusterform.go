// Package clusterform forms a Redis Cluster of fresh primaries: the step
// that the benchmark's cluster and the tests' share once their nodes run.
package clusterform

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Slots is the number of a Redis Cluster's hash slots.
const Slots = 16384

// Node is a cluster-enabled redis-server that belongs to no cluster yet.
type Node struct {
	// Addr is its client address, host:port.
	Addr string
	// Bus is the port of its cluster bus (--cluster-port). Redis's
	// default, the client port + 10000, may fall in the range the kernel
	// takes source ports from, where an outgoing connection may hold it,
	// so the callers choose it as they choose the client port.
	Bus int
}

// pollEvery is how often Form asks the nodes whether the cluster is up.
const pollEvery = 50 * time.Millisecond

// Form makes one cluster of the nodes, all primaries: it splits the hash
// slots between them in order, gives each a config epoch of its own, has
// every other node meet the first on its bus, and waits until every node
// reports cluster_state:ok and knows them all. It gives up when ctx ends,
// with what it last saw.
func Form(ctx context.Context, nodes []Node) error {
	if len(nodes) == 0 {
		return fmt.Errorf("redis cluster: no nodes")
	}
	host, port, err := net.SplitHostPort(nodes[0].Addr)
	if err != nil {
		return fmt.Errorf("redis cluster: node %q: %w", nodes[0].Addr, err)
	}
	clients := make([]*redis.Client, len(nodes))
	for i, n := range nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
	}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	for i, c := range clients {
		lo, hi := i*Slots/len(nodes), (i+1)*Slots/len(nodes)-1
		steps := [][]any{{"CLUSTER", "SET-CONFIG-EPOCH", i + 1}, {"CLUSTER", "ADDSLOTSRANGE", lo, hi}}
		if i > 0 {
			steps = append(steps, []any{"CLUSTER", "MEET", host, port, nodes[0].Bus})
		}
		for _, args := range steps {
			if err := c.Do(ctx, args...).Err(); err != nil {
				return fmt.Errorf("redis cluster: %v on %s: %w", args, nodes[i].Addr, err)
			}
		}
	}
	known := "cluster_known_nodes:" + strconv.Itoa(len(nodes))
	for {
		var notYet error
		for i, c := range clients {
			info, err := c.ClusterInfo(ctx).Result()
			switch {
			case err != nil:
				notYet = fmt.Errorf("%s: %w", nodes[i].Addr, err)
			case !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, known):
				notYet = fmt.Errorf("%s: not %s and cluster_state:ok yet", nodes[i].Addr, known)
			}
			if notYet != nil {
				break
			}
		}
		if notYet == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis cluster not up: %w (%w)", notYet, ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}
