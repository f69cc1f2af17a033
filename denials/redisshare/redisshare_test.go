package redisshare_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/denials"
	"github.com/authlimit/authlimit/denials/redisshare"
	"github.com/authlimit/authlimit/internal/redistest"
)

func prefix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "test-" + hex.EncodeToString(b)
}

func recorder(t *testing.T, client redis.UniversalClient, prefix, name string, now func() time.Time) *denials.Recorder {
	t.Helper()
	r, err := denials.New(denials.Options{
		Size: 16, Window: 10 * time.Minute, Exchange: redisshare.New(client, prefix),
		Replica: name, ShareInterval: time.Second, Clock: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTwoReplicasShareTheirTop: three clients denied 35, 20 and 10 times
// between two replicas, each replica publishing once: Top on either lists
// exactly those counts, in that order, as an exact answer from both
// replicas; through the least-privilege Redis user, so that the commands
// used are the ones it has.
func TestTwoReplicasShareTheirTop(t *testing.T) {
	srv := redistest.New(t)
	p := prefix()
	var client redis.UniversalClient
	if srv.Owned {
		client = redistest.NewACLUser(t, srv, p).Client(t)
	} else {
		opts, err := redis.ParseURL(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		client = redis.NewClient(opts)
		t.Cleanup(func() { client.Close() })
	}
	now := time.Now
	a := recorder(t, client, p, "a", now)
	b := recorder(t, client, p, "b", now)
	// Split each client's denials between the replicas unevenly.
	for _, c := range []struct {
		ip   string
		a, b int
	}{{"198.51.100.1", 30, 5}, {"198.51.100.2", 1, 19}, {"198.51.100.3", 5, 5}} {
		for i := 0; i < c.a+c.b; i++ {
			r := a
			if i >= c.a {
				r = b
			}
			r.Observe(&decide.Decision{Rule: "per-ip", Policy: "per-ip", Tag: []byte(c.ip), Client: netip.MustParseAddr(c.ip), Denied: true, Now: now()})
		}
	}
	ctx := context.Background()
	for _, r := range []*denials.Recorder{a, b} {
		if err := r.Publish(ctx); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	for name, r := range map[string]*denials.Recorder{"a": a, "b": b} {
		ans := r.Top(ctx, "per-ip", 10)
		if !ans.Shared || ans.ShareError != "" {
			t.Fatalf("%s: shared %v, error %q", name, ans.Shared, ans.ShareError)
		}
		var got []string
		for _, e := range ans.Current.Entries {
			got = append(got, fmt.Sprintf("%s=%d", e.Client, e.Denied))
		}
		if want := "198.51.100.1=35 198.51.100.2=20 198.51.100.3=10"; strings.Join(got, " ") != want {
			t.Errorf("replica %s: top = %s, want %s", name, strings.Join(got, " "), want)
		}
		if !ans.Current.Exact || ans.Current.Replicas != 2 {
			t.Errorf("replica %s: exact %v, replicas %d; want exact, 2", name, ans.Current.Exact, ans.Current.Replicas)
		}
	}
}

// TestPublishKeysExpire: a replica with no new denial since its last
// publish sends nothing; the keys it sent expire.
func TestPublishKeysExpire(t *testing.T) {
	srv := redistest.New(t)
	opts, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	p := prefix()
	r := recorder(t, client, p, "a", time.Now)
	r.Observe(&decide.Decision{Rule: "r", Tag: []byte("k"), Denied: true, Now: time.Now()})
	ctx := context.Background()
	if err := r.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	keys, _, err := client.Scan(ctx, 0, p+":*", 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("keys %v, want the window's index and the replica's summary", keys)
	}
	for _, k := range keys {
		ttl := client.PTTL(ctx, k).Val()
		if ttl <= 0 || ttl > 21*time.Minute {
			t.Errorf("%s: TTL %s, want one within two windows", k, ttl)
		}
		if err := client.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if keys, _, _ := client.Scan(ctx, 0, p+":*", 100).Result(); len(keys) != 0 {
		t.Errorf("a publish with nothing new wrote %v", keys)
	}
}
