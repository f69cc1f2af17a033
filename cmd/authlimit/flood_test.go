package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/internal/redistest"
)

// floodKeys is how many fresh X-Api-Key values the flood sends.
const floodKeys = 20000

// TestHeavyHeaderKeyFloodRedisMemory measures what a rule keyed only by a
// header costs Redis when one client sends a fresh value with every
// request: a key per value, kept for the window, however many the client
// invents (README's rule guidance). Paired with a per-IP rule, the flood
// creates no more header keys than the per-IP limit admits: a request the
// per-IP rule denies writes nothing. 40,000 requests, one after another:
// make test runs it without the race detector.
func TestHeavyHeaderKeyFloodRedisMemory(t *testing.T) {
	race.Heavy(t)
	t.Parallel()
	flood := func(t *testing.T, rules string) (keys int64, perKey float64) {
		t.Helper()
		srv := ownRedis(t)
		rc := srv.Client(t)
		ctx := context.Background()
		before := usedMemory(t, srv)
		app := startApp(t, redisEnv(srv, "flood", "AUTHLIMIT_RULES", rules, "AUTHLIMIT_REDIS_TIMEOUT", "1s"))
		for i := 0; i < floodKeys; i++ {
			r := app.do(t, authFrom("203.0.113.7", "X-Api-Key", fmt.Sprintf("k%08d", i)))
			if r.status != 200 && r.status != 429 {
				t.Fatalf("request %d: %d %s", i, r.status, r.body)
			}
		}
		n, err := rc.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		// The top limited clients' summaries (two keys a window, see
		// denials/redisshare) are not the flood's.
		top, err := rc.Keys(ctx, "*{top:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		n -= int64(len(top))
		after := usedMemory(t, srv)
		return n, float64(after-before) / float64(max(n, 1))
	}

	t.Run("header only", func(t *testing.T) {
		t.Parallel() // a Redis server each
		keys, perKey := flood(t, "name=per-key key=header:X-Api-Key limit=100/1h")
		t.Logf("%d fresh X-Api-Key values: %d Redis keys, %.0f bytes each (used_memory)", floodKeys, keys, perKey)
		if keys != floodKeys {
			t.Errorf("%d Redis keys after %d fresh values, want one each", keys, floodKeys)
		}
		if perKey < 16 || perKey > 2048 {
			t.Errorf("%.0f bytes per key: not a plausible measure", perKey)
		}
	})
	t.Run("paired with a per-IP rule", func(t *testing.T) {
		t.Parallel() // a Redis server each
		keys, _ := flood(t, "name=per-ip key=ip limit=100/1h; name=per-key key=header:X-Api-Key limit=100/1h")
		t.Logf("%d fresh X-Api-Key values from one client under a per-IP limit of 100: %d Redis keys", floodKeys, keys)
		if keys > 101 {
			t.Errorf("%d Redis keys, want at most 101 (the client's per-IP key and one per admitted request)", keys)
		}
	})
}

// usedMemory returns Redis's used_memory.
func usedMemory(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	info, err := srv.Client(t).Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("used_memory %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("INFO memory has no used_memory:\n%s", info)
	return 0
}
