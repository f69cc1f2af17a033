package handler

import (
	"strings"
	"testing"
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
