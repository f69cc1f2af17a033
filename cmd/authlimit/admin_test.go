package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/rules"
)

// adminToken is the tests' admin token.
const adminToken = "test-admin-token-0123456789"

// adminStores runs f against the memory store, a real Redis and a real
// Redis Cluster, each with the admin API on.
func adminStores(t *testing.T, f func(t *testing.T, env map[string]string)) {
	admin := []string{"AUTHLIMIT_ADMIN_LISTEN", "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN", adminToken}
	stores(t, func(t *testing.T, env map[string]string) { f(t, with(env, admin...)) })
	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewCluster(t)
		f(t, with(map[string]string{
			"AUTHLIMIT_REDIS_URL":     "redis://" + c.Addrs[0],
			"AUTHLIMIT_REDIS_ADDRS":   strings.Join(c.Addrs[1:], ","),
			"AUTHLIMIT_REDIS_MODE":    "cluster",
			"AUTHLIMIT_KEY_PREFIX":    c.Prefix(t),
			"AUTHLIMIT_REDIS_TIMEOUT": "1s",
		}, admin...))
	})
}

// adminDo sends one admin request with token (none when empty) and the
// headers, and returns the status and body.
func (a *testApp) adminDo(t *testing.T, method, path, token string, headers ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+a.app.admin.listener.Addr().String()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type quotaAnswer struct {
	Client   string `json:"client"`
	Admitted bool   `json:"admitted"`
	Verdict  string `json:"verdict"`
	Rules    []struct {
		Rule      string `json:"rule"`
		Algorithm string `json:"algorithm"`
		Key       []struct {
			Part  string `json:"part"`
			Value string `json:"value"`
		} `json:"key"`
		Limit     int64    `json:"limit"`
		Remaining *int64   `json:"remaining"`
		Reset     *float64 `json:"reset"`
		Allowed   *bool    `json:"allowed"`
	} `json:"rules"`
}

func (a *testApp) quota(t *testing.T, ip string) quotaAnswer {
	t.Helper()
	status, body := a.adminDo(t, "GET", "/v1/quota", adminToken, "X-Forwarded-For", ip, "X-Forwarded-Uri", "/api")
	if status != 200 {
		t.Fatalf("GET /v1/quota: %d %s", status, body)
	}
	var q quotaAnswer
	if err := json.Unmarshal([]byte(body), &q); err != nil {
		t.Fatalf("GET /v1/quota %q: %v", body, err)
	}
	return q
}

// TestAdminQuotaAgreesWithAuth: for every algorithm, on every store, GET
// /v1/quota says what the next /auth decides, with the remaining count
// before it, and any number of GETs consume nothing.
func TestAdminQuotaAgreesWithAuth(t *testing.T) {
	t.Parallel()
	algorithms := []string{"fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "leaky_bucket", "gcra"}
	adminStores(t, func(t *testing.T, env map[string]string) {
		for _, alg := range algorithms {
			t.Run(alg, func(t *testing.T) {
				a := startApp(t, with(env, "AUTHLIMIT_RULES", fmt.Sprintf("name=r-%s limit=3/1h algorithm=%s", strings.ReplaceAll(alg, "_", "-"), alg)))
				const ip = "198.51.100.7"
				admitted := 0
				for i := 0; i < 5; i++ {
					q := a.quota(t, ip)
					if again := a.quota(t, ip); again.Admitted != q.Admitted || *again.Rules[0].Remaining != *q.Rules[0].Remaining {
						t.Fatalf("step %d: a second GET answers %+v, the first %+v: a GET consumed", i, again, q)
					}
					if len(q.Rules) != 1 || q.Rules[0].Algorithm != alg || q.Rules[0].Limit != 3 || q.Client != ip {
						t.Fatalf("step %d: quota %+v", i, q)
					}
					if k := q.Rules[0].Key; len(k) != 1 || k[0].Part != "ip" || k[0].Value != ip {
						t.Errorf("step %d: key parts %+v, want ip=%s", i, k, ip)
					}
					r := a.do(t, authFrom(ip, "X-Forwarded-Uri", "/api"))
					if got := r.status == 200; got != q.Admitted {
						t.Fatalf("step %d: quota says admitted=%v, /auth answered %d", i, q.Admitted, r.status)
					}
					if r.status == 200 {
						admitted++
						if got, want := r.header("X-RateLimit-Remaining"), strconv.FormatInt(*q.Rules[0].Remaining-1, 10); got != want {
							t.Errorf("step %d: /auth X-RateLimit-Remaining %s, quota said %d before it", i, got, *q.Rules[0].Remaining)
						}
					} else if *q.Rules[0].Allowed || *q.Rules[0].Remaining != 0 {
						t.Errorf("step %d: denied, but quota said %+v", i, q.Rules[0])
					}
				}
				if admitted != 3 {
					t.Errorf("%d admitted, want 3: the GETs consumed", admitted)
				}
			})
		}
	})
}

// TestAdminResetFreesOnlyThatClient: DELETE /v1/quota frees the client's
// quota, and no other client's.
func TestAdminResetFreesOnlyThatClient(t *testing.T) {
	t.Parallel()
	adminStores(t, func(t *testing.T, env map[string]string) {
		a := startApp(t, with(env, "AUTHLIMIT_RULES", "name=per-ip limit=2/1h algorithm=sliding_window_log; name=global limit=100/1h key=global"))
		for _, ip := range []string{"198.51.100.1", "198.51.100.2"} {
			for i := 0; i < 2; i++ {
				wantStatus(t, a.do(t, authFrom(ip)), 200, "within the limit")
			}
			wantStatus(t, a.do(t, authFrom(ip)), 429, "over the limit")
		}
		if status, body := a.adminDo(t, "DELETE", "/v1/quota?rule=nosuch", adminToken, "X-Forwarded-For", "198.51.100.1"); status != 404 || !strings.Contains(body, "nosuch") {
			t.Errorf("DELETE ?rule=nosuch: %d %s, want 404 naming the rule", status, body)
		}
		wantStatus(t, a.do(t, authFrom("198.51.100.1")), 429, "after a reset of no rule")
		status, body := a.adminDo(t, "DELETE", "/v1/quota?rule=per-ip", adminToken, "X-Forwarded-For", "198.51.100.1")
		if status != 200 || !strings.Contains(body, `"rule": "per-ip"`) || strings.Contains(body, `"rule": "global"`) {
			t.Fatalf("DELETE ?rule=per-ip: %d %s", status, body)
		}
		if !strings.Contains(a.logs.String(), "admin reset a client's quota") || !strings.Contains(a.logs.String(), "198.51.100.1") {
			t.Errorf("the reset is not logged with its client:\n%s", a.logs.String())
		}
		// Both clients were admitted twice: the global rule counts 4.
		if q := a.quota(t, "198.51.100.1"); !q.Admitted || len(q.Rules) != 2 || *q.Rules[0].Remaining != 2 || *q.Rules[1].Remaining != 100-4 {
			b, _ := json.Marshal(q)
			t.Errorf("quota after the reset: %s", b)
		}
		for i := 0; i < 2; i++ {
			wantStatus(t, a.do(t, authFrom("198.51.100.1")), 200, "after the reset")
		}
		wantStatus(t, a.do(t, authFrom("198.51.100.1")), 429, "the reset client over the limit again")
		wantStatus(t, a.do(t, authFrom("198.51.100.2")), 429, "the other client, not reset")
	})
}

// TestAdminNeedsTheToken: without the token, or with a wrong one, every
// endpoint answers 401 and changes nothing.
func TestAdminNeedsTheToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules")
	if err := os.WriteFile(file, []byte("name=r limit=1/1h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startApp(t, map[string]string{"AUTHLIMIT_RULES_FILE": file, "AUTHLIMIT_ADMIN_LISTEN": "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN": adminToken})
	wantStatus(t, a.do(t, authFrom("198.51.100.1")), 200, "first")
	wantStatus(t, a.do(t, authFrom("198.51.100.1")), 429, "second")
	if err := os.WriteFile(file, []byte("name=r limit=5/1h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := configHash(t, a)
	for _, token := range []string{"", "wrong", adminToken + "x", adminToken[:len(adminToken)-1], strings.ToUpper(adminToken)} {
		for _, ep := range [][2]string{{"GET", "/v1/quota"}, {"DELETE", "/v1/quota"}, {"GET", "/v1/config"}, {"POST", "/v1/reload"}, {"GET", "/nosuch"}} {
			status, body := a.adminDo(t, ep[0], ep[1], token, "X-Forwarded-For", "198.51.100.1")
			if status != 401 || strings.Contains(body, "198.51.100.1") || strings.Contains(body, "rules") {
				t.Errorf("%s %s with token %q: %d %s, want 401 and nothing else", ep[0], ep[1], token, status, body)
			}
		}
	}
	wantStatus(t, a.do(t, authFrom("198.51.100.1")), 429, "after the refused reset")
	if after := configHash(t, a); after != before {
		t.Errorf("the rules hash went from %s to %s after refused reloads", before, after)
	}
}

// configHash returns the rules hash GET /v1/config reports.
func configHash(t *testing.T, a *testApp) string {
	t.Helper()
	rulesHash, _, _ := a.app.reload.state()
	return rulesHash
}

// TestAdminConfigAndReload: GET /v1/config shows the configuration in
// force, credentials hidden, with its hash; POST /v1/reload reloads it and
// says what happened, a bad file with every mistake.
func TestAdminConfigAndReload(t *testing.T) {
	srv := ownRedis(t)
	user := redistest.NewACLUser(t, srv, "adm")
	dir := t.TempDir()
	file := filepath.Join(dir, "rules")
	if err := os.WriteFile(file, []byte("name=r limit=1/1h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startApp(t, map[string]string{"AUTHLIMIT_RULES_FILE": file, "AUTHLIMIT_ADMIN_LISTEN": "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN": adminToken,
		"AUTHLIMIT_REDIS_URL": user.URL, "AUTHLIMIT_KEY_PREFIX": "adm"})
	var cfg struct {
		Config   string            `json:"config"`
		Hashes   map[string]string `json:"hashes"`
		LoadedAt time.Time         `json:"loaded_at"`
	}
	get := func() {
		t.Helper()
		status, body := a.adminDo(t, "GET", "/v1/config", adminToken)
		if status != 200 {
			t.Fatalf("GET /v1/config: %d %s", status, body)
		}
		if err := json.Unmarshal([]byte(body), &cfg); err != nil {
			t.Fatal(err)
		}
		for _, secret := range []string{user.Password, adminToken} {
			if strings.Contains(body, secret) {
				t.Errorf("GET /v1/config shows a credential:\n%s", body)
			}
		}
	}
	get()
	first := cfg.Hashes["rules"]
	if first == "" || !strings.Contains(cfg.Config, "limit=1/1h") || cfg.LoadedAt.IsZero() {
		t.Fatalf("GET /v1/config: %+v", cfg)
	}
	if err := os.WriteFile(file, []byte("name=r limit=7/1h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	status, body := a.adminDo(t, "POST", "/v1/reload", adminToken)
	if status != 200 || !strings.Contains(body, `"result": "success"`) {
		t.Fatalf("POST /v1/reload: %d %s", status, body)
	}
	get()
	if cfg.Hashes["rules"] == first || !strings.Contains(cfg.Config, "limit=7/1h") {
		t.Errorf("after the reload GET /v1/config says %+v", cfg)
	}
	if err := os.WriteFile(file, []byte("name=r limit=8/1h bogus=1\nname=s limit=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	status, body = a.adminDo(t, "POST", "/v1/reload", adminToken)
	if status != 422 || strings.Count(body, "AUTHLIMIT_RULES_FILE") < 2 {
		t.Errorf("POST /v1/reload of a bad file: %d %s, want 422 with every mistake", status, body)
	}
	get()
	if !strings.Contains(cfg.Config, "limit=7/1h") {
		t.Errorf("a bad reload changed the rules in force:\n%s", cfg.Config)
	}
	for _, m := range [][2]string{{"PUT", "/v1/quota"}, {"GET", "/v1/reload"}, {"DELETE", "/v1/config"}} {
		if status, _ := a.adminDo(t, m[0], m[1], adminToken); status != 405 {
			t.Errorf("%s %s: %d, want 405", m[0], m[1], status)
		}
	}
}

// TestAdminListenNeedsAToken: the admin API without a token stops
// authlimit at start, naming the variable.
func TestAdminListenNeedsAToken(t *testing.T) {
	for _, env := range []map[string]string{
		{"AUTHLIMIT_ADMIN_LISTEN": "127.0.0.1:0"},
		{"AUTHLIMIT_ADMIN_LISTEN": "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN": "short"},
	} {
		var environ []string
		for k, v := range env {
			environ = append(environ, k+"="+v)
		}
		err := run(t.Context(), nil, environ, io.Discard, io.Discard)
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), "AUTHLIMIT_ADMIN_TOKEN") {
			t.Errorf("run with %v: %v, want a usage error naming AUTHLIMIT_ADMIN_TOKEN", env, err)
		}
	}
	if _, err := loadConfig(map[string]string{"AUTHLIMIT_ADMIN_LISTEN": "nonsense", "AUTHLIMIT_ADMIN_TOKEN": adminToken}); err == nil || !strings.Contains(err.Error(), "AUTHLIMIT_ADMIN_LISTEN") {
		t.Errorf("a bad AUTHLIMIT_ADMIN_LISTEN: %v", err)
	}
	s, err := loadConfig(map[string]string{"AUTHLIMIT_ADMIN_TOKEN": adminToken})
	if err != nil || len(s.warnings) != 1 || !strings.Contains(s.warnings[0], "AUTHLIMIT_ADMIN_LISTEN") {
		t.Errorf("a token without AUTHLIMIT_ADMIN_LISTEN: %v, warnings %q", err, s.warnings)
	}
	if out := s.describe(); strings.Contains(out, adminToken) {
		t.Errorf("-check shows the admin token:\n%s", out)
	}
}

// TestAdminQuotaReadsTheSubrequest: GET /v1/quota reads the method, URI,
// key and cost headers as /auth does, and answers each verdict /auth
// would: a rule keyed by a header with its value, unmatched without the
// method, invalid without a key header the rule needs, blocked and
// allowlisted clients.
func TestAdminQuotaReadsTheSubrequest(t *testing.T) {
	a := startApp(t, map[string]string{
		"AUTHLIMIT_RULES":        "name=login method=POST path=/login key=header:X-Api-Key+ip on_missing=deny limit=5/1h cost=header:X-Cost",
		"AUTHLIMIT_BLOCK_CIDRS":  "192.0.2.0/24",
		"AUTHLIMIT_ALLOW_CIDRS":  "198.18.0.0/15",
		"AUTHLIMIT_ADMIN_LISTEN": "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN": adminToken,
	})
	get := func(headers ...string) map[string]any {
		t.Helper()
		status, body := a.adminDo(t, "GET", "/v1/quota", adminToken, headers...)
		if status != 200 {
			t.Fatalf("GET /v1/quota %v: %d %s", headers, status, body)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	login := []string{"X-Forwarded-For", "203.0.113.5", "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login?next=/", "X-Api-Key", "k-1", "X-Cost", "2"}
	q := get(login...)
	rules, _ := q["rules"].([]any)
	if q["verdict"] != "allow" || len(rules) != 1 {
		t.Fatalf("login: %v", q)
	}
	r := rules[0].(map[string]any)
	key, _ := json.Marshal(r["key"])
	if string(key) != `[{"part":"header:X-Api-Key","value":"k-1"},{"part":"ip","value":"203.0.113.5"}]` || r["cost"] != 2.0 || r["remaining"] != 5.0 {
		t.Errorf("login rule: %v (key %s)", r, key)
	}
	// /auth agrees, and spends the cost of 2.
	res := a.do(t, request{headers: [][2]string{{"X-Forwarded-For", "203.0.113.5"}, {"X-Forwarded-Method", "POST"}, {"X-Forwarded-Uri", "/login?next=/"}, {"X-Api-Key", "k-1"}, {"X-Cost", "2"}}})
	wantStatus(t, res, 200, "/auth of the login")
	if r := get(login...)["rules"].([]any)[0].(map[string]any); r["remaining"] != 3.0 {
		t.Errorf("after /auth spent 2, quota says %v remaining", r["remaining"])
	}
	for _, tt := range []struct {
		name    string
		headers []string
		verdict string
		kind    string
	}{
		{"no method header: GET", []string{"X-Forwarded-For", "203.0.113.5", "X-Forwarded-Uri", "/login", "X-Api-Key", "k-1"}, "unmatched", ""},
		{"no key header", []string{"X-Forwarded-For", "203.0.113.5", "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login"}, "invalid", "missing-key"},
		{"blocked", []string{"X-Forwarded-For", "192.0.2.7", "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login", "X-Api-Key", "k-1"}, "blocked", "blocked"},
		{"allowlisted", []string{"X-Forwarded-For", "198.18.0.1", "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login", "X-Api-Key", "k-1"}, "allowlisted", ""},
	} {
		q := get(tt.headers...)
		admitted := tt.verdict == "unmatched" || tt.verdict == "allowlisted"
		if q["verdict"] != tt.verdict || q["admitted"] != admitted || q["kind"] != nil && q["kind"] != tt.kind || tt.kind != "" && q["kind"] != tt.kind {
			t.Errorf("%s: %v, want verdict %s kind %q admitted %v", tt.name, q, tt.verdict, tt.kind, admitted)
		}
	}
}

// TestAdminQuotaOfATier: the tier header sent to /v1/quota is believed, as
// the proxy's is: the answer names the tier's policy and limit, and a
// reset frees the tier's count.
func TestAdminQuotaOfATier(t *testing.T) {
	a := startApp(t, map[string]string{
		"AUTHLIMIT_RULES":           "name=api key=header:X-Api-Key limit=2/1h tier=header:X-Plan\ntier rule=api name=pro limit=4/1h",
		"AUTHLIMIT_TRUSTED_PROXIES": "127.0.0.1/32",
		"AUTHLIMIT_ADMIN_LISTEN":    "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN": adminToken,
	})
	pro := request{headers: [][2]string{{"X-Forwarded-For", "203.0.113.5"}, {"X-Api-Key", "k-1"}, {"X-Plan", "pro"}}}
	for i := 0; i < 4; i++ {
		wantStatus(t, a.do(t, pro), 200, "within the pro tier")
	}
	wantStatus(t, a.do(t, pro), 429, "over the pro tier")
	headers := []string{"X-Forwarded-For", "203.0.113.5", "X-Api-Key", "k-1", "X-Plan", "pro"}
	status, body := a.adminDo(t, "GET", "/v1/quota", adminToken, headers...)
	if status != 200 || !strings.Contains(body, `"policy": "api--pro"`) || !strings.Contains(body, `"limit": 4`) || !strings.Contains(body, `"admitted": false`) {
		t.Fatalf("GET /v1/quota of the pro tier: %d %s", status, body)
	}
	if status, body := a.adminDo(t, "DELETE", "/v1/quota", adminToken, headers...); status != 200 || !strings.Contains(body, "api--pro") {
		t.Fatalf("DELETE /v1/quota of the pro tier: %d %s", status, body)
	}
	wantStatus(t, a.do(t, pro), 200, "after the reset")
}

// TestOverrideKeysStayHidden: an override's key (possibly a credential)
// is shown as a short hash of it, never whole: by -check, by GET
// /v1/config, in the logs of a start and of reloads, accepted or refused,
// and in the metrics.
func TestOverrideKeysStayHidden(t *testing.T) {
	const secret, next = "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_9zYxWvUtSrQpOnMl8kJiHgFe"
	src := func(key string) string {
		return "name=api key=header:X-Api-Key limit=10/1m\noverride rule=api key=" + key + " limit=100/1m\n"
	}
	hidden := func(what, said string, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if strings.Contains(said, k) {
				t.Errorf("%s shows the override key %s:\n%s", what, k, said)
			}
		}
	}
	said, err := checkEnv(t, map[string]string{"AUTHLIMIT_RULES": src(secret)})
	if err != nil {
		t.Fatalf("-check: %v\n%s", err, said)
	}
	hidden("-check", said, secret)
	if !strings.Contains(said, "key="+rules.KeyHash(secret)) {
		t.Errorf("-check does not show the key's hash %s:\n%s", rules.KeyHash(secret), said)
	}

	file := filepath.Join(t.TempDir(), "rules")
	if err := os.WriteFile(file, []byte(src(secret)), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startApp(t, map[string]string{"AUTHLIMIT_RULES_FILE": file, "AUTHLIMIT_ADMIN_LISTEN": "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN": adminToken, "AUTHLIMIT_LOG_LEVEL": "debug"})
	a.do(t, authFrom("203.0.113.1", "X-Api-Key", secret))
	status, body := a.adminDo(t, "GET", "/v1/config", adminToken)
	if status != 200 || !strings.Contains(body, rules.KeyHash(secret)) {
		t.Fatalf("GET /v1/config: %d %s, want the key's hash", status, body)
	}
	hidden("GET /v1/config", body, secret)

	// A reload that changes the key, then one refused.
	if err := os.WriteFile(file, []byte(src(next)), 0o644); err != nil {
		t.Fatal(err)
	}
	if status, body := a.adminDo(t, "POST", "/v1/reload", adminToken); status != 200 {
		t.Fatalf("POST /v1/reload: %d %s", status, body)
	}
	if err := os.WriteFile(file, []byte(src(secret)+"override rule=api key="+secret+" limit=1/1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if status, body := a.adminDo(t, "POST", "/v1/reload", adminToken); status != 422 {
		t.Fatalf("POST /v1/reload of a key twice: %d %s, want 422", status, body)
	} else {
		hidden("a refused reload's answer", body, secret, next)
	}
	hidden("the logs", a.logs.String(), secret, next)
	hidden("the metrics", a.do(t, request{path: "/metrics"}).body, secret, next)
}

// TestAdminUnderBudget: the header block a connection to the admin API
// has not finished counts in AUTHLIMIT_MAX_BUFFERED_BYTES, as the
// decision listener's do, and is given back once it closes.
func TestAdminUnderBudget(t *testing.T) {
	a := startApp(t, map[string]string{"AUTHLIMIT_ADMIN_LISTEN": "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN": adminToken})
	c, err := net.Dial("tcp", a.app.admin.listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /v1/config HTTP/1.1\r\nHost: admin\r\nX-Held: "+strings.Repeat("h", 3000)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unfinished admin request counted", func() bool {
		return a.app.budget.Used() > 0
	})
	_ = c.Close()
	waitFor(t, "the closed admin connection given back", func() bool {
		return a.app.budget.Used() == 0
	})
}
