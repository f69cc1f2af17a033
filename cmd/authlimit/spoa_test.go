package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/authlimit/authlimit/front/spoa/spoatest"
)

// TestSPOAAgent: with AUTHLIMIT_SPOA_LISTEN, HAProxy's SPOE is answered
// by the engine /auth decides with: one quota for a client, whichever
// front asks; the connection is counted.
func TestSPOAAgent(t *testing.T) {
	stores(t, func(t *testing.T, env map[string]string) {
		app := startApp(t, with(env, "AUTHLIMIT_RULES", "name=per-ip key=ip limit=3/1m", "AUTHLIMIT_SPOA_LISTEN", "127.0.0.1:0"))
		c, err := spoatest.Dial(app.app.spoa.listener.Addr().String(), 16380)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ask := func() map[string]string {
			t.Helper()
			vars, err := c.Ask(spoatest.Request{Src: netip.MustParseAddr("203.0.113.7"), Method: "GET", Target: "/", Headers: []string{"Host", "localhost"}})
			if err != nil {
				t.Fatal(err)
			}
			return vars
		}
		if vars := ask(); vars["verdict"] != "allow" || vars["x_ratelimit_remaining"] != "2" {
			t.Errorf("first through SPOE: %v, want allow with 2 remaining", vars)
		}
		wantStatus(t, app.do(t, authFrom("203.0.113.7")), 200, "/auth after one through SPOE")
		if vars := ask(); vars["verdict"] != "allow" || vars["x_ratelimit_remaining"] != "0" {
			t.Errorf("third, through SPOE: %v, want allow with 0 remaining", vars)
		}
		wantStatus(t, app.do(t, authFrom("203.0.113.7")), 429, "/auth after three")
		if vars := ask(); vars["verdict"] != "deny" || vars["status"] != "429" || vars["reason"] != "rate-limited" || !strings.Contains(vars["body"], "urn:authlimit:rate-limited") {
			t.Errorf("fifth, through SPOE: %v, want a denial", vars)
		}
		m := app.do(t, request{path: "/metrics"})
		for _, want := range []string{"authlimit_spoa_connections_accepted_total 1", `authlimit_requests_total{front="spoa",result="allowed"} 2`, `authlimit_requests_total{front="spoa",result="denied"} 1`, `authlimit_requests_total{front="http",result="denied"} 1`} {
			if !strings.Contains(m.body, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
	})
}

// TestSPOAUnderBudget: a frame the agent has not finished reading counts
// in AUTHLIMIT_MAX_BUFFERED_BYTES, as the other ports' unfinished requests
// do, and is given back once its connection closes.
func TestSPOAUnderBudget(t *testing.T) {
	app := startApp(t, map[string]string{"AUTHLIMIT_SPOA_LISTEN": "127.0.0.1:0"})
	c, err := spoatest.Dial(app.app.spoa.listener.Addr().String(), 16380)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := spoatest.Request{Src: netip.MustParseAddr("203.0.113.7"), Method: "GET", Target: "/", Headers: []string{"Host", "localhost", "X-Held", strings.Repeat("h", 10<<10)}}
	if err := c.Start(r, 1024); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unfinished frame counted", func() bool { return app.app.budget.Used() >= 10<<10 })
	_ = c.Close()
	waitFor(t, "the closed connection's bytes given back", func() bool { return app.app.budget.Used() == 0 })
}

// TestSPOAConfig: AUTHLIMIT_SPOA_LISTEN must be host:port, and needs
// trusted proxies to take connections from; -check says where it listens.
func TestSPOAConfig(t *testing.T) {
	errs := configErrors(func() error { _, err := loadConfig(map[string]string{"AUTHLIMIT_SPOA_LISTEN": "12345"}); return err }())
	if len(errs["AUTHLIMIT_SPOA_LISTEN"]) != 1 || !strings.Contains(errs["AUTHLIMIT_SPOA_LISTEN"][0], "not host:port") {
		t.Errorf("SPOA_LISTEN=12345: %v", errs)
	}
	errs = configErrors(func() error {
		_, err := loadConfig(map[string]string{"AUTHLIMIT_SPOA_LISTEN": ":12345", "AUTHLIMIT_TRUSTED_PROXIES": "none"})
		return err
	}())
	if len(errs["AUTHLIMIT_SPOA_LISTEN"]) != 1 || !strings.Contains(errs["AUTHLIMIT_SPOA_LISTEN"][0], "AUTHLIMIT_TRUSTED_PROXIES is none") {
		t.Errorf("SPOA_LISTEN without trusted proxies: %v", errs)
	}
	said, err := checkEnv(t, map[string]string{"AUTHLIMIT_SPOA_LISTEN": "127.0.0.1:12345"})
	if err != nil || !strings.Contains(said, "spoa             127.0.0.1:12345") {
		t.Errorf("-check: %v\n%s", err, said)
	}
	if said, _ := checkEnv(t, nil); !strings.Contains(said, "spoa             off") {
		t.Errorf("-check without SPOA: %s", said)
	}
}
