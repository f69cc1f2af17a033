//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// silentAuth stands in for an authlimit that accepts connections and reads
// requests but never answers (stalled, or holding a shaped request too
// long). It counts the requests it read by X-Forwarded-Uri.
type silentAuth struct {
	addr     string
	mu       sync.Mutex
	requests map[string]int
}

func startSilentAuth(t *testing.T) *silentAuth {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentAuth{addr: l.Addr().String(), requests: map[string]int{}}
	var conns sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			conns.Add(1)
			go func() {
				defer conns.Done()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					req.Body.Close()
					s.mu.Lock()
					s.requests[req.Header.Get("X-Forwarded-Uri")]++
					s.mu.Unlock()
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	return s
}

func (s *silentAuth) count(uri string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[uri]
}

// TestHAProxySlowAuthlimit: behind haproxy/haproxy.cfg, an authlimit that
// does not answer costs a client the listen section's "timeout server",
// then the documented fail behaviour: 503 with the problem body, or with
// proc.authlimit_unreachable "open" the backend's answer. The request
// reached authlimit once: the listen section resends nothing.
func TestHAProxySlowAuthlimit(t *testing.T) {
	px := proxyNamed(t, "haproxy")
	for _, variant := range []string{"slow", "slow failopen"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			silent := startSilentAuth(t)
			b := startBackend(t)
			addr := px.start(t, silent.addr, b.addr, variant)
			c := newClient("127.0.0.31")
			r := c.do(t, "GET", "http://"+addr+"/slow", nil)
			want := 503
			if strings.Contains(variant, "failopen") {
				want = 200
			}
			if r.status != want {
				t.Errorf("authlimit silent: %d %q, want %d", r.status, firstLine(r.body), want)
			}
			if want == 503 {
				if ct := r.header.Get("Content-Type"); ct != "application/problem+json" || !strings.Contains(r.body, `"type":"urn:authlimit:unreachable"`) {
					t.Errorf("authlimit silent: Content-Type %q, body %q, want urn:authlimit:unreachable", ct, r.body)
				}
				if got := b.count("/slow"); got != 0 {
					t.Errorf("%d requests reached the backend, want 0", got)
				}
			} else if got := b.count("/slow"); got != 1 {
				t.Errorf("%d requests reached the backend, want 1", got)
			}
			// Within the timeout, and a margin for a loaded machine.
			if r.elapsed < slowTimeout || r.elapsed > slowTimeout+5*time.Second {
				t.Errorf("the answer took %v, want %v and a margin", r.elapsed, slowTimeout)
			}
			if got := silent.count("/slow"); got != 1 {
				t.Errorf("authlimit got the request %d times, want once", got)
			}
		})
	}
}

// TestHAProxyReusesConnections: with many clients at once, HAProxy opens
// about one connection to authlimit per request in flight, and keeps them
// for the next requests: a second round of the same clients costs few new
// ones. (One client after another costs one connection in all:
// TestNginxReusesConnections.)
func TestHAProxyReusesConnections(t *testing.T) {
	const (
		clients = 16
		each    = 20
	)
	px := proxyNamed(t, "haproxy")
	s := newStack(t, px, "name=per-ip key=ip limit=1000/1m", "")
	a := s.authlimit[0]
	round := func() float64 {
		t.Helper()
		before := scrape(t, a.addr)
		var wg sync.WaitGroup
		errs := make(chan string, clients*each)
		for i := 0; i < clients; i++ {
			wg.Add(1)
			go func(c *client) {
				defer wg.Done()
				for j := 0; j < each; j++ {
					if r := c.do(t, "GET", s.url(0, "/reuse"), nil); r.status != 200 {
						errs <- fmt.Sprintf("client %s: %d %q", c.ip, r.status, firstLine(r.body))
					}
				}
			}(newClient(fmt.Sprintf("127.0.3.%d", 10+i)))
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		after := scrape(t, a.addr)
		return after.sum("authlimit_connections_accepted_total") - before.sum("authlimit_connections_accepted_total")
	}
	first, second := round(), round()
	t.Logf("haproxy: %v then %v connections accepted for two rounds of %d requests from %d clients at once", first, second, clients*each, clients)
	// Each scrape is a connection of its own.
	if first > clients+2 {
		t.Errorf("first round: %v connections for %d requests, %d at a time: HAProxy does not reuse its connections to authlimit", first, clients*each, clients)
	}
	if second > clients/2+2 {
		t.Errorf("second round: %v new connections, want at most %d: HAProxy did not keep its connections to authlimit", second, clients/2+2)
	}
	if got := s.backend.count("/reuse"); got != 2*clients*each {
		t.Errorf("%d requests reached the backend, want %d", got, 2*clients*each)
	}
}

// TestHAProxyRequest: what HAProxy tells authlimit, seen through rules,
// with the Lua action and with SPOE alike. HAProxy's httpclient adds
// "User-Agent: HAProxy" and "Accept: */*" to a request without them;
// authlimit.lua sends them empty, and SPOE sends the client's headers as
// they are, so a client without User-Agent is one without it to
// authlimit, not a client named HAProxy. A request without Host gets 400
// before authlimit is asked, as host= rules could not apply to it. The
// client's X-Forwarded-Proto, in either spelling, does not reach authlimit
// either: a rule keyed on it sees HAProxy's own.
func TestHAProxyRequest(t *testing.T) {
	forProxies(t, []string{"haproxy", "haproxy-spoe"}, func(t *testing.T, px proxy) {
		s := newStack(t, px, `
name=ua key=header:User-Agent limit=1/1m on_missing=deny path=/ua
name=accept key=header:Accept limit=1/1m on_missing=deny path=/accept
name=proto key=header:X-Forwarded-Proto limit=1/1m path=/proto
name=api key=ip limit=2/1m host=api.example.com`, "")
		addr := s.proxy[0]
		get := func(ip, line string, headers ...string) result {
			return rawDo(t, ip, addr, rawRequest(line, "", headers...))
		}

		// No User-Agent, no Accept: refused as missing, from every client.
		for i := 0; i < 2; i++ {
			ip := fmt.Sprintf("127.0.4.%d", 10+i)
			checkDenial(t, px, "GET /ua without User-Agent", get(ip, "GET /ua HTTP/1.1", "Host", "localhost"), "missing-key")
			checkDenial(t, px, "GET /accept without Accept", get(ip, "GET /accept HTTP/1.1", "Host", "localhost"), "missing-key")
		}
		// With them: one each per value.
		for _, tc := range []struct{ path, header string }{{"/ua", "User-Agent"}, {"/accept", "Accept"}} {
			if r := get("127.0.4.12", "GET "+tc.path+" HTTP/1.1", "Host", "localhost", tc.header, "v1"); r.status != 200 {
				t.Errorf("GET %s with %s v1: %d %q, want 200", tc.path, tc.header, r.status, firstLine(r.body))
			}
			checkDenial(t, px, "GET "+tc.path+" with "+tc.header+" v1 again", get("127.0.4.13", "GET "+tc.path+" HTTP/1.1", "Host", "localhost", tc.header, "v1"), "rate-limited")
		}
		if got := s.backend.count("/ua") + s.backend.count("/accept"); got != 2 {
			t.Errorf("%d requests reached /ua and /accept, want 2", got)
		}

		// X-Forwarded-Proto is HAProxy's: one quota, whatever the client says.
		if r := get("127.0.4.14", "GET /proto HTTP/1.1", "Host", "localhost", "X-Forwarded-Proto", "a"); r.status != 200 {
			t.Errorf("GET /proto: %d, want 200", r.status)
		}
		checkDenial(t, px, "GET /proto with X-Forwarded-Proto b", get("127.0.4.14", "GET /proto HTTP/1.1", "Host", "localhost", "X-Forwarded-Proto", "b"), "rate-limited")
		checkDenial(t, px, "GET /proto with X_Forwarded_Proto c", get("127.0.4.14", "GET /proto HTTP/1.1", "Host", "localhost", "X_Forwarded_Proto", "c"), "rate-limited")

		// No Host: 400 before authlimit is asked.
		before := scrape(t, s.authlimit[0].addr).sum("authlimit_requests_total")
		for i := 0; i < 3; i++ {
			r := rawDo(t, "127.0.4.15", addr, "GET /nohost HTTP/1.0\r\n\r\n")
			if r.status != 400 {
				t.Errorf("HTTP/1.0 GET without Host, request %d: %d %q, want 400", i+1, r.status, firstLine(r.body))
			}
		}
		if got := s.backend.count("/nohost"); got != 0 {
			t.Errorf("%d requests without Host reached the backend", got)
		}
		if got := scrape(t, s.authlimit[0].addr).sum("authlimit_requests_total") - before; got != 0 {
			t.Errorf("authlimit was asked %v times about requests without Host, want 0", got)
		}
		// The host rule follows Host, whatever X-Forwarded-Host says.
		for i, want := range []int{200, 200, 429} {
			r := get("127.0.4.16", "GET /h HTTP/1.1", "Host", "api.example.com", "X-Forwarded-Host", fmt.Sprintf("r%d.example", i))
			if r.status != want {
				t.Errorf("GET /h on api.example.com with X-Forwarded-Host r%d.example: %d, want %d", i, r.status, want)
			}
		}
	})
}
