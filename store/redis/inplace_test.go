package redis

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/redistest"
)

// TestWindowWritesKeepValueAndExpiry: a window counted again in the same
// window keeps its expiry, and its value reads back exactly as written,
// whether the new value has the old one's length (written over in place)
// or not: here the stored index and count have leading zeros, which the
// first write drops from the count, and the count later gains a digit. Alone in its
// request (the one-rule path), beside a token bucket (the flat layout) and
// beside a sliding_window_log (the general path).
func TestWindowWritesKeepValueAndExpiry(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch.Add(90 * time.Second))
	rs, client, _ := newRedisStore(t, nil)
	rs.clock = clock.Now
	ctx := context.Background()
	const limit, window = 100, time.Minute
	idx := algo.SinceEpoch(clock.Now()) / window.Microseconds()
	beside := map[string]*algo.Policy{
		"flat":    algotest.MustPolicy(t, algo.Spec{Name: "inplace-bucket", Algorithm: algo.TokenBucket, Limit: 1000, Window: window, Burst: 1000}),
		"general": algotest.MustPolicy(t, algo.Spec{Name: "inplace-log", Algorithm: algo.SlidingWindowLog, Limit: 1000, Window: window}),
	}
	for _, c := range []struct {
		a            algo.Algorithm
		seed, suffix string // the stored value, and what follows the count
		with         string // "" alone, else a key of beside
	}{
		{algo.FixedWindow, fmt.Sprintf("%07x:%04x", idx, 5), "", ""},
		{algo.SlidingWindowCounter, fmt.Sprintf("%07x:%04x:0", idx, 5), ":0", ""},
		{algo.FixedWindow, fmt.Sprintf("%07x:%04x", idx, 5), "", "flat"},
		{algo.SlidingWindowCounter, fmt.Sprintf("%07x:%04x:0", idx, 5), ":0", "flat"},
		{algo.FixedWindow, fmt.Sprintf("%07x:%04x", idx, 5), "", "general"},
		{algo.SlidingWindowCounter, fmt.Sprintf("%07x:%04x:0", idx, 5), ":0", "general"},
	} {
		t.Run(fmt.Sprintf("%s/with=%s", c.a, c.with), func(t *testing.T) {
			p := algotest.MustPolicy(t, algo.Spec{Name: fmt.Sprintf("inplace-%s-%s", c.a, c.with), Algorithm: c.a, Limit: limit, Window: window})
			key := p.StorageKey(rs.prefix, []byte("client"))
			reqs := []algo.Request{{Policy: p, Key: []byte("client")}}
			if c.with != "" {
				reqs = append(reqs, algo.Request{Policy: beside[c.with], Key: []byte("client")})
			}
			res := make([]algo.Result, len(reqs))
			const ttl = 50 * time.Second
			if err := client.Set(ctx, key, c.seed, ttl).Err(); err != nil {
				t.Fatal(err)
			}
			for n := 6; n <= 40; n++ {
				if ok, err := rs.Decide(ctx, reqs, res); err != nil || !ok || res[0].Remaining != int64(limit-n) {
					t.Fatalf("request for count %d: %v, %v, %+v, want allowed with %d remaining", n, ok, err, res[0], limit-n)
				}
				got, err := client.Get(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				// The one-rule path and the flat layout write the index
				// back as read, the general path as a number.
				want := fmt.Sprintf("%07x:%x%s", idx, n, c.suffix)
				if c.with == "general" {
					want = fmt.Sprintf("%x:%x%s", idx, n, c.suffix)
				}
				if got != want {
					t.Fatalf("after count %d the key holds %q, want %q", n, got, want)
				}
				if left := client.PTTL(ctx, key).Val(); left <= 0 || left > ttl {
					t.Fatalf("after count %d the key expires in %v, want the seeded expiry (at most %v)", n, left, ttl)
				}
			}
		})
	}
}

// TestWindowWritesWithoutSetrange: a user whose ACL grants neither SETRANGE
// nor MGET (the least-privilege user of earlier releases) still counts
// windows exactly, alone in a request, beside a bucket (the flat layout)
// and beside a sliding_window_log (the general path): decide.lua writes
// them with SET ... KEEPTTL after Redis refuses the SETRANGE, and reads a
// request's keys with a GET each after Redis refuses the MGET.
func TestWindowWritesWithoutSetrange(t *testing.T) {
	srv := redistest.New(t)
	admin := srv.Client(t)
	prefix := srv.Prefix(t)
	ctx := context.Background()
	const password = "without-setrange"
	name := prefix + "-user"
	args := []any{"ACL", "SETUSER", name}
	for _, r := range redistest.LimitedUserRules(password, prefix) {
		if r != "+setrange" && r != "+mget" {
			args = append(args, r)
		}
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "ACL", "DELUSER", name).Err() })
	opts, err := goredis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.Username, opts.Password = name, password
	c := goredis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	rs := newRedis(t, c, prefix)
	rs.clock = algotest.NewClock(algotest.Epoch.Add(90 * time.Second)).Now
	if err := admin.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	beside := []*algo.Policy{
		nil,
		algotest.MustPolicy(t, algo.Spec{Name: "nosetrange-bucket", Algorithm: algo.TokenBucket, Limit: 1000, Window: time.Minute, Burst: 1000}),
		algotest.MustPolicy(t, algo.Spec{Name: "nosetrange-log", Algorithm: algo.SlidingWindowLog, Limit: 1000, Window: time.Minute}),
	}
	const limit = 100
	for _, a := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowCounter} {
		for i, other := range beside {
			p := algotest.MustPolicy(t, algo.Spec{Name: fmt.Sprintf("nosetrange-%s-%d", a, i), Algorithm: a, Limit: limit, Window: time.Minute})
			reqs := []algo.Request{{Policy: p, Key: []byte("client")}}
			if other != nil {
				reqs = append(reqs, algo.Request{Policy: other, Key: []byte("client")})
			}
			res := make([]algo.Result, len(reqs))
			for n := 1; n <= 20; n++ {
				if ok, err := rs.Decide(ctx, reqs, res); err != nil || !ok || res[0].Remaining != int64(limit-n) {
					t.Fatalf("%s (with %d), request %d: %v, %v, %+v, want allowed with %d remaining", a, i, n, ok, err, res[0], limit-n)
				}
			}
		}
	}
	// authlimit can tell at start.
	if refused, err := rs.RefusedCommands(ctx); err != nil || !slices.Equal(refused, []string{"SETRANGE", "MGET"}) {
		t.Errorf("RefusedCommands without +setrange and +mget: %q, %v; want [SETRANGE MGET]", refused, err)
	}
	// The scripts did try SETRANGE, and Redis refused it.
	log, err := admin.Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"setrange", "mget"} {
		if !strings.Contains(fmt.Sprint(log), cmd) {
			t.Errorf("ACL LOG has no refused %s: %v", cmd, log)
		}
	}
}

// TestRefusedCommands: a user who may run every command gets none back,
// and the check writes nothing: the probe's key does not exist after it.
func TestRefusedCommands(t *testing.T) {
	srv := redistest.New(t)
	c := srv.Client(t)
	prefix := srv.Prefix(t)
	rs := newRedis(t, c, prefix)
	ctx := context.Background()
	if refused, err := rs.RefusedCommands(ctx); err != nil || len(refused) > 0 {
		t.Fatalf("RefusedCommands: %q, %v; want none", refused, err)
	}
	n, err := c.Exists(ctx, string(rs.probe.AppendStorageKey(nil, prefix, []byte("probe")))).Result()
	if err != nil || n != 0 {
		t.Errorf("the probe's key exists after the check (%d, %v)", n, err)
	}
}
