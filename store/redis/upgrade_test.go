package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// previousDecide is the decide.lua of the release before this one, whose
// replicas share Redis with this release's during a rolling upgrade. It
// reads the batch as this release's does (not the one-rule layout, which
// the store then does not send it), and this release reads its replies; it
// is replaced when a release changes the state the scripts keep.
const previousDecide = "testdata/decide_previous.lua"

// usePreviousScript makes rs run the previous release's decide.lua.
func usePreviousScript(t *testing.T, rs *Store) {
	t.Helper()
	src, err := os.ReadFile(previousDecide)
	if err != nil {
		t.Fatal(err)
	}
	rs.decideSHA = digest(string(src))
	rs.decideSHAArg, rs.decideSrcArg = rs.decideSHA, string(src)
	rs.direct = newDecideDialer(rs.client, rs.decideSHA, string(src))
	rs.general = true
}

// TestRollingUpgradeSharesState decides random sequences on one Redis by
// two stores taking turns at random on the same keys, one running the
// previous release's decide.lua and one this release's, and requires every
// answer the memory store gives deciding the same sequence alone: during a
// rolling upgrade a replica of either release reads, and counts on, the
// state the other wrote.
func TestRollingUpgradeSharesState(t *testing.T) {
	t.Parallel()
	sequences := 600
	if testing.Short() {
		sequences = 100
	}
	clock := algotest.NewClock(algotest.Epoch)
	stores := bothStores(t, clock)
	mem, cur := stores[0].store, stores[1].store.(*Store)
	prev := newRedis(t, cur.client, cur.prefix)
	prev.clock = clock.Now
	usePreviousScript(t, prev)
	if prev.decideSHA == cur.decideSHA {
		t.Fatal("the previous decide.lua is this release's: the test would compare a script with itself")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ctx := context.Background()
	turns := [2]int{}
	for seq := 0; seq < sequences; seq++ {
		rng := rand.New(rand.NewPCG(seed, uint64(seq)))
		rules := make([]*algo.Policy, 1+rng.IntN(3))
		for i := range rules {
			rules[i] = algotest.MustPolicy(t, randomSpec(rng, fmt.Sprintf("u%d-r%d", seq, i)))
		}
		clock.Set(algotest.Epoch.Add(time.Duration(rng.Int64N(int64(24 * time.Hour)))))
		var history strings.Builder
		for step := 0; step < 16; step++ {
			clock.Advance(randomGap(rng, rules[rng.IntN(len(rules))]))
			n := 1 + rng.IntN(len(rules))
			reqs := make([]algo.Request, 0, n)
			for _, i := range rng.Perm(len(rules))[:n] {
				reqs = append(reqs, algo.Request{Policy: rules[i], Key: []byte{byte('a' + rng.IntN(2))}, Cost: randomCost(rng, rules[i]), Shadow: rng.IntN(5) == 0})
			}
			turn := rng.IntN(2)
			turns[turn]++
			rs := []*Store{prev, cur}[turn]
			fmt.Fprintf(&history, "  t=%d by %s:", clock.Micros(), []string{"previous", "current"}[turn])
			for _, q := range reqs {
				fmt.Fprintf(&history, " %s(%+v)[%s cost %d shadow %v]", q.Policy.Spec().Name, q.Policy.Spec(), q.Key, q.Cost, q.Shadow)
			}
			history.WriteString("\n")
			want, got := make([]algo.Result, n), make([]algo.Result, n)
			okWant, err := mem.Decide(ctx, reqs, want)
			if err != nil {
				t.Fatalf("memory: %v", err)
			}
			okGot, err := rs.Decide(ctx, reqs, got)
			if err != nil {
				t.Fatalf("redis: %v", err)
			}
			if okWant != okGot || !equalResults(want, got) {
				t.Fatalf("sequence %d step %d: the scripts disagree with the memory store\nmemory %v %+v\nredis  %v %+v\nhistory:\n%s",
					seq, step, okWant, want, okGot, got, history.String())
			}
		}
	}
	if turns[0] == 0 || turns[1] == 0 {
		t.Fatalf("turns %v: one script never decided", turns)
	}
}

// TestRollingUpgradeOnRedisTime counts one key of each algorithm down from
// its limit with Redis TIME as the clock, as in production, the previous
// and this release's decide.lua taking turns: each sees what the other
// consumed, and the request past the limit is denied whichever decides it.
func TestRollingUpgradeOnRedisTime(t *testing.T) {
	cur, client, _ := newRedisStore(t, nil)
	prev := newRedis(t, client, cur.prefix)
	usePreviousScript(t, prev)
	ctx := context.Background()
	const limit = 10
	for _, a := range algo.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			p := algotest.MustPolicy(t, algo.Spec{Name: "upgrade-" + a.String(), Algorithm: a, Limit: limit, Window: time.Hour})
			reqs := []algo.Request{{Policy: p, Key: []byte("198.51.100.7")}}
			res := make([]algo.Result, 1)
			for i := 0; i <= limit; i++ {
				rs, name := prev, "previous"
				if i%2 == 1 {
					rs, name = cur, "current"
				}
				ok, err := rs.Decide(ctx, reqs, res)
				if err != nil {
					t.Fatalf("decision %d by the %s script: %v", i+1, name, err)
				}
				if wantOK := i < limit; ok != wantOK {
					t.Fatalf("decision %d by the %s script: admitted %v, want %v", i+1, name, ok, wantOK)
				}
				if i < limit {
					if got, want := res[0].Remaining, int64(limit-1-i); got != want {
						t.Errorf("decision %d by the %s script: Remaining = %d, want %d", i+1, name, got, want)
					}
				}
			}
			// And the other way round: the denial stands for the other script.
			if ok, err := cur.Decide(ctx, reqs, res); err != nil || ok {
				t.Errorf("a decision past the limit by the current script = %v, %v, want denied", ok, err)
			}
		})
	}
}
