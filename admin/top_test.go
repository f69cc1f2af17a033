package admin

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/denials"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

const testToken = "admin-token-for-tests"

type noHeaders struct{}

func (noHeaders) Lookup(string) ([]byte, int) { return nil, 0 }

// testAdmin returns a Handler over an engine of src on the memory store,
// with a denials recorder, and a function deciding a request for an
// address. The quota endpoints read the client from X-Forwarded-For; mod
// changes the options.
func testAdmin(t *testing.T, src string, mod ...func(*Options)) (*Handler, func(ip string) decide.Verdict) {
	t.Helper()
	rs, err := rules.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	sets := rulesettest.Holder(t, rs)
	g, err := guard.New(guard.Options{Store: m, Rules: sets})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := denials.New(denials.Options{Size: 8, Window: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	e, err := decide.New(decide.Options{Rules: sets, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	read := func(ip string, in *decide.Input) {
		e.Read(in, netip.MustParseAddr(ip), []byte("GET"), []byte("/"), nil, noHeaders{})
	}
	opts := Options{
		Token: testToken, Engine: e, Store: g,
		Read: func(ctx *fasthttp.RequestCtx, in *decide.Input) {
			if ip := ctx.Request.Header.Peek("X-Forwarded-For"); len(ip) > 0 {
				read(string(ip), in)
			}
		},
		Config:   func() Config { return Config{Hashes: map[string]string{"rules": "abc123"}} },
		Reload:   func() []ReloadResult { return nil },
		Top:      rec,
		Circuits: g.Circuits,
	}
	for _, f := range mod {
		f(&opts)
	}
	h, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return h, func(ip string) decide.Verdict {
		var in decide.Input
		var o decide.Outcome
		read(ip, &in)
		e.Decide(context.Background(), &in, &o)
		return o.Verdict
	}
}

// call sends one request to h and returns the status and the body.
func call(h *Handler, method, uri string, token bool) (int, string, *fasthttp.Response) {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(uri)
	if token {
		ctx.Request.Header.Set("Authorization", "Bearer "+testToken)
	}
	h.Serve(&ctx)
	return ctx.Response.StatusCode(), string(ctx.Response.Body()), &ctx.Response
}

// TestTopEndpoint: GET /v1/top answers a rule's most denied keys, needs
// the token, and names what is wrong with a bad request.
func TestTopEndpoint(t *testing.T) {
	h, decideFor := testAdmin(t, "name=per-ip key=ip limit=1/1h; name=other key=ip limit=100/1h")
	for ip, n := range map[string]int{"203.0.113.1": 4, "203.0.113.2": 2} {
		for i := 0; i < n; i++ {
			decideFor(ip)
		}
	}
	for _, tc := range []struct {
		uri    string
		token  bool
		status int
		has    string
	}{
		{"/v1/top?rule=per-ip", false, 401, "bearer token"},
		{"/v1/top", true, 400, "one of per-ip, other"},
		{"/v1/top?rule=nope", true, 404, `no rule \"nope\"`},
		{"/v1/top?rule=per-ip&n=0", true, 400, "from 1 to 1000"},
		{"/v1/top?rule=per-ip&n=x", true, 400, "from 1 to 1000"},
		{"/v1/top?rule=other", true, 200, `"entries": []`},
		{"/v1/top?rule=per-ip&n=1", true, 200, `"tag": "203.0.113.1"`},
	} {
		status, body, _ := call(h, "GET", tc.uri, tc.token)
		if status != tc.status || !strings.Contains(body, tc.has) {
			t.Errorf("GET %s: %d %s, want %d with %q", tc.uri, status, body, tc.status, tc.has)
		}
	}
	_, body, _ := call(h, "GET", "/v1/top?rule=per-ip", true)
	var a denials.Answer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatal(err)
	}
	if len(a.Current.Entries) != 2 || a.Current.Entries[0].Denied != 3 || a.Current.Entries[1].Denied != 1 || !a.Current.Exact {
		t.Errorf("top: %s", body)
	}
	if status, _, _ := call(h, "POST", "/v1/top?rule=per-ip", true); status != 405 {
		t.Errorf("POST /v1/top: %d, want 405", status)
	}
}

// TestTagQuota: a key tag's quota is read and reset by rule and tag, as the
// status page's buttons do; a bad tag or rule is named.
func TestTagQuota(t *testing.T) {
	h, decideFor := testAdmin(t, "name=per-ip key=ip limit=2/1h")
	for i := 0; i < 3; i++ {
		decideFor("203.0.113.9")
	}
	remaining := func() string {
		status, body, _ := call(h, "GET", "/v1/quota?rule=per-ip&tag=203.0.113.9", true)
		if status != 200 {
			t.Fatalf("peek: %d %s", status, body)
		}
		var q struct {
			Rules []struct {
				Remaining *int64 `json:"remaining"`
				Allowed   *bool  `json:"allowed"`
			} `json:"rules"`
		}
		if err := json.Unmarshal([]byte(body), &q); err != nil || len(q.Rules) != 1 {
			t.Fatalf("peek: %v %s", err, body)
		}
		b, _ := json.Marshal(q.Rules[0])
		return string(b)
	}
	if got := remaining(); got != `{"remaining":0,"allowed":false}` {
		t.Errorf("before the reset: %s", got)
	}
	if status, body, _ := call(h, "DELETE", "/v1/quota?rule=per-ip&tag=203.0.113.9", true); status != 200 {
		t.Fatalf("reset: %d %s", status, body)
	}
	if got := remaining(); got != `{"remaining":2,"allowed":true}` {
		t.Errorf("after the reset: %s", got)
	}
	if v := decideFor("203.0.113.9"); v != decide.Allow {
		t.Errorf("after the reset: %v, want allow", v)
	}
	for _, tc := range []struct {
		method, uri string
		status      int
		has         string
	}{
		{"DELETE", "/v1/quota?rule=nope&tag=a", 404, `no rule \"nope\"`},
		{"GET", "/v1/quota?tag=a", 400, "tag= needs rule="},
		{"DELETE", "/v1/quota?rule=per-ip&tag=", 400, "not a key tag"},
		{"GET", "/v1/quota?rule=per-ip&tag=" + strings.Repeat("a", 65), 400, "not a key tag"},
		{"GET", "/v1/quota?rule=per-ip&tag=%7Bx%7D", 400, "not a key tag"},
	} {
		if status, body, _ := call(h, tc.method, tc.uri, true); status != tc.status || !strings.Contains(body, tc.has) {
			t.Errorf("%s %s: %d %s, want %d with %q", tc.method, tc.uri, status, body, tc.status, tc.has)
		}
	}
}

// TestStatusPageFiles: the page and its files are served without the
// token, under a policy that allows nothing from elsewhere; the API is
// not.
func TestStatusPageFiles(t *testing.T) {
	h, _ := testAdmin(t, "name=per-ip key=ip limit=1/1h")
	for uri, has := range map[string]string{"/": "<title>authlimit status</title>", "/status.js": "sessionStorage", "/status.css": "body {"} {
		status, body, resp := call(h, "GET", uri, false)
		if status != 200 || !strings.Contains(body, has) {
			t.Errorf("GET %s: %d, body without %q", uri, status, has)
		}
		if csp := string(resp.Header.Peek("Content-Security-Policy")); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", uri, csp)
		}
	}
	if status, _, _ := call(h, "GET", "/v1/status", false); status != 401 {
		t.Errorf("GET /v1/status without a token: %d, want 401", status)
	}
	if status, _, _ := call(h, "POST", "/", false); status != 401 {
		t.Errorf("POST / without a token: %d, want 401", status)
	}
}

// TestStatusEndpoint: GET /v1/status lists the rules in force with their
// limits and rates, and the configuration's hashes.
func TestStatusEndpoint(t *testing.T) {
	h, decideFor := testAdmin(t, "name=per-ip key=ip limit=1/1h; name=trial key=ip limit=1/1h shadow=true")
	decideFor("203.0.113.1")
	status, body, _ := call(h, "GET", "/v1/status", true)
	if status != 200 {
		t.Fatalf("GET /v1/status: %d %s", status, body)
	}
	var s statusJSON
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Rules) != 2 || s.Rules[0].Rule != "per-ip" || s.Rules[0].Limit != "1 per 1h0m0s (sliding_window_counter)" || !s.Rules[1].Shadow || s.Hashes["rules"] != "abc123" {
		t.Errorf("status: %s", body)
	}
	if s.Rules[0].Rates == nil {
		t.Errorf("per-ip, decided once, has no rates: %s", body)
	}
}
