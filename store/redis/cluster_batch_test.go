package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/redistest"
)

// scriptStats returns a node's script calls (EVALSHA and EVAL) and those
// of them that answered an error, from INFO commandstats.
func scriptStats(t *testing.T, c *goredis.Client) (calls, failed int64) {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, cmd := range []string{"evalsha", "eval"} {
			rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":")
			if !ok {
				continue
			}
			for _, f := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(f, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					calls += n
				case "failed_calls":
					failed += n
				}
			}
		}
	}
	return calls, failed
}

// runBatch decides one request of rule per key, all in one batch, as a
// worker sends what waits in the queue, and returns each request's result.
func runBatch(t *testing.T, rs *Store, rule *algo.Policy, keys []string) []algo.Result {
	t.Helper()
	w := &worker{}
	calls := make([]*call, len(keys))
	for i, k := range keys {
		c := &call{done: make(chan struct{}, 1)}
		if err := rs.encode(context.Background(), c, []algo.Request{{Policy: rule, Key: []byte(k)}}); err != nil {
			t.Fatal(err)
		}
		c.deadline = time.Now().Add(10 * time.Second)
		calls[i] = c
		w.batch = append(w.batch, c)
	}
	rs.run(w, time.Now().Add(10*time.Second))
	out := make([]algo.Result, len(keys))
	for i, c := range calls {
		<-c.done
		if c.err != nil {
			t.Fatalf("%s: %v", keys[i], c.err)
		}
		out[i] = c.res[0]
	}
	return out
}

// topologyStore starts a cluster of three primaries and returns it with a
// warmed store on it.
func topologyStore(t *testing.T) (*redistest.ClusterTopology, *Store) {
	t.Helper()
	topo := redistest.NewClusterTopology(t, 3, 0)
	rs := newRedis(t, topo.Client(t), topo.Prefix(t))
	if err := rs.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	return topo, rs
}

// TestClusterOneCallPerPrimary: a batch whose requests fall on many slots
// goes to each primary as one script call, whatever the number of its
// slots, and decides every request once.
func TestClusterOneCallPerPrimary(t *testing.T) {
	t.Parallel()
	topo, rs := topologyStore(t)
	rule := algotest.MustPolicy(t, algo.Spec{Name: "per-primary", Algorithm: algo.FixedWindow, Limit: 1000, Window: time.Hour})
	var keys []string
	slotsOf := map[*redistest.ClusterNode]map[uint16]bool{}
	for i := range 60 {
		k := "198.51.100." + strconv.Itoa(i)
		keys = append(keys, k)
		m := topo.MasterForKey(t, "x{"+k+"}")
		if slotsOf[m] == nil {
			slotsOf[m] = map[uint16]bool{}
		}
		slotsOf[m][slot([]byte(k))] = true
	}
	masters := topo.Masters(t)
	for _, m := range masters {
		if len(slotsOf[m]) < 2 {
			t.Fatalf("%s serves %d of the keys' slots; the test wants several on each", m, len(slotsOf[m]))
		}
	}
	for round := int64(1); round <= 2; round++ {
		before := map[*redistest.ClusterNode]int64{}
		for _, m := range masters {
			before[m], _ = scriptStats(t, m.Client(t))
		}
		for i, res := range runBatch(t, rs, rule, keys) {
			if !res.Allowed || res.Remaining != 1000-round {
				t.Errorf("round %d, %s: %+v, want allowed with %d remaining", round, keys[i], res, 1000-round)
			}
		}
		for _, m := range masters {
			calls, _ := scriptStats(t, m.Client(t))
			if got := calls - before[m]; got != 1 {
				t.Errorf("round %d: %s got %d script calls for the requests of its %d slots, want 1", round, m, got, len(slotsOf[m]))
			}
		}
	}
}

// TestClusterBatchAcrossAMigration: a primary's call whose slots include
// one migrating away, its key already moved, decides nothing there: it
// answers TRYAGAIN before any write, and its requests go again slot by
// slot, the moved key's after an ASK to the importing primary. Every
// request is decided exactly once, before, during and after the migration.
func TestClusterBatchAcrossAMigration(t *testing.T) {
	t.Parallel()
	topo, rs := topologyStore(t)
	rule := algotest.MustPolicy(t, algo.Spec{Name: "migrating", Algorithm: algo.SlidingWindowCounter, Limit: 1000, Window: time.Hour})
	masters := topo.Masters(t)
	from, to := masters[0], masters[1]
	// Keys of several slots of from; the last is the one whose slot moves,
	// so that the call's declared keys are another slot's.
	var keys []string
	seen := map[uint16]bool{}
	for i := 0; len(keys) < 6; i++ {
		k := "203.0.113." + strconv.Itoa(i)
		if s := slot([]byte(k)); !seen[s] && topo.MasterForKey(t, "x{"+k+"}") == from {
			seen[s] = true
			keys = append(keys, k)
		}
	}
	moving := int(slot([]byte(keys[len(keys)-1])))
	check := func(round int64) {
		t.Helper()
		for i, res := range runBatch(t, rs, rule, keys) {
			if !res.Allowed || res.Remaining != 1000-round {
				t.Errorf("round %d, %s: %+v, want allowed with %d remaining: each request decided exactly once", round, keys[i], res, 1000-round)
			}
		}
	}
	check(1)
	m := topo.BeginMigration(t, moving, to)
	if m.MoveKeys(t, 10) == 0 {
		t.Fatal("no key of the migrating slot to move")
	}
	_, failed0 := scriptStats(t, from.Client(t))
	calls0, _ := scriptStats(t, to.Client(t))
	check(2)
	if _, failed := scriptStats(t, from.Client(t)); failed-failed0 != 1 {
		t.Errorf("%s answered %d failed script calls in the migration, want 1: the primary's call, refused before deciding", from, failed-failed0)
	}
	if calls, _ := scriptStats(t, to.Client(t)); calls-calls0 != 1 {
		t.Errorf("%s got %d script calls in the migration, want 1: the moved key's, asked", to, calls-calls0)
	}
	m.Finish(t)
	check(3)
	if got := fmt.Sprint(topo.MasterForSlot(t, moving)); got != fmt.Sprint(to) {
		t.Errorf("slot %d is on %s after the migration, want %s", moving, got, to)
	}
}

// TestClusterWithoutExists: a user not granted EXISTS (earlier releases
// needed it only for refunds), with README's least-privilege rules and
// +cluster|slots otherwise, still gets every request decided exactly
// once, each primary's slots one call each after its call is refused, and
// RefusedCommands names EXISTS, which start-up then warns of.
func TestClusterWithoutExists(t *testing.T) {
	t.Parallel()
	topo := redistest.NewClusterTopology(t, 3, 0)
	prefix := topo.Prefix(t)
	const user, password = "no-exists", "no-exists-password"
	for _, m := range topo.Masters(t) {
		rules := append([]any{"ACL", "SETUSER", user}, anys(redistest.LimitedUserRules(password, prefix, "cluster|slots"))...)
		admin := m.Client(t)
		if err := admin.Do(context.Background(), rules...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.Do(context.Background(), "ACL", "SETUSER", user, "-exists").Err(); err != nil {
			t.Fatal(err)
		}
	}
	client := topo.Client(t, func(o *goredis.ClusterOptions) { o.Username, o.Password = user, password })
	rs := newRedis(t, client, prefix)
	if err := rs.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	if refused, err := rs.RefusedCommands(context.Background()); err != nil || fmt.Sprint(refused) != "[EXISTS]" {
		t.Errorf("RefusedCommands without +exists: %q, %v; want [EXISTS]", refused, err)
	}
	rule := algotest.MustPolicy(t, algo.Spec{Name: "no-exists", Algorithm: algo.TokenBucket, Limit: 1000, Window: time.Hour})
	var keys []string
	for i := range 30 {
		keys = append(keys, "192.0.2."+strconv.Itoa(i))
	}
	for round := int64(1); round <= 2; round++ {
		for i, res := range runBatch(t, rs, rule, keys) {
			if !res.Allowed || res.Remaining != 1000-round {
				t.Errorf("round %d, %s: %+v, want allowed with %d remaining", round, keys[i], res, 1000-round)
			}
		}
	}
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestClusterRequestAcrossSlotsOfOnePrimary: a request whose rules' keys
// fall on several slots of one primary is decided there as one request, in
// one call: a rule that denies leaves the others on that primary
// unconsumed with no refund, while a part on another primary that admitted
// is refunded.
func TestClusterRequestAcrossSlotsOfOnePrimary(t *testing.T) {
	t.Parallel()
	topo, rs := topologyStore(t)
	masters := topo.Masters(t)
	m, n := masters[0], masters[1]
	var onM []string
	var onN string
	for i := 0; len(onM) < 2 || onN == ""; i++ {
		k := "203.0.113." + strconv.Itoa(i)
		switch topo.MasterForKey(t, "x{"+k+"}") {
		case m:
			if len(onM) == 0 || slot([]byte(onM[0])) != slot([]byte(k)) {
				onM = append(onM, k)
			}
		case n:
			onN = k
		}
	}
	many := algotest.MustPolicy(t, algo.Spec{Name: "many", Algorithm: algo.SlidingWindowLog, Limit: 3, Window: time.Hour})
	one := algotest.MustPolicy(t, algo.Spec{Name: "one", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Hour})
	other := algotest.MustPolicy(t, algo.Spec{Name: "other", Algorithm: algo.TokenBucket, Limit: 10, Window: time.Hour})
	reqs := []algo.Request{{Policy: many, Key: []byte(onM[0])}, {Policy: one, Key: []byte(onM[1])}, {Policy: other, Key: []byte(onN)}}
	ctx := context.Background()
	res := make([]algo.Result, len(reqs))
	if ok, err := rs.Decide(ctx, reqs, res); !ok || err != nil {
		t.Fatalf("first decision: %v, %v, want admitted", ok, err)
	}
	mc, nc := m.Client(t), n.Client(t)
	beforeM, _ := scriptStats(t, mc)
	beforeN, _ := scriptStats(t, nc)
	ok, err := rs.Decide(ctx, reqs, res)
	if ok || err != nil {
		t.Fatalf("second decision: %v, %v, want denied by rule one", ok, err)
	}
	afterM, _ := scriptStats(t, mc)
	afterN, _ := scriptStats(t, nc)
	if got := afterM - beforeM; got != 1 {
		t.Errorf("%s answered %d script calls for the denied request, want 1: its two slots decided as one request, nothing to refund", m, got)
	}
	if got := afterN - beforeN; got != 2 {
		t.Errorf("%s answered %d script calls for the denied request, want 2: its part admitted, then refunded", n, got)
	}
	want := []algo.Result{
		{Allowed: true, Limit: 3, Remaining: 2},
		{Allowed: false, Reason: algo.ReasonLimited, Limit: 1, Remaining: 0},
		{Allowed: true, Limit: 10, Remaining: 9},
	}
	for i, w := range want {
		g := res[i]
		if g.Allowed != w.Allowed || g.Reason != w.Reason || g.Limit != w.Limit || g.Remaining != w.Remaining {
			t.Errorf("rule %d of the denied request: %+v, want allowed %v, reason %v, %d of %d remaining", i, g, w.Allowed, w.Reason, w.Remaining, w.Limit)
		}
	}
	for i, w := range []int64{1, 8} {
		q := reqs[2*i]
		if got := algotest.DecideOne(t, rs, q); got.Remaining != w {
			t.Errorf("%s alone after the denied request: %d remaining, want %d (nothing consumed by it)", q.Policy.Name(), got.Remaining, w)
		}
	}
}

// TestClusterBatchOfRequestsAcrossSlots: in one batch, requests whose rules
// span the same slots of one primary are each decided as one request in
// the primary's one call, in the batch's order: the second sees what the
// first consumed, and its denial consumes nothing and refunds nothing.
func TestClusterBatchOfRequestsAcrossSlots(t *testing.T) {
	t.Parallel()
	topo, rs := topologyStore(t)
	m := topo.Masters(t)[0]
	var keys []string
	for i := 0; len(keys) < 2; i++ {
		k := "192.0.2." + strconv.Itoa(i)
		if topo.MasterForKey(t, "x{"+k+"}") == m && (len(keys) == 0 || slot([]byte(keys[0])) != slot([]byte(k))) {
			keys = append(keys, k)
		}
	}
	many := algotest.MustPolicy(t, algo.Spec{Name: "many", Algorithm: algo.GCRA, Limit: 5, Window: time.Hour})
	one := algotest.MustPolicy(t, algo.Spec{Name: "one", Algorithm: algo.SlidingWindowCounter, Limit: 1, Window: time.Hour})
	reqs := []algo.Request{{Policy: many, Key: []byte(keys[0])}, {Policy: one, Key: []byte(keys[1])}}
	mc := m.Client(t)
	before, _ := scriptStats(t, mc)
	w := &worker{}
	calls := make([]*call, 3)
	for i := range calls {
		c := &call{done: make(chan struct{}, 1)}
		if err := rs.encode(context.Background(), c, reqs); err != nil {
			t.Fatal(err)
		}
		c.deadline = time.Now().Add(10 * time.Second)
		calls[i] = c
		w.batch = append(w.batch, c)
	}
	rs.run(w, time.Now().Add(10*time.Second))
	for i, c := range calls {
		<-c.done
		if c.err != nil {
			t.Fatalf("request %d: %v", i, c.err)
		}
		if want := i == 0; c.admitted != want {
			t.Errorf("request %d of the batch: admitted %v, want %v", i, c.admitted, want)
		}
		if got := c.res[0]; !got.Allowed || got.Remaining != 4 {
			t.Errorf("request %d, rule many: %+v, want allowed with 4 remaining (only the first request consumed)", i, got)
		}
	}
	after, _ := scriptStats(t, mc)
	if got := after - before; got != 1 {
		t.Errorf("%s answered %d script calls for the batch, want 1: each request's two slots decided as one, nothing refunded", m, got)
	}
	if got := algotest.DecideOne(t, rs, reqs[0]); got.Remaining != 3 {
		t.Errorf("rule many alone after the batch: %d remaining, want 3", got.Remaining)
	}
}

// TestClusterRedirectionsReloadNoLayout: calls that Redis redirects, for
// the whole of a slot's migration, go to the importing primary without the
// client reloading the cluster's layout (CLUSTER SLOTS) for each.
func TestClusterRedirectionsReloadNoLayout(t *testing.T) {
	t.Parallel()
	topo, rs := topologyStore(t)
	rule := algotest.MustPolicy(t, algo.Spec{Name: "asked", Algorithm: algo.FixedWindow, Limit: 1000, Window: time.Hour})
	masters := topo.Masters(t)
	from, to := masters[0], masters[1]
	var key string
	for i := 0; key == ""; i++ {
		if k := "198.51.100." + strconv.Itoa(i); topo.MasterForKey(t, "x{"+k+"}") == from {
			key = k
		}
	}
	q := algo.Request{Policy: rule, Key: []byte(key)}
	algotest.DecideOne(t, rs, q)
	m := topo.BeginMigration(t, int(slot([]byte(key))), to)
	if m.MoveKeys(t, 10) == 0 {
		t.Fatal("no key of the migrating slot to move")
	}
	layouts := func() (n int64) {
		for _, node := range masters {
			n += nodeCalls(t, node, "cluster|slots")
		}
		return n
	}
	before, asked0 := layouts(), nodeCalls(t, to, "asking")
	const n = 20
	for i := range n {
		if got := algotest.DecideOne(t, rs, q); !got.Allowed || got.Remaining != 1000-2-int64(i) {
			t.Fatalf("decision %d in the migration: %+v, want allowed with %d remaining", i, got, 1000-2-i)
		}
	}
	if got := nodeCalls(t, to, "asking") - asked0; got != n {
		t.Errorf("%s was asked %d times, want %d: every call redirected", to, got, n)
	}
	if got := layouts() - before; got > 1 {
		t.Errorf("the masters answered CLUSTER SLOTS %d times for %d redirected calls, want at most 1", got, n)
	}
	m.Finish(t)
}

// nodeCalls returns how many times node has answered the command, as INFO
// commandstats names it ("asking", "cluster|slots").
func nodeCalls(t *testing.T, node *redistest.ClusterNode, cmd string) int64 {
	t.Helper()
	info, err := node.Client(t).Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	return commandCalls(info, cmd)
}
