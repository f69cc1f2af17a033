package algo_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

func TestTagsAreSafeStorageKeys(t *testing.T) {
	r := algotest.MustPolicy(t, algo.Spec{Name: "per-ip", Algorithm: algo.GCRA, Limit: 10, Window: time.Second})
	long := strings.Repeat("x", 10_000)
	tests := []struct {
		key  string
		want string // exact key, or "" to check the hashed shape
	}{
		{key: "203.0.113.7", want: "al:per-ip:{203.0.113.7}:g"},
		{key: "2001:db8::1", want: "al:per-ip:{2001:db8::1}:g"},
		{key: "user@example.com", want: "al:per-ip:{user@example.com}:g"},
		{key: "{victim}"},
		{key: "a}b{c"},
		{key: "#0123456789abcdef0123456789abcdef"},
		{key: ""},
		{key: "with space"},
		{key: "caf\xc3\xa9"},
		{key: "\xff\xfe"},
		{key: "line\r\nbreak"},
		{key: long},
	}
	for _, tc := range tests {
		tag := algo.Tag(tc.key)
		if !algo.ValidTag(tag) {
			t.Errorf("Tag(%.40q) = %q is not a valid tag", tc.key, tag)
		}
		got := r.StorageKey("al", tag)
		if tc.want != "" {
			if got != tc.want {
				t.Errorf("StorageKey(Tag(%q)) = %q, want %q", tc.key, got, tc.want)
			}
			continue
		}
		body := got[strings.IndexByte(got, '{')+1 : strings.IndexByte(got, '}')]
		if len(body) != algo.HashedTagLen || body[0] != '#' {
			t.Errorf("StorageKey(Tag(%.40q)) = %q, want a hashed tag", tc.key, got)
		}
		if strings.Count(got, "{") != 1 || strings.Count(got, "}") != 1 {
			t.Errorf("StorageKey(Tag(%.40q)) = %q: user data reached the hash tag", tc.key, got)
		}
		if len(got) > 80 {
			t.Errorf("StorageKey of a %d-byte key is %d bytes long", len(tc.key), len(got))
		}
	}
	// A key that looks like a hash cannot land on the hashed key's state.
	hashed := string(algo.Tag(long))
	if string(algo.Tag(hashed)) == hashed {
		t.Errorf("Tag(%q) kept a hash-shaped key as is: it could collide", hashed)
	}
	// The stores refuse keys that are not tags.
	for _, bad := range []string{"", "{x}", "with space", "#zz", strings.Repeat("k", 65)} {
		if algo.ValidTag([]byte(bad)) {
			t.Errorf("ValidTag(%.40q) = true", bad)
		}
	}
}

func TestKeysOfPoliciesNeverCollide(t *testing.T) {
	a := algotest.MustPolicy(t, algo.Spec{Name: "a", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Second})
	ab := algotest.MustPolicy(t, algo.Spec{Name: "a-b", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Second})
	seen := map[string]string{}
	for _, r := range []*algo.Policy{a, ab} {
		for _, k := range []string{"b", "b:x", "-b", "x", ":x"} {
			key := r.StorageKey("p", algo.Tag(k))
			if prev, ok := seen[key]; ok {
				t.Errorf("%s/%q and %s share the key %q", r.Name(), k, prev, key)
			}
			seen[key] = r.Name() + "/" + k
		}
	}
}

func TestMemoryStaysBounded(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	m := algo.NewMemory(algo.MemoryOptions{MaxKeys: 64, Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	r := algotest.MustPolicy(t, algo.Spec{Name: "b", Algorithm: algo.TokenBucket, Limit: 5, Window: time.Minute})
	for i := 0; i < 10_000; i++ {
		algotest.DecideOne(t, m, algo.Request{Policy: r, Key: algo.Tag("k" + strconv.Itoa(i))})
	}
	if got := m.Len(); got > 64 {
		t.Errorf("Len = %d after 10000 keys, want at most MaxKeys 64", got)
	}
}

func TestMemorySweepRemovesExpiredState(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	m := algo.NewMemory(algo.MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	short := algotest.MustPolicy(t, algo.Spec{Name: "short", Algorithm: algo.FixedWindow, Limit: 5, Window: time.Second})
	long := algotest.MustPolicy(t, algo.Spec{Name: "long", Algorithm: algo.SlidingWindowLog, Limit: 5, Window: time.Hour})
	for _, k := range []string{"a", "b", "c"} {
		algotest.DecideOne(t, m, algo.Request{Policy: short, Key: []byte(k)})
		algotest.DecideOne(t, m, algo.Request{Policy: long, Key: []byte(k)})
	}
	if got := m.Len(); got != 6 {
		t.Fatalf("Len = %d, want 6", got)
	}
	clock.Advance(time.Second)
	m.Sweep()
	if got := m.Len(); got != 3 {
		t.Errorf("after one second Len = %d, want 3 (the hour-long log remains)", got)
	}
	clock.Advance(time.Hour)
	m.Sweep()
	if got := m.Len(); got != 0 {
		t.Errorf("after an hour Len = %d, want 0", got)
	}
}

func TestMemorySweeperRunsAndCloseIsIdempotent(t *testing.T) {
	clock := algotest.NewClock(algotest.Epoch)
	m := algo.NewMemory(algo.MemoryOptions{Clock: clock.Now, SweepInterval: time.Millisecond})
	r := algotest.MustPolicy(t, algo.Spec{Name: "s", Algorithm: algo.GCRA, Limit: 5, Window: time.Second})
	algotest.DecideOne(t, m, algo.Request{Policy: r, Key: []byte("k")})
	clock.Advance(time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for m.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the background sweeper did not remove expired state")
		}
		time.Sleep(time.Millisecond)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := m.Decide(context.Background(), []algo.Request{{Policy: r, Key: []byte("k")}}, make([]algo.Result, 1)); err != algo.ErrClosed {
		t.Errorf("Decide after Close = %v, want ErrClosed", err)
	}
	if err := m.Ping(context.Background()); err != algo.ErrClosed {
		t.Errorf("Ping after Close = %v, want ErrClosed", err)
	}
}
