package redistest

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// reshardTimeout bounds a resharding and the wait for the nodes to agree on
// its outcome.
const reshardTimeout = time.Minute

// Reshard moves n slots from master from to master to with
//
//	redis-cli --cluster reshard <from> --cluster-from <id> --cluster-to <id> --cluster-slots <n> --cluster-yes --cluster-pipeline <batch>
//
// which migrates each slot's keys batch at a time (batch 0 means
// redis-cli's default, 10), so clients that keep sending commands meanwhile
// see MOVED and ASK. It waits first until the reachable nodes agree on the
// layout (redis-cli refuses to reshard otherwise), and returns the slots
// moved once every reachable node agrees that to serves them.
func (c *ClusterTopology) Reshard(t testing.TB, from, to *ClusterNode, n, batch int) []SlotRange {
	t.Helper()
	if from == to || n < 1 {
		t.Fatalf("redistest: Reshard(%s → %s, %d slots): want two masters and at least one slot", from, to, n)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redistest: Reshard: no redis-cli on PATH (Debian: apt-get install redis-tools)")
	}
	if err := poll(reshardTimeout, c.agreed); err != nil {
		c.fatalf(t, "Reshard: nodes do not agree on the layout within %v: %v", reshardTimeout, err)
	}
	// The importing node's own line is the first to show the outcome.
	before := slotsOf(c.View(t, to), to.ID)
	args := []string{"--cluster", "reshard", from.Addr,
		"--cluster-from", from.ID, "--cluster-to", to.ID,
		"--cluster-slots", strconv.Itoa(n), "--cluster-yes"}
	if batch > 0 {
		args = append(args, "--cluster-pipeline", strconv.Itoa(batch))
	}
	cmd := exec.Command(cli, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.fatalf(t, "redis-cli %s: %v\n%s", strings.Join(args, " "), err, lastLines(string(out), 15))
	}
	moved := subtractSlots(slotsOf(c.View(t, to), to.ID), before)
	if got := slotCount(moved); got != n {
		c.fatalf(t, "Reshard: %s gained %d slots, want %d; redis-cli said:\n%s", to, got, n, lastLines(string(out), 15))
	}
	c.waitOwner(t, moved, to)
	return moved
}

// MoveOptions tunes a slot migration done by hand.
type MoveOptions struct {
	// BatchSize is how many keys each MIGRATE moves; 0 means 10.
	BatchSize int
	// Pause is how long to wait between batches, to widen the window in
	// which clients get ASK redirections.
	Pause time.Duration
}

// MoveSlot moves one slot and its keys from its master to master to, by
// hand: BeginMigration, MoveKeys batch by batch with opts.Pause between
// batches, then Finish. It returns once every reachable node agrees that to
// serves the slot.
func (c *ClusterTopology) MoveSlot(t testing.TB, slot int, to *ClusterNode, opts MoveOptions) {
	t.Helper()
	c.MoveSlots(t, SlotRange{slot, slot}, to, opts)
}

// MoveSlots moves every slot of r that to does not serve yet to master to,
// one after another as MoveSlot does, and waits once at the end until every
// reachable node agrees that to serves them all.
func (c *ClusterTopology) MoveSlots(t testing.TB, r SlotRange, to *ClusterNode, opts MoveOptions) {
	t.Helper()
	batch := opts.BatchSize
	if batch <= 0 {
		batch = 10
	}
	owners := slotOwners(c.View(t, to))
	for slot := r.First; slot <= r.Last; slot++ {
		if owners[slot] == to.ID {
			continue
		}
		m := c.BeginMigration(t, slot, to)
		for m.MoveKeys(t, batch) > 0 {
			if opts.Pause > 0 {
				time.Sleep(opts.Pause) // the window a test asked for, not a wait for readiness
			}
		}
		m.assign(t)
	}
	c.waitOwner(t, []SlotRange{r}, to)
}

// MoveKeySlot moves the slot of key to master to, as MoveSlot does, and
// returns the slot.
func (c *ClusterTopology) MoveKeySlot(t testing.TB, key string, to *ClusterNode, opts MoveOptions) int {
	t.Helper()
	slot := KeySlot(key)
	c.MoveSlot(t, slot, to, opts)
	return slot
}

// Migration is one slot on its way from one master to another, moved by
// hand step by step so a test can act between the steps: after
// BeginMigration, a command for a key of the slot gets ASK from From when
// the key is already on To (or is new), and To serves it only after ASKING;
// after Finish, From answers MOVED.
type Migration struct {
	// Slot is the slot on the move.
	Slot int
	// From is the master that served it, To the one that will.
	From, To *ClusterNode

	c *ClusterTopology
}

// BeginMigration marks slot IMPORTING on to and MIGRATING on its current
// master (in that order, as the Redis manual asks), moving no key yet.
func (c *ClusterTopology) BeginMigration(t testing.TB, slot int, to *ClusterNode) *Migration {
	t.Helper()
	if slot < 0 || slot >= Slots {
		t.Fatalf("redistest: BeginMigration: slot %d out of range", slot)
	}
	from := c.Node(t, ownerOf(c.View(t, to), slot))
	if from == to {
		t.Fatalf("redistest: BeginMigration(slot %d → %s): it already serves the slot", slot, to)
	}
	if _, err := command(to.Addr, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.ID); err != nil {
		c.fatalf(t, "CLUSTER SETSLOT %d IMPORTING %s on %s: %v", slot, from.ID, to, err)
	}
	if _, err := command(from.Addr, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.ID); err != nil {
		c.fatalf(t, "CLUSTER SETSLOT %d MIGRATING %s on %s: %v", slot, to.ID, from, err)
	}
	return &Migration{Slot: slot, From: from, To: to, c: c}
}

// MoveKeys migrates up to n of the slot's keys still on From to To with one
// MIGRATE and returns how many it asked for; 0 means none was left.
func (m *Migration) MoveKeys(t testing.TB, n int) int {
	t.Helper()
	v, err := command(m.From.Addr, "CLUSTER", "GETKEYSINSLOT", m.Slot, n)
	if err != nil {
		m.c.fatalf(t, "CLUSTER GETKEYSINSLOT %d %d on %s: %v", m.Slot, n, m.From, err)
	}
	keys, _ := v.([]any)
	if len(keys) == 0 {
		return 0
	}
	// No REPLACE: a key can only be on both sides if something is wrong,
	// and then the test should hear BUSYKEY.
	args := append([]any{"MIGRATE", "127.0.0.1", port(m.To.Addr), "", 0, adminTimeout.Milliseconds(), "KEYS"}, keys...)
	if _, err := command(m.From.Addr, args...); err != nil {
		m.c.fatalf(t, "MIGRATE of %d keys of slot %d from %s to %s: %v", len(keys), m.Slot, m.From, m.To, err)
	}
	return len(keys)
}

// Remaining returns how many keys of the slot are still on From.
func (m *Migration) Remaining(t testing.TB) int {
	t.Helper()
	v, err := command(m.From.Addr, "CLUSTER", "COUNTKEYSINSLOT", m.Slot)
	if err != nil {
		m.c.fatalf(t, "CLUSTER COUNTKEYSINSLOT %d on %s: %v", m.Slot, m.From, err)
	}
	n, _ := v.(int64)
	return int(n)
}

// Finish moves the keys left, assigns the slot to To on To, on From and on
// every other master, and waits until every reachable node agrees.
func (m *Migration) Finish(t testing.TB) {
	t.Helper()
	m.assign(t)
	m.c.waitOwner(t, []SlotRange{{m.Slot, m.Slot}}, m.To)
}

// assign moves the keys left and assigns the slot to To on To, on From and
// on every other master, in that order, as the Redis manual asks.
func (m *Migration) assign(t testing.TB) {
	t.Helper()
	for moved := 1; moved > 0; {
		moved = m.MoveKeys(t, 100)
	}
	order := []*ClusterNode{m.To, m.From}
	for _, n := range m.c.Masters(t) {
		if n != m.To && n != m.From {
			order = append(order, n)
		}
	}
	for _, n := range order {
		if _, err := command(n.Addr, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.To.ID); err != nil {
			m.c.fatalf(t, "CLUSTER SETSLOT %d NODE %s on %s: %v", m.Slot, m.To.ID, n, err)
		}
	}
}

// waitOwner waits until every reachable node sees owner serving slots and
// has no open slot.
func (c *ClusterTopology) waitOwner(t testing.TB, slots []SlotRange, owner *ClusterNode) {
	t.Helper()
	err := poll(reshardTimeout, func() error {
		asked := 0
		for _, n := range c.Nodes {
			views, err := clusterNodes(n.Addr)
			if err != nil {
				continue // down; the others decide
			}
			asked++
			owners := slotOwners(views)
			for _, r := range slots {
				for s := r.First; s <= r.Last; s++ {
					if owners[s] != owner.ID {
						return fmt.Errorf("%s sees slot %d served by %.8s", n, s, owners[s])
					}
				}
			}
			for _, v := range views {
				if len(v.Open) > 0 {
					return fmt.Errorf("%s has open slots %v", n, v.Open)
				}
			}
		}
		if asked == 0 {
			return errors.New("no node answers")
		}
		return nil
	})
	if err != nil {
		c.fatalf(t, "nodes do not agree that %s serves %v within %v: %v", owner, slots, reshardTimeout, err)
	}
}

// agreed reports (as nil) whether every reachable node sees the same
// layout and no open slot.
func (c *ClusterTopology) agreed() error {
	var first, layout string
	for _, n := range c.Nodes {
		views, err := clusterNodes(n.Addr)
		if err != nil {
			continue
		}
		for _, v := range views {
			if len(v.Open) > 0 {
				return fmt.Errorf("%s has open slots %v", n, v.Open)
			}
		}
		l := describeLayout(views)
		if first == "" {
			first, layout = n.String(), l
		} else if l != layout {
			return fmt.Errorf("%s sees the layout\n%s\nbut %s sees\n%s", first, layout, n, l)
		}
	}
	if first == "" {
		return errors.New("no node answers")
	}
	return nil
}

// subtractSlots returns the slots in a and not in b, as ranges.
func subtractSlots(a, b []SlotRange) []SlotRange {
	var in [Slots]bool
	for _, r := range a {
		for s := r.First; s <= r.Last; s++ {
			in[s] = true
		}
	}
	for _, r := range b {
		for s := r.First; s <= r.Last; s++ {
			in[s] = false
		}
	}
	var out []SlotRange
	for s := 0; s < Slots; s++ {
		if !in[s] {
			continue
		}
		if k := len(out) - 1; k >= 0 && out[k].Last == s-1 {
			out[k].Last = s
		} else {
			out = append(out, SlotRange{s, s})
		}
	}
	return out
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
