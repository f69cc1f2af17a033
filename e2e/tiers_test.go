//go:build e2e

package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
)

// tiersRules are docs/rules.md's rules for the API-key case, as nginx/tiers.conf
// names them too.
const tiersRules = `name=api key=header:X-Api-Key limit=2/1m tier=header:X-Plan
tier rule=api name=pro limit=4/1m
override rule=api key=k-bigcorp-5d1e limit=6/1m
`

// TestAPIKeyTiersBehindNginx is docs/rules.md's "API-key case end to end behind
// nginx": nginx/tiers.conf maps each API key to its plan and sends it in
// X-Plan; authlimit, with those rules in AUTHLIMIT_RULES_FILE, limits a
// key by its plan, a key with an override by that, and the rest by the
// rule's own limit. A client's own X-Plan (either spelling) changes
// nothing, nor does one sent to authlimit directly; the headers give the
// limit that applied; an edit of the file changes an override within 2 s.
func TestAPIKeyTiersBehindNginx(t *testing.T) {
	if err := bins.missing["nginx"]; err != nil {
		t.Fatalf("nginx is not available: %v", err)
	}
	readme := string(readRepo(t, "docs/rules.md"))
	conf := string(readRepo(t, "nginx/tiers.conf"))
	for _, line := range strings.Split(strings.TrimSpace(tiersRules), "\n") {
		if !strings.Contains(readme, line) {
			t.Errorf("docs/rules.md does not show the rule line %q", line)
		}
		if !strings.Contains(conf, "#   "+line) {
			t.Errorf("nginx/tiers.conf does not show the rule line %q", line)
		}
	}

	redis, err := redistest.Start(t, bins.redis)
	if err != nil {
		t.Fatal(err)
	}
	be := startBackend(t)
	rulesFile := filepath.Join(t.TempDir(), "rules")
	writeFile(t, rulesFile, tiersRules)
	a := startAuthlimit(t, "authlimit", map[string]string{
		"AUTHLIMIT_REDIS_URL":       redis.URL,
		"AUTHLIMIT_RULES_FILE":      rulesFile,
		"AUTHLIMIT_TRUSTED_PROXIES": "127.0.0.1/32", // nginx; clients come from other loopback addresses
		"AUTHLIMIT_DENY_STATUS":     "403",
		"AUTHLIMIT_REDIS_TIMEOUT":   "500ms",
	})
	dir := t.TempDir()
	addr := freeAddr(t)
	site := render(t, "nginx/tiers.conf",
		"server authlimit:8080;", "server "+a.addr+";",
		"server backend:80;", "server "+be.addr+";",
		"listen 8000;", "listen "+addr+";")
	runNginx(t, "nginx", dir, addr, site, false)

	c := newClient("127.0.0.41")
	admitted := checkTiers(t, be, tierCases(), func(path, key string, headers ...string) result {
		return c.do(t, "GET", "http://"+addr+path, nil, append([]string{"X-Api-Key", key}, headers...)...)
	})

	// A client that reaches authlimit itself is no trusted proxy: its
	// X-Plan is ignored.
	direct := c.do(t, "GET", "http://"+a.addr+"/auth", nil, "X-Api-Key", "k-anyone-4", "X-Plan", "pro")
	if got := direct.header.Get("RateLimit-Policy"); direct.status != 200 || got != tierOwn {
		t.Errorf("straight to authlimit with X-Plan: pro: %d %q, want 200 %q", direct.status, got, tierOwn)
	}

	// The contract grows: the file's edit applies within 2 s, and the
	// key keeps its count (6 spent of a new 9 leave 3).
	writeFile(t, rulesFile, strings.Replace(tiersRules, "key=k-bigcorp-5d1e limit=6/1m", "key=k-bigcorp-5d1e limit=9/1m", 1))
	deadline := time.Now().Add(2 * time.Second)
	for {
		r := c.do(t, "GET", "http://"+addr+"/g", nil, "X-Api-Key", "k-bigcorp-5d1e")
		if r.status == 200 {
			if got := r.header.Get("RateLimit-Policy"); got != `"api";q=9;w=60` {
				t.Errorf("after the edit: RateLimit-Policy %q", got)
			}
			if got := r.header.Get("X-RateLimit-Remaining"); got != "2" {
				t.Errorf("after the edit: %s remaining, want 2 (6 spent of 9, and this one)", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the override's new limit did not apply within 2 s: %d %s", r.status, firstLine(r.body))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := admitted("/h", "k-bigcorp-5d1e", `"api";q=9;w=60`); got != 2 {
		t.Errorf("after the edit: %d more admitted, want 2", got)
	}
}

// The API-key case's clients, behind a proxy that sets X-Plan from each
// key's plan and drops the client's own.
const tierOwn, tierPro, tierBigcorp = `"api";q=2;w=60`, `"api";q=4;w=60`, `"api";q=6;w=60`

// tierCase is one client of the API-key case: its key, what it adds, and
// how many of its requests are admitted, under which RateLimit-Policy.
type tierCase struct {
	name    string
	path    string
	key     string
	headers []string
	policy  string
	want    int
}

func tierCases() []tierCase {
	return []tierCase{
		{"a key without a plan", "/a", "k-anyone-1", nil, tierOwn, 2},
		{"a pro key", "/b", "k-pro-93b1", nil, tierPro, 4},
		{"a key with a contract", "/c", "k-bigcorp-5d1e", nil, tierBigcorp, 6},
		{"a client naming its own plan", "/d", "k-anyone-2", []string{"X-Plan", "pro"}, tierOwn, 2},
		{"a client naming its own plan with _", "/e", "k-anyone-3", []string{"X_Plan", "pro"}, tierOwn, 2},
		{"a pro key naming a plan of its own", "/f", "k-pro-c07d", []string{"X-Plan", "free"}, tierPro, 4},
	}
}

// checkTiers sends each case's requests with send until the first 429,
// and checks how many were admitted, that each reached the backend be,
// and each answer's RateLimit-Policy. It returns the count of one more
// key's admitted requests, for the test to go on with.
func checkTiers(t *testing.T, be *backend, cases []tierCase, send func(path, key string, headers ...string) result) func(path, key, policy string, headers ...string) int {
	t.Helper()
	admitted := func(path, key, policy string, headers ...string) int {
		t.Helper()
		before := be.count(path)
		for i := 0; i < 10; i++ {
			r := send(path, key, headers...)
			if got := r.header.Get("RateLimit-Policy"); got != policy {
				t.Errorf("%s %s: RateLimit-Policy %q, want %q", key, headers, got, policy)
			}
			if r.status == 429 {
				if got := be.count(path) - before; got != i {
					t.Errorf("%s: the backend saw %d requests, %d were admitted", key, got, i)
				}
				return i
			}
			if r.status != 200 {
				t.Fatalf("%s %s: %d %s", key, headers, r.status, firstLine(r.body))
			}
		}
		return 10
	}
	for _, tt := range cases {
		if got := admitted(tt.path, tt.key, tt.policy, tt.headers...); got != tt.want {
			t.Errorf("%s: %d admitted, want %d", tt.name, got, tt.want)
		}
	}
	return admitted
}

// TestAPIKeyTiersBehindHAProxySPOE: README's API-key case behind
// haproxy/haproxy.cfg with its #tiers lines: HAProxy maps each API key to
// its plan (haproxy/plans.map) and sends it in X-Plan; authlimit limits a
// key by its plan, a key with an override by that, and the rest by the
// rule's own limit. A client's own X-Plan, in either spelling or both,
// changes nothing: HAProxy drops it.
func TestAPIKeyTiersBehindHAProxySPOE(t *testing.T) {
	px := proxyNamed(t, "haproxy-spoe")
	conf := string(readRepo(t, "haproxy/haproxy.cfg"))
	if !strings.Contains(conf, "#tiers ") {
		t.Fatal("haproxy/haproxy.cfg has no #tiers lines")
	}
	redis, err := redistest.Start(t, bins.redis)
	if err != nil {
		t.Fatal(err)
	}
	be := startBackend(t)
	rulesFile := filepath.Join(t.TempDir(), "rules")
	writeFile(t, rulesFile, tiersRules)
	a := startAuthlimit(t, "authlimit", map[string]string{
		"AUTHLIMIT_REDIS_URL":       redis.URL,
		"AUTHLIMIT_RULES_FILE":      rulesFile,
		"AUTHLIMIT_TRUSTED_PROXIES": "127.0.0.1/32",
		"AUTHLIMIT_REDIS_TIMEOUT":   "500ms",
		"AUTHLIMIT_SPOA_LISTEN":     freeAddr(t),
	})
	addr := px.start(t, a.spoa, be.addr, "tiers")
	cases := append(tierCases(), tierCase{"a client naming its plan twice", "/g", "k-anyone-4", []string{"X-Plan", "pro", "x_plan", "pro"}, tierOwn, 2})
	checkTiers(t, be, cases, func(path, key string, headers ...string) result {
		return rawDo(t, "127.0.0.42", addr, rawRequest("GET "+path+" HTTP/1.1", "", append([]string{"Host", "localhost", "X-Api-Key", key}, headers...)...))
	})
}
