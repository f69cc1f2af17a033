package handler

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/authlimit/authlimit/rules"
)

// TestTierFromTrustedProxyOnly: /auth reads a rule's tier header only from
// a trusted peer, in either spelling of its name, refuses it repeated
// (under one spelling or two) without counting, and gives the limit that
// applied in RateLimit-Policy; an override applies to its key alone.
func TestTierFromTrustedProxyOnly(t *testing.T) {
	const src = "name=api key=header:X-Api-Key limit=2/1h tier=header:X-Plan; tier rule=api name=pro limit=4/1h; override rule=api key=k-acme limit=6/1h"
	trusted := newHandler(t, src)
	untrusted := newHandler(t, src, func(o *testOptions) {
		o.Proxies = rules.Proxies{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	})
	admitted := func(h *Handler, policy string, lines ...string) int {
		t.Helper()
		for i := 0; i < 10; i++ {
			ctx := serveRaw(t, h, rawAuth(lines...))
			switch ctx.Response.StatusCode() {
			case 200:
			case 429:
				if !strings.Contains(string(ctx.Response.Body()), "rate-limited") {
					t.Fatalf("%q: 429 %s, want rate-limited", lines, ctx.Response.Body())
				}
				return i
			default:
				t.Fatalf("%q: %d %s", lines, ctx.Response.StatusCode(), ctx.Response.Body())
			}
			if got := string(ctx.Response.Header.Peek("RateLimit-Policy")); got != policy {
				t.Errorf("%q: RateLimit-Policy %q, want %q", lines, got, policy)
			}
		}
		return 10
	}
	const own, pro, acme = `"api";q=2;w=3600`, `"api";q=4;w=3600`, `"api";q=6;w=3600`
	tests := []struct {
		name   string
		h      *Handler
		policy string
		lines  []string
		want   int
	}{
		{"pro from a trusted proxy", trusted, pro, []string{"X-Api-Key: k1", "X-Plan: pro"}, 4},
		{"the name spelt with _", trusted, pro, []string{"X-Api-Key: k2", "X_Plan: Pro"}, 4},
		{"pro from an untrusted peer", untrusted, own, []string{"X-Api-Key: k3", "X-Plan: pro"}, 2},
		{"no tier", trusted, own, []string{"X-Api-Key: k4"}, 2},
		{"unknown tier", trusted, own, []string{"X-Api-Key: k5", "X-Plan: enterprise"}, 2},
		{"override", untrusted, acme, []string{"X-Api-Key: k-acme"}, 6},
	}
	for _, tt := range tests {
		if got := admitted(tt.h, tt.policy, tt.lines...); got != tt.want {
			t.Errorf("%s: %d admitted, want %d", tt.name, got, tt.want)
		}
	}
	for _, lines := range [][]string{
		{"X-Api-Key: k6", "X-Plan: pro", "X-Plan: pro"},
		{"X-Api-Key: k6", "X-Plan: free", "X_Plan: pro"},
		{"X-Api-Key: k6", "x-plan: pro", "X-PLAN:"},
	} {
		ctx := serveRaw(t, trusted, rawAuth(lines...))
		if ctx.Response.StatusCode() != 429 || !strings.Contains(string(ctx.Response.Body()), "urn:authlimit:repeated-header") {
			t.Errorf("%q: %d %s, want 429 repeated-header", lines, ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
	// The refusals counted nothing: k6 has its own 2.
	if got := admitted(trusted, own, "X-Api-Key: k6"); got != 2 {
		t.Errorf("k6 after refusals: %d admitted, want 2", got)
	}
}
