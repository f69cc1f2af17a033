package algo

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestWindowWritesKeepValueAndExpiry: a window counted again in the same
// window keeps its expiry, and its value reads back exactly as written,
// whether the new value has the old one's length (written over in place)
// or not: here the stored index and count have leading zeros, which the
// first write drops from the count, and the count later gains a digit.
func TestWindowWritesKeepValueAndExpiry(t *testing.T) {
	clock := newFakeClock(epoch.Add(90 * time.Second))
	rs, client, _ := newRedisStore(t, nil)
	rs.clock = clock.Now
	ctx := context.Background()
	const limit, window = 100, time.Minute
	idx := sinceEpoch(clock.Now()) / window.Microseconds()
	for _, c := range []struct {
		a            Algorithm
		seed, suffix string // the stored value, and what follows the count
	}{
		{FixedWindow, fmt.Sprintf("%07x:%04x", idx, 5), ""},
		{SlidingWindowCounter, fmt.Sprintf("%07x:%04x:0", idx, 5), ":0"},
	} {
		t.Run(c.a.String(), func(t *testing.T) {
			p := mustPolicy(t, Spec{Name: "inplace-" + c.a.String(), Algorithm: c.a, Limit: limit, Window: window})
			key := p.StorageKey(rs.prefix, []byte("client"))
			const ttl = 50 * time.Second
			if err := client.Set(ctx, key, c.seed, ttl).Err(); err != nil {
				t.Fatal(err)
			}
			for n := 6; n <= 40; n++ {
				res := decideOne(t, rs, Request{Policy: p, Key: []byte("client")})
				if !res.Allowed || res.Remaining != int64(limit-n) {
					t.Fatalf("request for count %d: %+v, want allowed with %d remaining", n, res, limit-n)
				}
				got, err := client.Get(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				if want := fmt.Sprintf("%07x:%x%s", idx, n, c.suffix); got != want {
					t.Fatalf("after count %d the key holds %q, want %q", n, got, want)
				}
				if left := client.PTTL(ctx, key).Val(); left <= 0 || left > ttl {
					t.Fatalf("after count %d the key expires in %v, want the seeded expiry (at most %v)", n, left, ttl)
				}
			}
		})
	}
}
