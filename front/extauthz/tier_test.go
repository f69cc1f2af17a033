package extauthz

import (
	"strings"
	"testing"

	"github.com/authlimit/authlimit/internal/redistest"
)

// TestCheckTiers: Check decides tiers and overrides through the engine as
// /auth does: the tier header is read only when attributes.source.address
// is a trusted proxy, refused when repeated (joined with "," by Envoy, or
// two raw lines), and RateLimit-Policy gives the limit that applied. On
// the memory store and Redis alike.
func TestCheckTiers(t *testing.T) {
	const src = "name=api key=header:X-Api-Key limit=2/1h tier=header:X-Plan; tier rule=api name=pro limit=4/1h; override rule=api key=k-acme limit=6/1h"
	const own, pro, acme = `"api";q=2;w=3600`, `"api";q=4;w=3600`, `"api";q=6;w=3600`
	for _, b := range []backend{{name: "memory"}, {name: "redis", redis: redistest.New(t)}} {
		t.Run(b.name, func(t *testing.T) {
			st := newStack(t, b, src, nil)
			admitted := func(s step, raw bool, policy string) int {
				t.Helper()
				for i := 0; i < 10; i++ {
					a := st.viaCheck(t, s, raw)
					if a.status == 429 && strings.Contains(a.body, "rate-limited") {
						return i
					}
					if a.status != 200 {
						t.Fatalf("%+v: %d %s", s, a.status, a.body)
					}
					if got := a.headers["RateLimit-Policy"]; got != policy {
						t.Errorf("%+v: RateLimit-Policy %q, want %q", s, got, policy)
					}
				}
				return 10
			}
			tests := []struct {
				name   string
				s      step
				raw    bool
				policy string
				want   int
			}{
				{"pro through a trusted proxy", step{proxied: true, headers: []string{"X-Api-Key", "k1", "X-Plan", "pro"}}, true, pro, 4},
				{"pro through a trusted proxy, joined headers", step{proxied: true, headers: []string{"X-Api-Key", "k2", "X-Plan", "PRO"}}, false, pro, 4},
				{"pro from the client itself", step{headers: []string{"X-Api-Key", "k3", "X-Plan", "pro"}}, true, own, 2},
				{"unknown tier", step{proxied: true, headers: []string{"X-Api-Key", "k4", "X-Plan", "gold"}}, true, own, 2},
				{"override", step{headers: []string{"X-Api-Key", "k-acme"}}, false, acme, 6},
			}
			for _, tt := range tests {
				if got := admitted(tt.s, tt.raw, tt.policy); got != tt.want {
					t.Errorf("%s: %d admitted, want %d", tt.name, got, tt.want)
				}
			}
			twice := step{proxied: true, headers: []string{"X-Api-Key", "k5", "X-Plan", "pro", "X-Plan", "pro"}}
			for _, raw := range []bool{true, false} {
				if a := st.viaCheck(t, twice, raw); a.status != 429 || !strings.Contains(a.body, "urn:authlimit:repeated-header") {
					t.Errorf("repeated tier (raw %v): %d %s, want 429 repeated-header", raw, a.status, a.body)
				}
			}
			// /auth, from loopback (trusted), agrees.
			if a := st.viaHTTP(t, step{client: "203.0.113.9", headers: []string{"X-Api-Key", "k6", "X-Plan", "pro"}}); a.status != 200 || a.headers["RateLimit-Policy"] != pro {
				t.Errorf("/auth: %d %v, want 200 under pro", a.status, a.headers)
			}
		})
	}
}
