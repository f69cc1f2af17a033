package handler

import (
	"strings"
	"testing"

	"github.com/authlimit/authlimit/internal/race"
)

// TestUnderscoreHeaderNames: a header name that differs from a rule's only
// in '-' against '_' is the same header, as CGI-style backends read it
// (X_Api_Key and X-Api-Key are both HTTP_X_API_KEY): it is counted under
// the rule's key, and sent with the other spelling it is a repeated
// header.
func TestUnderscoreHeaderNames(t *testing.T) {
	h := newHandler(t, "name=k key=header:X-Api-Key limit=1/1m; name=c key=ip limit=5/1m cost=header:X-Cost path=/cost")
	serve := func(lines ...string) (int, string) {
		t.Helper()
		ctx := serveRaw(t, h, rawAuth(lines...))
		return ctx.Response.StatusCode(), string(ctx.Response.Body())
	}
	for _, lines := range [][]string{
		{"X_Api_Key: fresh", "X-Api-Key: victim"},
		{"X-Api-Key: victim", "x_api_key: fresh"},
		{"X-Api_Key: victim", "X_Api-Key: fresh"},
	} {
		if code, body := serve(lines...); code != 429 || !strings.Contains(body, "urn:authlimit:repeated-header") {
			t.Errorf("%q: %d %s, want 429 repeated-header", lines, code, body)
		}
	}
	if code, body := serve("X_Api_Key: victim"); code != 200 {
		t.Fatalf("X_Api_Key victim: %d %s, want 200", code, body)
	}
	for _, line := range []string{"X-Api-Key: victim", "X_Api_Key: victim", "x_api-key:  victim "} {
		if code, body := serve(line); code != 429 || !strings.Contains(body, "urn:authlimit:rate-limited") {
			t.Errorf("%q after X_Api_Key's one request: %d %s, want 429 rate-limited", line, code, body)
		}
	}
	if code, body := serve("X-Api-Key: other"); code != 200 {
		t.Errorf("X-Api-Key other: %d %s, want 200", code, body)
	}

	// The cost header too.
	if code, body := serve("X-Forwarded-Uri: /cost", "X_Cost: 5", "X-Cost: 1"); code != 429 || !strings.Contains(body, "urn:authlimit:repeated-header") {
		t.Errorf("X_Cost 5 and X-Cost 1: %d %s, want 429 repeated-header", code, body)
	}
	if code, body := serve("X-Forwarded-Uri: /cost", "X_Cost: 5"); code != 200 {
		t.Errorf("X_Cost 5: %d %s, want 200", code, body)
	}
	if code, body := serve("X-Forwarded-Uri: /cost", "X-Cost: 1"); code != 429 || !strings.Contains(body, "urn:authlimit:rate-limited") {
		t.Errorf("X-Cost 1 after X_Cost 5 of 5: %d %s, want 429 rate-limited", code, body)
	}
}

// TestMethodOverride: on a POST, a rule for the method an override header
// names applies, deciding without allocating; a HEAD falls under GET rules.
func TestMethodOverride(t *testing.T) {
	h := newHandler(t, "name=del key=ip limit=1/1m method=DELETE; name=get key=ip limit=1/1m method=GET")
	serve := func(lines ...string) (int, string) {
		t.Helper()
		ctx := serveRaw(t, h, rawAuth(lines...))
		return ctx.Response.StatusCode(), string(ctx.Response.Body())
	}
	if code, body := serve("X-Forwarded-Method: POST", "X-HTTP-Method-Override: delete"); code != 200 {
		t.Fatalf("POST standing for DELETE: %d %s", code, body)
	}
	if code, body := serve("X-Forwarded-Method: DELETE"); code != 429 || !strings.Contains(body, `"del"`) {
		t.Errorf("DELETE after a POST standing for one: %d %s, want 429 by del", code, body)
	}
	if code, body := serve("X-Forwarded-Method: HEAD"); code != 200 {
		t.Fatalf("HEAD: %d %s", code, body)
	}
	if code, body := serve("X-Forwarded-Method: GET"); code != 429 || !strings.Contains(body, `"get"`) {
		t.Errorf("GET after a HEAD: %d %s, want 429 by get", code, body)
	}
	if code, body := serve("X-Forwarded-Method: POST"); code != 200 {
		t.Errorf("a plain POST: %d %s, want 200 (no rule applies)", code, body)
	}

	if race.Enabled {
		return
	}
	hu := newHandler(t, "name=del key=ip limit=1000000/1m method=DELETE,PUT")
	ctx := serveRaw(t, hu, rawAuth("X-Forwarded-Method: POST", "Accept: */*", "X-Method-Override: patch, Put"))
	if ctx.Response.StatusCode() != 200 || len(ctx.Response.Header.Peek("RateLimit-Policy")) == 0 {
		t.Fatalf("POST standing for PUT: %d %s, want 200 under del", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	run := func() {
		ctx.Response.Reset()
		hu.Serve(ctx)
	}
	if got := testing.AllocsPerRun(200, run); got != 0 {
		t.Errorf("POST standing for PUT: %v allocations per request, want 0", got)
	}
}
