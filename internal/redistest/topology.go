package redistest

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterReadyTimeout bounds how long a new or healed cluster may take to
// settle.
const clusterReadyTimeout = 30 * time.Second

// ClusterTopology is a Redis Cluster of masters with replicas, every node a
// redis-server the test started on 127.0.0.1 and stops when it ends.
type ClusterTopology struct {
	// Nodes are every node in start order: the masters first, then the
	// replicas of master 0, of master 1, and so on. Roles change with
	// failovers; State, Masters and Replicas tell the current ones.
	Nodes []*ClusterNode

	path string
	// mu guards each node's process and kill record: Kill and Restart
	// may race with helpers called from traffic goroutines.
	mu sync.Mutex
}

// ClusterNode is one redis-server of a ClusterTopology. Its id and address
// stay the same across restarts.
type ClusterNode struct {
	// ID is the node's cluster id.
	ID string
	// Addr is its host:port.
	Addr string

	busPort int
	proc    *process
	// killedAt and killedSlots record the last Kill, for WaitFailover.
	killedAt    time.Time
	killedSlots []SlotRange
}

// String names the node for messages: its address and the start of its id.
func (n *ClusterNode) String() string {
	return fmt.Sprintf("%s (%.8s)", n.Addr, n.ID)
}

// Client returns a plain client of this one node, closed when t ends. It
// does not follow MOVED or ASK, so a test can see them.
func (n *ClusterNode) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: n.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// NewClusterTopology starts masters*(1+replicasPerMaster) redis-server
// nodes with cluster mode on, splits the 16384 slots evenly between the
// masters, attaches replicasPerMaster replicas to each, and returns once
// every node reports cluster_state:ok, every node agrees on the layout and
// every replica is in sync. A failover needs a majority of masters alive,
// so tests that kill a master want at least three. WithNodeTimeout sets
// cluster-node-timeout (default 1s); WithArgs and WithDebugCommand add
// redis-server arguments.
func NewClusterTopology(t testing.TB, masters, replicasPerMaster int, opts ...Option) *ClusterTopology {
	t.Helper()
	if masters < 1 || replicasPerMaster < 0 {
		t.Fatalf("redistest: NewClusterTopology(%d masters, %d replicas each): want at least one master", masters, replicasPerMaster)
	}
	o := newOptions(opts)
	c := &ClusterTopology{path: serverPath(t)}
	total := masters * (1 + replicasPerMaster)
	for i := 0; i < total; i++ {
		spec := procSpec{path: c.path, dir: t.TempDir(), extra: append([]string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(o.nodeTimeout.Milliseconds(), 10),
			// Redis 7.0 waits 5s by default before a diskless full sync,
			// in case more replicas come.
			"--repl-diskless-sync-delay", "0",
		}, o.args...)}
		// The bus port gets a port of its own: port+10000, the default,
		// may be taken or past 65535.
		p, err := startOwned(t, spec, 2, func(ports []int) []string {
			return []string{"--cluster-port", strconv.Itoa(ports[1])}
		})
		if err != nil {
			t.Fatalf("redistest: cluster node %d of %d: %v", i+1, total, err)
		}
		n := &ClusterNode{Addr: p.spec.addr(), proc: p}
		// withPorts above put the bus port last.
		n.busPort, _ = strconv.Atoi(p.spec.extra[len(p.spec.extra)-1])
		if n.ID, err = commandString(n.Addr, "CLUSTER", "MYID"); err != nil {
			t.Fatalf("redistest: CLUSTER MYID on %s: %v\n%s", n.Addr, err, tail(p.spec.logPath()))
		}
		c.Nodes = append(c.Nodes, n)
	}
	c.join(t, masters, replicasPerMaster)
	return c
}

// join assigns slots, introduces the nodes and attaches the replicas, by
// hand rather than with redis-cli --cluster create, which polls once a
// second.
func (c *ClusterTopology) join(t testing.TB, masters, replicasPerMaster int) {
	t.Helper()
	first := c.Nodes[0]
	for i, n := range c.Nodes {
		// Distinct epochs up front spare the cluster its epoch-collision
		// dance, as redis-cli does.
		if _, err := command(n.Addr, "CLUSTER", "SET-CONFIG-EPOCH", i+1); err != nil {
			c.fatalf(t, "CLUSTER SET-CONFIG-EPOCH on %s: %v", n, err)
		}
		if i < masters {
			lo, hi := i*Slots/masters, (i+1)*Slots/masters-1
			if _, err := command(n.Addr, "CLUSTER", "ADDSLOTSRANGE", lo, hi); err != nil {
				c.fatalf(t, "CLUSTER ADDSLOTSRANGE %d %d on %s: %v", lo, hi, n, err)
			}
		}
		if i > 0 {
			if _, err := command(n.Addr, "CLUSTER", "MEET", "127.0.0.1", port(first.Addr), first.busPort); err != nil {
				c.fatalf(t, "CLUSTER MEET %s from %s: %v", first, n, err)
			}
		}
	}
	err := poll(clusterReadyTimeout, func() error {
		for _, n := range c.Nodes {
			views, err := clusterNodes(n.Addr)
			if err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
			if len(views) != len(c.Nodes) {
				return fmt.Errorf("%s knows %d nodes, want %d", n, len(views), len(c.Nodes))
			}
			for _, v := range views {
				if v.Handshake || !v.Connected {
					return fmt.Errorf("%s still meets %s", n, v.Addr)
				}
			}
		}
		return nil
	})
	if err != nil {
		c.fatalf(t, "cluster nodes did not meet within %v: %v", clusterReadyTimeout, err)
	}
	for i := 0; i < masters; i++ {
		for j := 0; j < replicasPerMaster; j++ {
			r := c.Nodes[masters+i*replicasPerMaster+j]
			if _, err := command(r.Addr, "CLUSTER", "REPLICATE", c.Nodes[i].ID); err != nil {
				c.fatalf(t, "CLUSTER REPLICATE %s on %s: %v", c.Nodes[i], r, err)
			}
		}
	}
	c.WaitHealthy(t, clusterReadyTimeout)
}

// Addrs returns every node's host:port.
func (c *ClusterTopology) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Client returns a cluster client seeded with every node, closed when t
// ends. configure may change its options first (timeouts, retries).
func (c *ClusterTopology) Client(t testing.TB, configure ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	t.Helper()
	opts := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, f := range configure {
		f(opts)
	}
	cc := redis.NewClusterClient(opts)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Prefix returns a random key prefix for t. The cluster is t's own, so
// nothing needs deleting.
func (c *ClusterTopology) Prefix(t testing.TB) string {
	t.Helper()
	return newPrefix()
}

// Node returns the node with the cluster id given, or fails t.
func (c *ClusterTopology) Node(t testing.TB, id string) *ClusterNode {
	t.Helper()
	if n := c.nodeByID(id); n != nil {
		return n
	}
	c.fatalf(t, "no node with id %s", id)
	return nil
}

func (c *ClusterTopology) nodeByID(id string) *ClusterNode {
	for _, n := range c.Nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// State returns CLUSTER NODES as the first node that answers sees it.
// While the cluster changes, nodes may disagree; View asks one node.
func (c *ClusterTopology) State(t testing.TB) []NodeView {
	t.Helper()
	var errs []error
	for _, n := range c.Nodes {
		views, err := clusterNodes(n.Addr)
		if err == nil {
			return views
		}
		errs = append(errs, fmt.Errorf("%s: %w", n, err))
	}
	c.fatalf(t, "no node answers CLUSTER NODES: %v", errors.Join(errs...))
	return nil
}

// View returns CLUSTER NODES as node n sees it, or fails t.
func (c *ClusterTopology) View(t testing.TB, n *ClusterNode) []NodeView {
	t.Helper()
	views, err := clusterNodes(n.Addr)
	if err != nil {
		c.fatalf(t, "CLUSTER NODES on %s: %v", n, err)
	}
	return views
}

// Masters returns the masters that serve slots and are not failed, as
// State sees them.
func (c *ClusterTopology) Masters(t testing.TB) []*ClusterNode {
	t.Helper()
	var out []*ClusterNode
	for _, v := range c.State(t) {
		if v.Master && !v.Failed && len(v.Slots) > 0 {
			out = append(out, c.Node(t, v.ID))
		}
	}
	return out
}

// Replicas returns the replicas of master, or of every master when master
// is nil, that are not failed, as State sees them.
func (c *ClusterTopology) Replicas(t testing.TB, master *ClusterNode) []*ClusterNode {
	t.Helper()
	var out []*ClusterNode
	for _, v := range c.State(t) {
		if !v.Master && !v.Failed && (master == nil || v.MasterID == master.ID) {
			out = append(out, c.Node(t, v.ID))
		}
	}
	return out
}

// MasterForSlot returns the master serving slot, as State sees it.
func (c *ClusterTopology) MasterForSlot(t testing.TB, slot int) *ClusterNode {
	t.Helper()
	id := ownerOf(c.State(t), slot)
	if id == "" {
		c.fatalf(t, "no live master serves slot %d", slot)
	}
	return c.Node(t, id)
}

// MasterForKey returns the master serving key's slot, as State sees it.
func (c *ClusterTopology) MasterForKey(t testing.TB, key string) *ClusterNode {
	t.Helper()
	return c.MasterForSlot(t, KeySlot(key))
}

// Kill kills node n with SIGKILL, as a crash: no save, no goodbye to the
// cluster. It records when, and which slots n served, for WaitFailover.
func (c *ClusterTopology) Kill(t testing.TB, n *ClusterNode) {
	t.Helper()
	views, err := clusterNodes(n.Addr)
	if err != nil {
		c.fatalf(t, "Kill(%s): CLUSTER NODES before the kill: %v", n, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n.proc.stop()
	n.killedAt = time.Now()
	n.killedSlots = slotsOf(views, n.ID)
}

// Restart starts a killed node again on the same ports with the same
// directory, so it keeps its nodes.conf and rejoins the cluster under its
// old id; its data is gone. It returns once the node answers PING; a former
// master that was failed over comes back as a replica of its successor
// once the cluster tells it so. WaitHealthy waits for that.
func (c *ClusterTopology) Restart(t testing.TB, n *ClusterNode) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if n.proc.alive() {
		t.Fatalf("redistest: Restart(%s): the node is still running", n)
	}
	p, err := startProcess(n.proc.spec)
	if err != nil {
		t.Fatalf("redistest: Restart(%s): %v", n, err)
	}
	t.Cleanup(p.stop)
	n.proc = p
}

// WaitFailover waits until the slots old served when Kill killed it are
// served by one other master, every other reachable node agrees on that and
// reports cluster_state:ok. It returns the new master and the time from the
// kill to the moment the cluster was seen whole again, and fails t if that
// does not happen within timeout.
func (c *ClusterTopology) WaitFailover(t testing.TB, old *ClusterNode, timeout time.Duration) (*ClusterNode, time.Duration) {
	t.Helper()
	c.mu.Lock()
	killedAt, slots := old.killedAt, old.killedSlots
	c.mu.Unlock()
	if killedAt.IsZero() {
		t.Fatalf("redistest: WaitFailover(%s): the node was not killed with Kill", old)
	}
	if len(slots) == 0 {
		t.Fatalf("redistest: WaitFailover(%s): the node served no slots when killed, so nothing fails over", old)
	}
	var newID string
	err := poll(timeout, func() error {
		asked := 0
		owner := ""
		for _, n := range c.Nodes {
			if n == old {
				continue
			}
			state, err := clusterState(n.Addr)
			if err != nil {
				continue // killed too, perhaps; the others decide
			}
			asked++
			if state != "ok" {
				return fmt.Errorf("%s reports cluster_state:%s", n, state)
			}
			views, err := clusterNodes(n.Addr)
			if err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
			owners := slotOwners(views)
			for _, r := range slots {
				for s := r.First; s <= r.Last; s++ {
					id := owners[s]
					if id == "" || id == old.ID {
						return fmt.Errorf("%s sees slot %d served by %q", n, s, id)
					}
					if owner == "" {
						owner = id
					}
					if id != owner {
						return fmt.Errorf("%s sees slot %d served by %.8s, another node by %.8s", n, s, id, owner)
					}
				}
			}
		}
		if asked == 0 {
			return errors.New("no node answers")
		}
		newID = owner
		return nil
	})
	if err != nil {
		c.fatalf(t, "WaitFailover(%s): no failover within %v: %v", old, timeout, err)
	}
	took := time.Since(killedAt)
	return c.Node(t, newID), took
}

// WaitHealthy waits until every node runs, reports cluster_state:ok, knows
// every other node with no failure flag and no open slot, all nodes agree
// on roles and slots, and every replica is in sync with its master. Use it
// after Restart, or before a fault to start from a settled cluster.
func (c *ClusterTopology) WaitHealthy(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := poll(timeout, c.healthy); err != nil {
		c.fatalf(t, "cluster not healthy within %v: %v", timeout, err)
	}
}

func (c *ClusterTopology) healthy() error {
	var layout string
	var replicas []NodeView
	for i, n := range c.Nodes {
		state, err := clusterState(n.Addr)
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		if state != "ok" {
			return fmt.Errorf("%s reports cluster_state:%s", n, state)
		}
		views, err := clusterNodes(n.Addr)
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		if len(views) != len(c.Nodes) {
			return fmt.Errorf("%s knows %d nodes, want %d", n, len(views), len(c.Nodes))
		}
		for _, v := range views {
			switch {
			case c.nodeByID(v.ID) == nil:
				return fmt.Errorf("%s knows a stranger %s", n, v.ID)
			case v.Failed || v.Handshake || !v.Connected:
				return fmt.Errorf("%s sees %s failed, in handshake or disconnected", n, v.Addr)
			case len(v.Open) > 0:
				return fmt.Errorf("%s has open slots %v", n, v.Open)
			}
		}
		l := describeLayout(views)
		if i == 0 {
			layout = l
			for _, v := range views {
				if !v.Master {
					replicas = append(replicas, v)
				}
			}
		} else if l != layout {
			return fmt.Errorf("%s sees the layout\n%s\nbut %s sees\n%s", c.Nodes[0], layout, n, l)
		}
	}
	for _, r := range replicas {
		info, err := commandString(r.Addr, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("replica %s: %w", r.Addr, err)
		}
		if infoField(info, "master_link_status") != "up" || infoField(info, "master_sync_in_progress") != "0" {
			return fmt.Errorf("replica %s not in sync: master_link_status:%s master_sync_in_progress:%s",
				r.Addr, infoField(info, "master_link_status"), infoField(info, "master_sync_in_progress"))
		}
	}
	return nil
}

// describeLayout renders who is master of which slots and who replicates
// whom, in a form two nodes' views can be compared by.
func describeLayout(views []NodeView) string {
	lines := make([]string, 0, len(views))
	for _, v := range views {
		if v.Master {
			lines = append(lines, fmt.Sprintf("%s master %v", v.ID, v.Slots))
		} else {
			lines = append(lines, fmt.Sprintf("%s replica of %s", v.ID, v.MasterID))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// fatalf fails t with the message and the end of every node's log.
func (c *ClusterTopology) fatalf(t testing.TB, format string, args ...any) {
	t.Helper()
	var logs []string
	for _, n := range c.Nodes {
		c.mu.Lock()
		path := n.proc.spec.logPath()
		c.mu.Unlock()
		logs = append(logs, tailN(path, 300))
	}
	t.Fatalf("redistest: "+format+"\n%s", append(args, strings.Join(logs, "\n"))...)
}

// clusterNodes returns CLUSTER NODES from the node at addr.
func clusterNodes(addr string) ([]NodeView, error) {
	s, err := commandString(addr, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	return parseClusterNodes(s)
}

// clusterState returns the cluster_state field of CLUSTER INFO at addr.
func clusterState(addr string) (string, error) {
	s, err := commandString(addr, "CLUSTER", "INFO")
	if err != nil {
		return "", err
	}
	return infoField(s, "cluster_state"), nil
}

// slotOwners maps every slot to the id of the live master serving it.
func slotOwners(views []NodeView) []string {
	owners := make([]string, Slots)
	for _, v := range views {
		if !v.Master || v.Failed {
			continue
		}
		for _, r := range v.Slots {
			for s := r.First; s <= r.Last && s < Slots; s++ {
				owners[s] = v.ID
			}
		}
	}
	return owners
}

// port returns the port of a host:port.
func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
