package admin

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/decide"
)

// clientAdmin is testAdmin whose configuration is fixed and whose reloads
// answer *reloads, counted in *calls.
func clientAdmin(t *testing.T, src string, reloads *[]ReloadResult, calls *int) (*Handler, func(ip string) decide.Verdict) {
	t.Helper()
	return testAdmin(t, src, func(o *Options) {
		o.Config = func() Config { return Config{Text: "rules: name=r", Hashes: map[string]string{"rules": "feed"}} }
		o.Reload = func() []ReloadResult { *calls++; return *reloads }
	})
}

// as sends one request for a client with the token to h.
func as(h *Handler, method, uri, client string) (int, string) {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(uri)
	ctx.Request.Header.Set("Authorization", "Bearer "+testToken)
	ctx.Request.Header.Set("X-Forwarded-For", client)
	h.Serve(&ctx)
	return ctx.Response.StatusCode(), string(ctx.Response.Body())
}

// TestTokenRequired: without the token, with another, or with the token
// not as a bearer token, every endpoint answers 401 with its challenge
// and does nothing (a reload is not run).
func TestTokenRequired(t *testing.T) {
	var res []ReloadResult
	calls := 0
	h, _ := clientAdmin(t, "name=r limit=1/1h", &res, &calls)
	for _, auth := range []string{"", "Bearer wrong", "Bearer " + testToken + "x", testToken, "bearer " + testToken, "Basic " + testToken} {
		for _, req := range [][2]string{{"POST", "/v1/reload"}, {"GET", "/v1/config"}, {"GET", "/v1/quota"}, {"DELETE", "/v1/quota"}, {"GET", "/v1/top"}, {"GET", "/nowhere"}} {
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod(req[0])
			ctx.Request.SetRequestURI(req[1])
			if auth != "" {
				ctx.Request.Header.Set("Authorization", auth)
			}
			h.Serve(&ctx)
			if ctx.Response.StatusCode() != 401 || !strings.HasPrefix(string(ctx.Response.Header.Peek("WWW-Authenticate")), "Bearer ") {
				t.Errorf("%s %s with Authorization %q: %d %s, want 401 with a Bearer challenge", req[0], req[1], auth, ctx.Response.StatusCode(), ctx.Response.Body())
			}
		}
	}
	if calls != 0 {
		t.Errorf("reload ran %d times without the token", calls)
	}
}

// TestMethodsAndPaths: each endpoint answers its methods only (405 naming
// them in Allow), and a path it does not serve is 404.
func TestMethodsAndPaths(t *testing.T) {
	var res []ReloadResult
	calls := 0
	h, _ := clientAdmin(t, "name=r limit=1/1h", &res, &calls)
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/v1/reload", "POST"},
		{"POST", "/v1/config", "GET"},
		{"PUT", "/v1/quota", "GET, DELETE"},
		{"DELETE", "/v1/top", "GET"},
		{"POST", "/v1/status", "GET"},
	} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(tc.method)
		ctx.Request.SetRequestURI(tc.path)
		ctx.Request.Header.Set("Authorization", "Bearer "+testToken)
		h.Serve(&ctx)
		if ctx.Response.StatusCode() != 405 || string(ctx.Response.Header.Peek("Allow")) != tc.allow {
			t.Errorf("%s %s: %d, Allow %q; want 405, Allow %q", tc.method, tc.path, ctx.Response.StatusCode(), ctx.Response.Header.Peek("Allow"), tc.allow)
		}
	}
	if status, _ := as(h, "GET", "/v1/nothing", "203.0.113.1"); status != 404 {
		t.Errorf("GET /v1/nothing: %d, want 404", status)
	}
	if calls != 0 {
		t.Errorf("reload ran %d times on a GET", calls)
	}
}

// TestConfigAndReload: GET /v1/config is the configuration Config gives;
// POST /v1/reload runs Reload once and answers its results, 200 when every
// configuration was reloaded or unchanged and 422 when one was refused.
func TestConfigAndReload(t *testing.T) {
	res := []ReloadResult{{Config: "rules", Source: "/etc/rules", Result: "success", Hash: "beef"}}
	calls := 0
	h, _ := clientAdmin(t, "name=r limit=1/1h", &res, &calls)
	status, body := as(h, "GET", "/v1/config", "203.0.113.1")
	var cfg Config
	if err := json.Unmarshal([]byte(body), &cfg); status != 200 || err != nil || cfg.Text != "rules: name=r" || cfg.Hashes["rules"] != "feed" {
		t.Errorf("GET /v1/config: %d %s (%v)", status, body, err)
	}
	reload := func(want int) []ReloadResult {
		t.Helper()
		before := calls
		status, body := as(h, "POST", "/v1/reload", "203.0.113.1")
		var got struct{ Results []ReloadResult }
		if err := json.Unmarshal([]byte(body), &got); status != want || err != nil || calls != before+1 {
			t.Fatalf("POST /v1/reload: %d %s (%v), %d calls; want %d, one call", status, body, err, calls-before, want)
		}
		return got.Results
	}
	if got := reload(200); len(got) != 1 || got[0].Config != "rules" || got[0].Result != "success" || got[0].Hash != "beef" {
		t.Errorf("reload results %+v, want %+v", got, res)
	}
	res = append(res, ReloadResult{Config: "rls", Source: "/etc/rls", Result: "error", Hash: "old", Errors: []string{"AUTHLIMIT_RLS_CONFIG: a mistake"}})
	if got := reload(422); len(got) != 2 || got[1].Errors[0] != "AUTHLIMIT_RLS_CONFIG: a mistake" {
		t.Errorf("refused reload results %+v", got)
	}
}

// TestQuotaConsumesNothingAndResetForgets: GET /v1/quota shows a client's
// standing as /auth would decide it, without spending any of it; DELETE
// forgets the client's state (one rule's with ?rule=, 404 for a rule not
// in force), and only that client's.
func TestQuotaConsumesNothingAndResetForgets(t *testing.T) {
	var res []ReloadResult
	calls := 0
	h, decideFor := clientAdmin(t, "name=a key=ip limit=2/1h; name=b key=ip limit=5/1h", &res, &calls)
	const client, other = "203.0.113.7", "203.0.113.8"
	remaining := func(ip string) (bool, map[string]int64) {
		t.Helper()
		status, body := as(h, "GET", "/v1/quota", ip)
		var q quotaJSON
		if err := json.Unmarshal([]byte(body), &q); status != 200 || err != nil || q.Client != ip {
			t.Fatalf("GET /v1/quota for %s: %d %s (%v)", ip, status, body, err)
		}
		out := map[string]int64{}
		for _, r := range q.Rules {
			out[r.Rule] = *r.Remaining
		}
		return q.Admitted, out
	}
	for i := 0; i < 3; i++ {
		if ok, rem := remaining(client); !ok || rem["a"] != 2 || rem["b"] != 5 {
			t.Fatalf("quota %d of a fresh client: admitted %v, %v; want admitted, a 2 and b 5 (a look spends nothing)", i, ok, rem)
		}
	}
	for i := 0; i < 3; i++ {
		decideFor(client)
		decideFor(other)
	}
	if ok, rem := remaining(client); ok || rem["a"] != 0 || rem["b"] != 3 {
		t.Fatalf("after 3 requests: admitted %v, %v; want denied, a 0 and b 3", ok, rem)
	}
	if status, body := as(h, "DELETE", "/v1/quota?rule=nosuch", client); status != 404 {
		t.Errorf("DELETE /v1/quota?rule=nosuch: %d %s, want 404", status, body)
	}
	if status, body := as(h, "DELETE", "/v1/quota?rule=a", client); status != 200 || !strings.Contains(body, `"rule": "a"`) || strings.Contains(body, `"rule": "b"`) {
		t.Fatalf("DELETE /v1/quota?rule=a: %d %s", status, body)
	}
	if ok, rem := remaining(client); !ok || rem["a"] != 2 || rem["b"] != 3 {
		t.Errorf("after resetting rule a: admitted %v, %v; want admitted, a 2 and b still 3", ok, rem)
	}
	if status, body := as(h, "DELETE", "/v1/quota", client); status != 200 {
		t.Fatalf("DELETE /v1/quota: %d %s", status, body)
	}
	if _, rem := remaining(client); rem["b"] != 5 {
		t.Errorf("after resetting every rule: %v, want b 5", rem)
	}
	if ok, rem := remaining(other); ok || rem["a"] != 0 || rem["b"] != 3 {
		t.Errorf("another client after the resets: admitted %v, %v; want its own counts, untouched", ok, rem)
	}
	if got := decideFor(client); got != decide.Allow {
		t.Errorf("the reset client's next request: %v, want admitted", got)
	}
}

// TestNewRequires: every field but Logger, Timeout, Top and Circuits is
// required.
func TestNewRequires(t *testing.T) {
	if _, err := New(Options{Token: testToken}); err == nil {
		t.Error("New with a token alone: accepted")
	}
}
