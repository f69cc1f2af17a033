package algo

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestTagsAreSafeStorageKeys(t *testing.T) {
	r := mustPolicy(t, Spec{Name: "per-ip", Algorithm: GCRA, Limit: 10, Window: time.Second})
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
		tag := Tag(tc.key)
		if !validTag(tag) {
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
		if len(body) != hashedTagLen || body[0] != '#' {
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
	hashed := string(Tag(long))
	if string(Tag(hashed)) == hashed {
		t.Errorf("Tag(%q) kept a hash-shaped key as is: it could collide", hashed)
	}
	// The stores refuse keys that are not tags.
	for _, bad := range []string{"", "{x}", "with space", "#zz", strings.Repeat("k", 65)} {
		if validTag([]byte(bad)) {
			t.Errorf("validTag(%.40q) = true", bad)
		}
	}
}

func TestKeysOfPoliciesNeverCollide(t *testing.T) {
	a := mustPolicy(t, Spec{Name: "a", Algorithm: FixedWindow, Limit: 1, Window: time.Second})
	ab := mustPolicy(t, Spec{Name: "a-b", Algorithm: FixedWindow, Limit: 1, Window: time.Second})
	seen := map[string]string{}
	for _, r := range []*Policy{a, ab} {
		for _, k := range []string{"b", "b:x", "-b", "x", ":x"} {
			key := r.StorageKey("p", Tag(k))
			if prev, ok := seen[key]; ok {
				t.Errorf("%s/%q and %s share the key %q", r.Name(), k, prev, key)
			}
			seen[key] = r.Name() + "/" + k
		}
	}
}

// TestHostileKeysAreIsolated: keys built to collide, inject hash tags or
// look like hashes keep separate state in both stores.
func TestHostileKeysAreIsolated(t *testing.T) {
	clock := newFakeClock(epoch)
	long := strings.Repeat("y", 5000)
	keys := []string{"victim", "{victim}", "victim}", "#victim", string(Tag(long)), long, long + "z", ""}
	for _, st := range bothStores(t, clock) {
		r := mustPolicy(t, Spec{Name: "iso", Algorithm: FixedWindow, Limit: 1, Window: time.Minute})
		for _, k := range keys {
			if got := decideOne(t, st.store, Request{Policy: r, Key: Tag(k)}); !got.Allowed {
				t.Errorf("%s: first request for %.20q denied: its state is shared with another key", st.name, k)
			}
		}
		for _, k := range keys {
			if got := decideOne(t, st.store, Request{Policy: r, Key: Tag(k)}); got.Allowed {
				t.Errorf("%s: second request for %.20q allowed: limit 1 not kept", st.name, k)
			}
		}
	}
}

func TestMemoryStaysBounded(t *testing.T) {
	clock := newFakeClock(epoch)
	m := NewMemory(MemoryOptions{MaxKeys: 64, Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	r := mustPolicy(t, Spec{Name: "b", Algorithm: TokenBucket, Limit: 5, Window: time.Minute})
	for i := 0; i < 10_000; i++ {
		decideOne(t, m, Request{Policy: r, Key: Tag("k" + strconv.Itoa(i))})
	}
	if got := m.Len(); got > 64 {
		t.Errorf("Len = %d after 10000 keys, want at most MaxKeys 64", got)
	}
}

func TestMemorySweepRemovesExpiredState(t *testing.T) {
	clock := newFakeClock(epoch)
	m := NewMemory(MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	short := mustPolicy(t, Spec{Name: "short", Algorithm: FixedWindow, Limit: 5, Window: time.Second})
	long := mustPolicy(t, Spec{Name: "long", Algorithm: SlidingWindowLog, Limit: 5, Window: time.Hour})
	for _, k := range []string{"a", "b", "c"} {
		decideOne(t, m, Request{Policy: short, Key: []byte(k)})
		decideOne(t, m, Request{Policy: long, Key: []byte(k)})
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
	clock := newFakeClock(epoch)
	m := NewMemory(MemoryOptions{Clock: clock.Now, SweepInterval: time.Millisecond})
	r := mustPolicy(t, Spec{Name: "s", Algorithm: GCRA, Limit: 5, Window: time.Second})
	decideOne(t, m, Request{Policy: r, Key: []byte("k")})
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
	if _, err := m.Decide(context.Background(), []Request{{Policy: r, Key: []byte("k")}}, make([]Result, 1)); err != ErrClosed {
		t.Errorf("Decide after Close = %v, want ErrClosed", err)
	}
	if err := m.Ping(context.Background()); err != ErrClosed {
		t.Errorf("Ping after Close = %v, want ErrClosed", err)
	}
}

func TestDecideHonoursContext(t *testing.T) {
	clock := newFakeClock(epoch)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, st := range bothStores(t, clock) {
		r := mustPolicy(t, Spec{Name: "c", Algorithm: GCRA, Limit: 5, Window: time.Second})
		if _, err := st.store.Decide(ctx, []Request{{Policy: r, Key: []byte("k")}}, make([]Result, 1)); err == nil {
			t.Errorf("%s: Decide with a cancelled context succeeded", st.name)
		}
	}
}
