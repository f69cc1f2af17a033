package algo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestWindowWritesKeepValueAndExpiry: a window counted again in the same
// window keeps its expiry, and its value reads back exactly as written,
// whether the new value has the old one's length (written over in place)
// or not: here the stored index and count have leading zeros, which the
// first write drops from the count, and the count later gains a digit. Alone in its
// request (the one-rule path) and beside a second rule (the general path).
func TestWindowWritesKeepValueAndExpiry(t *testing.T) {
	clock := newFakeClock(epoch.Add(90 * time.Second))
	rs, client, _ := newRedisStore(t, nil)
	rs.clock = clock.Now
	ctx := context.Background()
	const limit, window = 100, time.Minute
	idx := sinceEpoch(clock.Now()) / window.Microseconds()
	other := mustPolicy(t, Spec{Name: "inplace-other", Algorithm: TokenBucket, Limit: 1000, Window: window, Burst: 1000})
	for _, c := range []struct {
		a            Algorithm
		seed, suffix string // the stored value, and what follows the count
		general      bool   // with a second rule
	}{
		{FixedWindow, fmt.Sprintf("%07x:%04x", idx, 5), "", false},
		{SlidingWindowCounter, fmt.Sprintf("%07x:%04x:0", idx, 5), ":0", false},
		{FixedWindow, fmt.Sprintf("%07x:%04x", idx, 5), "", true},
		{SlidingWindowCounter, fmt.Sprintf("%07x:%04x:0", idx, 5), ":0", true},
	} {
		t.Run(fmt.Sprintf("%s/general=%v", c.a, c.general), func(t *testing.T) {
			p := mustPolicy(t, Spec{Name: fmt.Sprintf("inplace-%s-%v", c.a, c.general), Algorithm: c.a, Limit: limit, Window: window})
			key := p.StorageKey(rs.prefix, []byte("client"))
			reqs := []Request{{Policy: p, Key: []byte("client")}}
			if c.general {
				reqs = append(reqs, Request{Policy: other, Key: []byte("client")})
			}
			res := make([]Result, len(reqs))
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
				// The one-rule path writes the index back as read, the
				// general path as a number.
				want := fmt.Sprintf("%07x:%x%s", idx, n, c.suffix)
				if c.general {
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

// TestWindowWritesWithoutSetrange: a user whose ACL does not grant SETRANGE
// (the least-privilege user of earlier releases) still counts windows
// exactly, alone in a request and beside a second rule: decide.lua writes
// them with SET ... KEEPTTL after Redis refuses the SETRANGE.
func TestWindowWritesWithoutSetrange(t *testing.T) {
	srv := redistest.New(t)
	admin := srv.Client(t)
	prefix := srv.Prefix(t)
	ctx := context.Background()
	const password = "without-setrange"
	name := prefix + "-user"
	args := []any{"ACL", "SETUSER", name}
	for _, r := range redistest.LimitedUserRules(password, prefix) {
		if r != "+setrange" {
			args = append(args, r)
		}
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "ACL", "DELUSER", name).Err() })
	opts, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.Username, opts.Password = name, password
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	rs := newRedis(t, c, prefix)
	rs.clock = newFakeClock(epoch.Add(90 * time.Second)).Now
	if err := admin.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	other := mustPolicy(t, Spec{Name: "nosetrange-other", Algorithm: TokenBucket, Limit: 1000, Window: time.Minute, Burst: 1000})
	const limit = 100
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter} {
		for _, general := range []bool{false, true} {
			p := mustPolicy(t, Spec{Name: fmt.Sprintf("nosetrange-%s-%v", a, general), Algorithm: a, Limit: limit, Window: time.Minute})
			reqs := []Request{{Policy: p, Key: []byte("client")}}
			if general {
				reqs = append(reqs, Request{Policy: other, Key: []byte("client")})
			}
			res := make([]Result, len(reqs))
			for n := 1; n <= 20; n++ {
				if ok, err := rs.Decide(ctx, reqs, res); err != nil || !ok || res[0].Remaining != int64(limit-n) {
					t.Fatalf("%s (general %v), request %d: %v, %v, %+v, want allowed with %d remaining", a, general, n, ok, err, res[0], limit-n)
				}
			}
		}
	}
	// authlimit can tell at start.
	if err := rs.CheckInPlaceWrites(ctx); !errors.Is(err, ErrSetrangeDenied) {
		t.Errorf("CheckInPlaceWrites without +setrange: %v, want ErrSetrangeDenied", err)
	}
	// The scripts did try SETRANGE, and Redis refused it.
	log, err := admin.Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fmt.Sprint(log), "setrange") {
		t.Errorf("ACL LOG has no refused SETRANGE: %v", log)
	}
}

// TestCheckInPlaceWrites: a user who may run SETRANGE passes the check,
// which writes nothing: the probe's key does not exist after it.
func TestCheckInPlaceWrites(t *testing.T) {
	srv := redistest.New(t)
	c := srv.Client(t)
	prefix := srv.Prefix(t)
	rs := newRedis(t, c, prefix)
	ctx := context.Background()
	if err := rs.CheckInPlaceWrites(ctx); err != nil {
		t.Fatalf("CheckInPlaceWrites: %v", err)
	}
	n, err := c.Exists(ctx, string(rs.probe.appendStorageKey(nil, prefix, []byte("probe")))).Result()
	if err != nil || n != 0 {
		t.Errorf("the probe's key exists after the check (%d, %v)", n, err)
	}
}
