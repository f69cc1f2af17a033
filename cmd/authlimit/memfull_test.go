package main

import (
	"strconv"
	"testing"
)

// TestFloodOfNewKeysKeepsAnExhaustedLimit: with a small embedded store and
// no deny cache, a client that exhausts /login and then floods another rule
// with fresh API keys does not get /login back: the full store refuses the
// new keys (rate-limited, counted) instead of evicting the login's state.
func TestFloodOfNewKeysKeepsAnExhaustedLimit(t *testing.T) {
	t.Parallel()
	app := startApp(t, map[string]string{
		"AUTHLIMIT_RULES":           "name=login path=/login limit=3/10m; name=api key=header:X-Api-Key limit=100/1h path=/api",
		"AUTHLIMIT_MEMORY_MAX_KEYS": "2000",
		"AUTHLIMIT_DENY_CACHE_SIZE": "0",
	})
	login := authFrom("203.0.113.7", "X-Forwarded-Uri", "/login")
	for i := range 3 {
		wantStatus(t, app.do(t, login), 200, "login "+strconv.Itoa(i+1))
	}
	wantStatus(t, app.do(t, login), 429, "the fourth login")
	refused := 0
	for i := range 6000 {
		r := app.do(t, authFrom("198.51.100.9", "X-Forwarded-Uri", "/api", "X-Api-Key", "key-"+strconv.Itoa(i)))
		if r.status == 429 {
			refused++
		}
	}
	wantStatus(t, app.do(t, login), 429, "login after a flood of 6,000 new API keys")
	if got := metric(t, app, `authlimit_memory_refused_total{store="primary"}`); got != float64(refused) || got == 0 {
		t.Errorf("authlimit_memory_refused_total = %v, want the %d refused requests", got, refused)
	}
	if got := metric(t, app, `authlimit_memory_keys{store="primary"}`); got != 2000 {
		t.Errorf("authlimit_memory_keys = %v, want the bound 2000", got)
	}
}
