//go:build e2e

package e2e

import (
	"fmt"
	"testing"
)

// TestNginxReusesConnections: behind nginx/example.conf and
// nginx/openresty.conf, as shipped, nginx keeps its connections to
// authlimit and reuses them for allowed and denied requests alike, so
// authlimit accepts a handful of connections, not one per request.
// auth_request never reads the subrequest's body, and nginx does not keep
// a connection whose answer it has not read whole: example.conf sends its
// subrequests as HEAD (proxy_method HEAD), whose answers have no body;
// without it every denial (403 with a problem+json body) costs a new
// connection. nginx/authlimit.lua reads every answer whole and keeps its
// connection in a pool of its own (setkeepalive). HAProxy's Lua action goes
// through a listen section that keeps its connections (http-reuse
// always), and its SPOE keeps a few to the agent, each carrying many
// requests.
func TestNginxReusesConnections(t *testing.T) {
	const (
		limit   = 5
		over    = 200 // denials of the one client far over its limit
		others  = 20  // other clients, allowed
		maxConn = 8
	)
	forBypassProxies(t, func(t *testing.T, px proxy) {
		s := newStack(t, px, fmt.Sprintf("name=per-ip key=ip limit=%d/1m", limit), "")
		a := s.authlimit[0]
		before := scrape(t, a.addr)

		c := newClient("127.0.0.40")
		for i := 0; i < limit+over; i++ {
			want := 200
			if i >= limit {
				want = 429
			}
			if r := c.do(t, "GET", s.url(0, "/keepalive"), nil); r.status != want {
				t.Fatalf("request %d of the client over its limit: %d %q, want %d", i+1, r.status, firstLine(r.body), want)
			}
		}
		for i := 0; i < others; i++ {
			o := newClient(fmt.Sprintf("127.0.2.%d", 10+i))
			if r := o.do(t, "GET", s.url(0, "/keepalive"), nil); r.status != 200 {
				t.Fatalf("client %s: %d %q, want 200", o.ip, r.status, firstLine(r.body))
			}
		}

		after := scrape(t, a.addr)
		// Through SPOE, HAProxy's connections are the agent's.
		conns, front := "authlimit_connections_accepted_total", "http"
		if px.spoe {
			conns, front = "authlimit_spoa_connections_accepted_total", "spoa"
		}
		if after[conns] < 1 {
			t.Fatalf("authlimit exports no %s, or counted none of the connections", conns)
		}
		delta := func(name string) float64 { return after.sum(name) - before.sum(name) }
		if got, want := delta(`authlimit_requests_total{front="`+front+`",result="denied"}`), float64(over); got != want {
			t.Errorf("authlimit denied %v requests, want %v", got, want)
		}
		if got, want := delta(`authlimit_requests_total{front="`+front+`",result="allowed"}`), float64(limit+others); got != want {
			t.Errorf("authlimit allowed %v requests, want %v", got, want)
		}
		// The scrapes come on a connection of their own, maybe two.
		if got := delta(conns); got > maxConn {
			t.Errorf("authlimit accepted %v connections for %d requests through %s, want at most %d: nginx does not keep its connections to authlimit",
				got, limit+over+others, px.name, maxConn)
		} else {
			t.Logf("%s: %v connections accepted for %d requests", px.name, got, limit+over+others)
		}
		if got := s.backend.count("/keepalive"); got != limit+others {
			t.Errorf("%d requests reached the backend, want %d", got, limit+others)
		}
	})
}
