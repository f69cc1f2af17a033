package main

import (
	"errors"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
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

// TestSPOAConfig: AUTHLIMIT_SPOA_LISTEN is host:port or unix:<path>, and
// needs trusted proxies to take connections from (on a Unix socket,
// 127.0.0.1, what its peers count as); -check says where it listens.
func TestSPOAConfig(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string // the one error naming AUTHLIMIT_SPOA_LISTEN; "" for none
	}{
		{"host:port", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "127.0.0.1:12345"}, ""},
		{"any address", map[string]string{"AUTHLIMIT_SPOA_LISTEN": ":12345"}, ""},
		{"unix socket", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "unix:/run/authlimit/spoa.sock"}, ""},
		{"unix socket, loopback alone trusted", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "unix:/run/authlimit/spoa.sock", "AUTHLIMIT_TRUSTED_PROXIES": "127.0.0.1"}, ""},
		{"unix socket, relative path", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "unix:spoa.sock"}, ""},
		{"port alone", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "12345"}, `"12345" is not host:port or unix:<path> (such as :12345, 127.0.0.1:12345 or unix:/run/authlimit/spoa.sock)`},
		{"port too large", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "127.0.0.1:99999"}, `port "99999" is not a number from 0 to 65535`},
		{"unix without a path", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "unix:"}, `"unix:" needs a socket path, such as unix:/run/authlimit/spoa.sock`},
		{"unix@, HAProxy's spelling", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "unix@/run/authlimit/spoa.sock"}, "is not host:port or unix:<path>"},
		{"no trusted proxies", map[string]string{"AUTHLIMIT_SPOA_LISTEN": ":12345", "AUTHLIMIT_TRUSTED_PROXIES": "none"}, "AUTHLIMIT_TRUSTED_PROXIES is none"},
		{"unix socket, no trusted proxies", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "unix:/run/authlimit/spoa.sock", "AUTHLIMIT_TRUSTED_PROXIES": "none"}, "AUTHLIMIT_TRUSTED_PROXIES is none"},
		{"unix socket, loopback not trusted", map[string]string{"AUTHLIMIT_SPOA_LISTEN": "unix:/run/authlimit/spoa.sock", "AUTHLIMIT_TRUSTED_PROXIES": "10.0.0.0/8,::1"}, "a Unix socket, but AUTHLIMIT_TRUSTED_PROXIES does not hold 127.0.0.1: a Unix socket's peer counts as 127.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := loadConfig(tt.env)
			errs := configErrors(err)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("loadConfig(%v): %v", tt.env, err)
				}
				if got, want := s.spoaNetwork+" "+s.spoaAddress, spoaWant(tt.env["AUTHLIMIT_SPOA_LISTEN"]); got != want {
					t.Errorf("AUTHLIMIT_SPOA_LISTEN=%s: listens on %q, want %q", tt.env["AUTHLIMIT_SPOA_LISTEN"], got, want)
				}
				return
			}
			if got := errs["AUTHLIMIT_SPOA_LISTEN"]; len(got) != 1 || !strings.Contains(got[0], tt.want) {
				t.Errorf("loadConfig(%v): AUTHLIMIT_SPOA_LISTEN errors %q, want one saying %q (all: %v)", tt.env, got, tt.want, errs)
			}
		})
	}

	said, err := checkEnv(t, map[string]string{"AUTHLIMIT_SPOA_LISTEN": "127.0.0.1:12345"})
	if err != nil || !strings.Contains(said, "spoa             127.0.0.1:12345 (HAProxy SPOE agent; connections from the trusted proxies)") {
		t.Errorf("-check: %v\n%s", err, said)
	}
	said, err = checkEnv(t, map[string]string{"AUTHLIMIT_SPOA_LISTEN": "unix:/run/authlimit/spoa.sock"})
	if err != nil || !strings.Contains(said, "spoa             unix:/run/authlimit/spoa.sock (HAProxy SPOE agent on a Unix socket: made with authlimit's umask, removed at exit; a peer counts as 127.0.0.1, one of the trusted proxies)") {
		t.Errorf("-check on a Unix socket: %v\n%s", err, said)
	}
	if said, _ := checkEnv(t, nil); !strings.Contains(said, "spoa             off") {
		t.Errorf("-check without SPOA: %s", said)
	}
}

// spoaWant is the network and address a valid AUTHLIMIT_SPOA_LISTEN
// listens on.
func spoaWant(v string) string {
	if path, ok := strings.CutPrefix(v, "unix:"); ok {
		return "unix " + path
	}
	return "tcp " + v
}

// TestSPOAUnixSocket: with AUTHLIMIT_SPOA_LISTEN=unix:<path> the agent
// answers HAProxy on that socket, its peer trusted as 127.0.0.1; a socket
// a previous run left there is replaced, and the file is gone once
// authlimit has stopped.
func TestSPOAUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "spoa.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = stale.Close() // the file stays, as after a crash
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != fs.ModeSocket {
		t.Fatalf("the stale socket: %v, %v", fi, err)
	}
	// Registered before startApp, so it runs after startApp's cleanup
	// has stopped authlimit.
	t.Cleanup(func() {
		if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after authlimit stopped, %s: %v, want it removed", sock, err)
		}
	})
	app := startApp(t, map[string]string{
		"AUTHLIMIT_RULES":           "name=per-ip key=ip limit=1/1m",
		"AUTHLIMIT_SPOA_LISTEN":     "unix:" + sock,
		"AUTHLIMIT_TRUSTED_PROXIES": "127.0.0.1",
	})
	if got := app.app.spoa.listener.Addr().Network(); got != "unix" {
		t.Fatalf("the agent listens on %s, want unix", got)
	}
	c, err := spoatest.Dial("unix:"+sock, 16380)
	if err != nil {
		t.Fatalf("dial the agent at unix:%s: %v", sock, err)
	}
	defer c.Close()
	r := spoatest.Request{Src: netip.MustParseAddr("203.0.113.7"), Method: "GET", Target: "/", Headers: []string{"Host", "localhost"}}
	for i, want := range []string{"allow", "deny"} {
		vars, err := c.Ask(r)
		if err != nil {
			t.Fatal(err)
		}
		if vars["verdict"] != want {
			t.Errorf("NOTIFY %d over the Unix socket: %v, want %s", i+1, vars, want)
		}
		if want == "deny" && (vars["status"] != "429" || vars["retry_after"] == "") {
			t.Errorf("the denial over the Unix socket: %v, want status 429 and retry_after", vars)
		}
	}
	m := app.do(t, request{path: "/metrics"})
	for _, want := range []string{"authlimit_spoa_connections_accepted_total 1", "authlimit_spoa_connections_refused_total 0"} {
		if !strings.Contains(m.body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
