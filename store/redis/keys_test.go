package redis

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/scripts"
)

// keyShapes are requests of every layout decide.lua reads: one rule of each
// algorithm (the one-rule layout, or the batch for sliding_window_log),
// several rules without sliding_window_log (the flat layout) and several
// with one (the batch).
func keyShapes(t *testing.T, name string) map[string][]*algo.Policy {
	t.Helper()
	pol := func(a algo.Algorithm, i int) *algo.Policy {
		s := algo.Spec{Name: fmt.Sprintf("%s-%s-%d", name, a, i), Algorithm: a, Limit: 5, Window: time.Minute}
		if a == algo.LeakyBucket {
			s.Delay = time.Second
		}
		return algotest.MustPolicy(t, s)
	}
	shapes := map[string][]*algo.Policy{}
	for _, a := range algo.Algorithms() {
		shapes["alone/"+a.String()] = []*algo.Policy{pol(a, 0)}
	}
	shapes["flat/windows"] = []*algo.Policy{pol(algo.FixedWindow, 1), pol(algo.SlidingWindowCounter, 1)}
	shapes["flat/buckets"] = []*algo.Policy{pol(algo.TokenBucket, 1), pol(algo.LeakyBucket, 1), pol(algo.GCRA, 1)}
	shapes["flat/all"] = []*algo.Policy{pol(algo.GCRA, 2), pol(algo.FixedWindow, 2), pol(algo.TokenBucket, 2), pol(algo.SlidingWindowCounter, 2), pol(algo.LeakyBucket, 2)}
	shapes["batch"] = []*algo.Policy{pol(algo.FixedWindow, 3), pol(algo.SlidingWindowLog, 3), pol(algo.TokenBucket, 3)}
	return shapes
}

// TestWrongTypeKeysReadAsNoState: a rule's key that holds another type (a
// list, left by something else under the prefix) reads as no state, in
// every layout, and the decision replaces it with the rule's own state: the
// answers are the memory store's, which has no state for the key, and the
// next decision counts from the first.
func TestWrongTypeKeysReadAsNoState(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch.Add(42 * time.Second))
	srv := redistest.New(t)
	admin := srv.Client(t)
	rs := newRedis(t, admin, srv.Prefix(t))
	rs.clock = clock.Now
	mem := algo.NewMemory(algo.MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	ctx := context.Background()
	for name, rules := range keyShapes(t, "wrongtype") {
		t.Run(name, func(t *testing.T) {
			reqs := make([]algo.Request, len(rules))
			for i, p := range rules {
				reqs[i] = algo.Request{Policy: p, Key: []byte("client"), Cost: 2}
				if err := admin.RPush(ctx, p.StorageKey(rs.prefix, reqs[i].Key), "not", "state").Err(); err != nil {
					t.Fatal(err)
				}
			}
			for step := 0; step < 3; step++ {
				want, got := make([]algo.Result, len(reqs)), make([]algo.Result, len(reqs))
				okWant, err := mem.Decide(ctx, reqs, want)
				if err != nil {
					t.Fatal(err)
				}
				okGot, err := rs.Decide(ctx, reqs, got)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if okWant != okGot || !equalResults(want, got) {
					t.Fatalf("step %d: stores disagree\nmemory %v %+v\nredis  %v %+v", step, okWant, want, okGot, got)
				}
			}
			for i, p := range rules {
				typ, err := admin.Type(ctx, p.StorageKey(rs.prefix, reqs[i].Key)).Result()
				if err != nil {
					t.Fatal(err)
				}
				want := "string"
				if p.Spec().Algorithm == algo.SlidingWindowLog {
					want = "zset"
				}
				if typ != want {
					t.Errorf("rule %d (%s): key is a %s after the decisions, want a %s", i, p.Spec().Algorithm, typ, want)
				}
			}
		})
	}
}

// TestUnreadableKeyFailsBeforeWriting: a rule's key that the user may not
// read (its ACL grants the request's other keys only) fails the decision
// with Redis's refusal, in every layout, and no key of the request is
// written.
func TestUnreadableKeyFailsBeforeWriting(t *testing.T) {
	srv := redistest.New(t)
	admin := srv.Client(t)
	prefix := srv.Prefix(t)
	ctx := context.Background()
	opts, err := goredis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for name, rules := range keyShapes(t, "unreadable") {
		// The unreadable key first, last, or the only one.
		for j, denied := range []int{len(rules) - 1, 0} {
			if j == 1 && len(rules) == 1 {
				continue // the only key, denied above
			}
			t.Run(fmt.Sprintf("%s/denied=%d", name, denied), func(t *testing.T) {
				user := fmt.Sprintf("%s-u%d", prefix, denied)
				args := []any{"ACL", "SETUSER", user}
				keys := make([]string, len(rules))
				for i, p := range rules {
					keys[i] = p.StorageKey(prefix, []byte("client"))
				}
				for _, r := range redistest.LimitedUserRules("pw", prefix) {
					if strings.HasPrefix(r, "~") {
						for i, k := range keys {
							if i != denied {
								args = append(args, "~"+k)
							}
						}
						continue
					}
					args = append(args, r)
				}
				if err := admin.Do(ctx, args...).Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = admin.Do(context.Background(), "ACL", "DELUSER", user).Err() })
				o := *opts
				o.Username, o.Password = user, "pw"
				c := goredis.NewClient(&o)
				t.Cleanup(func() { _ = c.Close() })
				rs := newRedis(t, c, prefix)
				reqs := make([]algo.Request, len(rules))
				for i, p := range rules {
					reqs[i] = algo.Request{Policy: p, Key: []byte("client")}
				}
				res := make([]algo.Result, len(reqs))
				ok, err := rs.Decide(ctx, reqs, res)
				if err == nil || !redistest.IsNoPerm(err) {
					t.Fatalf("Decide = %v, %v, want Redis's refusal of the key", ok, err)
				}
				if n, err := admin.Exists(ctx, keys...).Result(); err != nil || n != 0 {
					t.Errorf("%d of the request's keys exist after the refused decision (%v), want none", n, err)
				}
			})
		}
	}
}

// TestLayoutsAreToldApart: the first byte of decide.lua's argument names its
// layout, and no two layouts share one: a one-rule call's algorithm (never
// sliding_window_log's, which goes as a batch), the flat layout's 7 for a
// call of one request of several rules without a log, three zero bytes
// for any other batch; and a store that talks to the previous release's
// script sends every call as that release's batch, which starts with the
// time.
func TestLayoutsAreToldApart(t *testing.T) {
	srv := redistest.New(t)
	rs := newRedis(t, srv.Client(t), srv.Prefix(t))
	shapes := keyShapes(t, "layout")
	ctx := context.Background()
	for name, rules := range shapes {
		reqs := make([]algo.Request, len(rules))
		for i, p := range rules {
			reqs[i] = algo.Request{Policy: p, Key: []byte("client")}
		}
		for _, general := range []bool{false, true} {
			for _, flags := range []byte{0, 1} {
				c := &call{}
				if err := rs.encode(ctx, c, reqs); err != nil {
					t.Fatal(err)
				}
				rs.general = general
				blob := rs.appendBatch(nil, &worker{parts: []*part{&c.parts[0]}}, flags)
				rs.general = false
				var want []byte
				switch {
				case general:
					// [d] -1: Redis's own time.
					want = []byte{0, 0, 0, 0, 0, 0, 0xf0, 0xbf}
				case flags == 1 || strings.HasPrefix(name, "batch") || rules[0].Spec().Algorithm == algo.SlidingWindowLog:
					want = []byte{0, 0, 0}
				case len(rules) > 1:
					want = []byte{scripts.FlatLayout, 0, 0}
				default:
					want = []byte{byte(rules[0].Spec().Algorithm)}
				}
				if !bytes.HasPrefix(blob, want) {
					t.Errorf("%s (general %v, flags %d): argument starts % x, want % x", name, general, flags, blob[:min(len(blob), 8)], want)
				}
			}
		}
	}
	for _, a := range algo.Algorithms() {
		if byte(a) == scripts.FlatLayout || byte(a) == scripts.BatchLayout {
			t.Errorf("algorithm %s's id %d is the flat layout's or the batch's first byte", a, a)
		}
	}
}
