//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/authlimit/authlimit/front/spoa"
	"github.com/authlimit/authlimit/internal/redistest"
)

// The agent's own failure cases behind haproxy/haproxy.cfg and
// haproxy/spoe-authlimit.conf: an agent slower than timeout processing,
// one restarted, the connections HAProxy keeps, a flood of one client,
// what the message carries, HAProxy's health checks, and the Lua action
// and SPOE agreeing request for request.

// silentAgent stands in for an authlimit whose SPOE agent says hello and
// then never answers (stalled, or holding a shaped request too long). It
// counts the NOTIFY frames it got.
type silentAgent struct {
	addr     string
	notified atomic.Int64
}

func startSilentAgent(t *testing.T) *silentAgent {
	t.Helper()
	a := &silentAgent{}
	s, err := spoa.NewServer(spoa.Options{
		Handler: spoaHandler(func(_ []byte, _ spoa.Reply) { a.notified.Add(1) }),
		Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Close)
	a.addr = l.Addr().String()
	return a
}

type spoaHandler func([]byte, spoa.Reply)

func (f spoaHandler) Notify(b []byte, r spoa.Reply) { f(b, r) }

// TestHAProxySPOESlowAgent: an agent that does not answer costs a client
// spoe-authlimit.conf's timeout processing, then the documented fail
// behaviour: 503 with the problem body, or with proc.authlimit_unreachable
// "open" the backend's answer. HAProxy sent the request once.
func TestHAProxySPOESlowAgent(t *testing.T) {
	px := proxyNamed(t, "haproxy-spoe")
	for _, variant := range []string{"slow", "slow failopen"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			agent := startSilentAgent(t)
			b := startBackend(t)
			addr := px.start(t, agent.addr, b.addr, variant)
			before := agent.notified.Load()
			r := newClient("127.0.0.32").do(t, "GET", "http://"+addr+"/slow", nil)
			want := 503
			if strings.Contains(variant, "failopen") {
				want = 200
			}
			if r.status != want {
				t.Errorf("agent silent: %d %q, want %d", r.status, firstLine(r.body), want)
			}
			if want == 503 && (r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(r.body, `"type":"urn:authlimit:unreachable"`) || r.header.Get("Retry-After") != "1") {
				t.Errorf("agent silent: %v %q, want urn:authlimit:unreachable with Retry-After 1", r.header, r.body)
			}
			if got, wantN := b.count("/slow"), map[int]int{503: 0, 200: 1}[want]; got != wantN {
				t.Errorf("%d requests reached the backend, want %d", got, wantN)
			}
			if r.elapsed < slowTimeout || r.elapsed > slowTimeout+5*time.Second {
				t.Errorf("the answer took %v, want %v and a margin", r.elapsed, slowTimeout)
			}
			if got := agent.notified.Load() - before; got != 1 {
				t.Errorf("the agent was asked %d times, want once", got)
			}
		})
	}
}

// spoeStack is authlimit on Redis behind haproxy/haproxy.cfg, with the
// environment kept to start authlimit again.
type spoeStack struct {
	env     map[string]string
	a       *authlimit
	backend *backend
	addr    string
	haproxy *proc
}

func newSPOEStack(t *testing.T, rules, variant string, extra ...string) *spoeStack {
	t.Helper()
	proxyNamed(t, "haproxy-spoe") // fails the test without haproxy
	redis, err := redistest.Start(t, bins.redis)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"AUTHLIMIT_REDIS_URL":       redis.URL,
		"AUTHLIMIT_RULES":           rules,
		"AUTHLIMIT_TRUSTED_PROXIES": "127.0.0.1/32",
		"AUTHLIMIT_REDIS_TIMEOUT":   "200ms",
		"AUTHLIMIT_SPOA_LISTEN":     freeAddr(t),
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	s := &spoeStack{env: env, backend: startBackend(t)}
	s.a = startAuthlimit(t, "authlimit", env)
	s.addr, s.haproxy = runHAProxySPOE(t, s.a.spoa, s.backend.addr, variant)
	return s
}

func (s *spoeStack) url(path string) string { return "http://" + s.addr + path }

// TestHAProxySPOEAgentRestarted: while authlimit is down, requests get the
// fail behaviour; once it is back on the same address, HAProxy connects
// again by itself and the limit goes on from Redis where it was.
func TestHAProxySPOEAgentRestarted(t *testing.T) {
	s := newSPOEStack(t, "name=per-ip key=ip limit=6/1m", "")
	c := newClient("127.0.0.33")
	for i := 0; i < 3; i++ {
		if r := c.do(t, "GET", s.url("/restart"), nil); r.status != 200 {
			t.Fatalf("request %d before the restart: %d %q", i+1, r.status, firstLine(r.body))
		}
	}
	s.a.stop()
	if r := c.do(t, "GET", s.url("/restart"), nil); r.status != 503 || !strings.Contains(r.body, "urn:authlimit:unreachable") {
		t.Errorf("authlimit down: %d %q, want 503 unreachable", r.status, firstLine(r.body))
	}
	s.a = startAuthlimit(t, "authlimit-again", s.env)
	// HAProxy may have a connection to the old agent it still thinks open:
	// the first answer may be the fail behaviour, the next are authlimit's.
	deadline := time.Now().Add(10 * time.Second)
	admitted := 0
	for admitted < 3 {
		r := c.do(t, "GET", s.url("/restart"), nil)
		switch {
		case r.status == 200:
			admitted++
		case r.status == 503 && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("after the restart, %d admitted: %d %q", admitted, r.status, firstLine(r.body))
		}
	}
	r := c.do(t, "GET", s.url("/restart"), nil)
	if r.status != 429 || r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("the seventh request: %d, X-RateLimit-Remaining %q; want 429 (6 of 6 spent across the restart)", r.status, r.header.Get("X-RateLimit-Remaining"))
	}
	if got := s.backend.count("/restart"); got != 6 {
		t.Errorf("%d requests reached the backend, want 6", got)
	}
}

// TestHAProxySPOEReusesConnections: many clients at once cost at most a
// connection each to the agent (HAProxy 2.x opens about one per request in
// flight, 3.x up to 20 requests per connection), and a second round of
// them almost none: HAProxy keeps them.
func TestHAProxySPOEReusesConnections(t *testing.T) {
	const (
		clients = 16
		each    = 20
	)
	s := newSPOEStack(t, "name=per-ip key=ip limit=1000/1m", "")
	round := func() float64 {
		t.Helper()
		before := scrape(t, s.a.addr)
		var wg sync.WaitGroup
		errs := make(chan string, clients*each)
		for i := 0; i < clients; i++ {
			wg.Add(1)
			go func(c *client) {
				defer wg.Done()
				for j := 0; j < each; j++ {
					if r := c.do(t, "GET", s.url("/reuse"), nil); r.status != 200 {
						errs <- fmt.Sprintf("client %s: %d %q", c.ip, r.status, firstLine(r.body))
					}
				}
			}(newClient(fmt.Sprintf("127.0.5.%d", 10+i)))
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		after := scrape(t, s.a.addr)
		return after.sum("authlimit_spoa_connections_accepted_total") - before.sum("authlimit_spoa_connections_accepted_total")
	}
	first, second := round(), round()
	t.Logf("haproxy-spoe: %v then %v agent connections accepted for two rounds of %d requests from %d clients at once", first, second, clients*each, clients)
	// HAProxy 2.x opens about one connection per request in flight.
	if first > clients+2 {
		t.Errorf("first round: %v connections for %d requests, %d at a time: HAProxy does not reuse its connections to the agent", first, clients*each, clients)
	}
	if second > 2 {
		t.Errorf("second round: %v new connections, want at most 2: HAProxy did not keep its connections to the agent", second)
	}
	if got := s.backend.count("/reuse"); got != 2*clients*each {
		t.Errorf("%d requests reached the backend, want %d", got, 2*clients*each)
	}
	if m := scrape(t, s.a.addr); m.sum("authlimit_spoa_protocol_errors_total") != 0 {
		t.Errorf("protocol errors: %v", m.sum("authlimit_spoa_protocol_errors_total"))
	}
}

// TestHAProxySPOEFlood: one client far over its limit, on many
// connections as fast as it can, gets 429s and nothing else; the other
// clients meanwhile are admitted, none of them failed by a timeout, and
// the agent's connections stay few. HAProxy waits up to patientTimeout
// and authlimit up to 2s for Redis, so that only a starved agent, not a
// loaded machine, fails a request.
func TestHAProxySPOEFlood(t *testing.T) {
	s := newSPOEStack(t, "name=per-ip key=ip limit=5/1m", "patient", "AUTHLIMIT_REDIS_TIMEOUT", "2s")
	const flooders = 32
	stop := make(chan struct{})
	var floodWG sync.WaitGroup
	var sent, denied, other atomic.Int64
	for i := 0; i < flooders; i++ {
		floodWG.Add(1)
		go func() {
			defer floodWG.Done()
			c := newClient("127.0.0.34")
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := c.do(t, "GET", s.url("/flood"), nil)
				sent.Add(1)
				switch r.status {
				case 429:
					denied.Add(1)
				case 200:
				default:
					other.Add(1)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	failed := 0
	for i := 0; i < 40; i++ {
		c := newClient(fmt.Sprintf("127.0.6.%d", 10+i))
		if r := c.do(t, "GET", s.url("/other"), nil); r.status != 200 {
			failed++
			t.Errorf("client %s during the flood: %d %q", c.ip, r.status, firstLine(r.body))
		}
	}
	close(stop)
	floodWG.Wait()
	t.Logf("flood: %d requests, %d denied, %d other; 40 other clients, %d failed", sent.Load(), denied.Load(), other.Load(), failed)
	if got := s.backend.count("/flood"); got != 5 {
		t.Errorf("%d of the flood's requests reached the backend, want 5", got)
	}
	if other.Load() != 0 {
		t.Errorf("%d of the flood's requests got neither 200 nor 429 (a timeout, the fail behaviour)", other.Load())
	}
	m := scrape(t, s.a.addr)
	if n := m.sum("authlimit_spoa_connections_accepted_total"); n > flooders+8 {
		t.Errorf("%v agent connections for %d requests at %d at a time", n, sent.Load(), flooders)
	}
	if n := m.sum("authlimit_spoa_protocol_errors_total"); n != 0 {
		t.Errorf("%v protocol errors", n)
	}
}

// TestHAProxySPOETooLarge: a request too large for a frame (here of 4
// KiB) gets 431, fail open or not, reaches nothing, and the agent's
// connection goes on.
func TestHAProxySPOETooLarge(t *testing.T) {
	s := newSPOEStack(t, "name=per-ip key=ip limit=100/1m", "failopen smallframe")
	get := func(ip, line string, headers ...string) result {
		return rawDo(t, ip, s.addr, rawRequest(line, "", headers...))
	}
	if r := get("127.0.7.17", "GET /before HTTP/1.1", "Host", "localhost"); r.status != 200 {
		t.Fatalf("a small request: %d, want 200", r.status)
	}
	long := "/" + strings.Repeat("a", 2000)
	for i := 0; i < 3; i++ {
		r := get("127.0.7.17", "GET "+long+" HTTP/1.1", "Host", "localhost", "X-Pad", strings.Repeat("b", 2500))
		if r.status != 431 || !strings.Contains(r.body, "urn:authlimit:request-too-large") {
			t.Errorf("a request too large for a frame, with fail open: %d %q, want 431", r.status, firstLine(r.body))
		}
	}
	if got := s.backend.count(long); got != 0 {
		t.Errorf("%d requests too large for a frame reached the backend", got)
	}
	if r := get("127.0.7.17", "GET /after HTTP/1.1", "Host", "localhost"); r.status != 200 {
		t.Errorf("after the large requests: %d, want 200", r.status)
	}
	if m := scrape(t, s.a.addr); m.sum("authlimit_spoa_protocol_errors_total") != 0 || m.sum("authlimit_spoa_connections_accepted_total") > 2 {
		t.Errorf("protocol errors %v, connections %v: the large requests cost the agent its connections", m.sum("authlimit_spoa_protocol_errors_total"), m.sum("authlimit_spoa_connections_accepted_total"))
	}
}

// TestHAProxySPOELargestRequest: with the shipped files' frame size
// (tune.bufsize less 4), the largest request HAProxy takes fits in a frame:
// it is decided, several on one connection, none refused 431.
func TestHAProxySPOELargestRequest(t *testing.T) {
	s := newSPOEStack(t, "name=per-ip key=ip limit=100/1m; name=k key=header:X-Key limit=2/1m path=/large", "")
	pad := strings.Repeat("p", 7000)
	target := "/large?" + strings.Repeat("q", 7000)
	for i, want := range []int{200, 200, 429} {
		r := rawDo(t, "127.0.7.20", s.addr, rawRequest("GET "+target+" HTTP/1.1", "", "Host", "localhost", "X-Key", "k", "X-Pad", pad))
		if r.status != want {
			t.Errorf("request %d with 14 KB of target and headers: %d %q, want %d", i+1, r.status, firstLine(r.body), want)
		}
	}
	m := scrape(t, s.a.addr)
	if m.sum("authlimit_spoa_protocol_errors_total") != 0 || m[`authlimit_requests_total{front="spoa",result="denied"}`] != 1 {
		t.Errorf("protocol errors %v, denials %v; want 0 and 1", m.sum("authlimit_spoa_protocol_errors_total"), m[`authlimit_requests_total{front="spoa",result="denied"}`])
	}
}

// TestHAProxySPOEHealthCheck: HAProxy's health check of the agent (option
// spop-check) gets the agent's hello: the server is up while authlimit is,
// down once it stops, and up again once it is back.
func TestHAProxySPOEHealthCheck(t *testing.T) {
	s := newSPOEStack(t, "name=per-ip key=ip limit=100/1m", "check")
	haproxyLog := func() string {
		b, _ := os.ReadFile(s.haproxy.log)
		return string(b)
	}
	// Up from the start: no DOWN after a few checks.
	time.Sleep(time.Second)
	if strings.Contains(haproxyLog(), "authlimit-agents/authlimit is DOWN") {
		t.Fatalf("the agent failed HAProxy's health check while up:\n%s", haproxyLog())
	}
	before := scrape(t, s.a.addr).sum("authlimit_spoa_connections_accepted_total")
	if before < 3 {
		t.Errorf("%v agent connections after a second of checks every 200ms: HAProxy does not check the agent", before)
	}
	s.a.stop()
	waitLog(t, haproxyLog, "authlimit-agents/authlimit is DOWN")
	s.a = startAuthlimit(t, "authlimit-again", s.env)
	waitLog(t, haproxyLog, "authlimit-agents/authlimit is UP")
	if r := newClient("127.0.0.35").do(t, "GET", s.url("/checked"), nil); r.status != 200 {
		t.Errorf("with the agent back up: %d %q", r.status, firstLine(r.body))
	}
}

func waitLog(t *testing.T, log func() string, line string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log(), line) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in HAProxy's log after 10s:\n%s", line, log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHAProxySPOEAgreesWithLua: the same requests, in the same order, to
// HAProxy with the Lua action and to HAProxy with SPOE, each with its own
// authlimit and Redis: the same status, rate-limit headers and problem
// type, request after request.
func TestHAProxySPOEAgreesWithLua(t *testing.T) {
	const rules = `
name=per-ip key=ip limit=30/1m
name=login key=ip limit=2/1m path=/login method=POST
name=api key=header:X-Api-Key limit=3/1m path=/api
name=cost key=ip limit=10/1m cost=header:X-Cost path=/cost
name=upload key=ip limit=12000/1h cost=header:X-Original-Content-Length cost_missing=deny method=POST path=/upload
name=hosted key=ip limit=2/1m host=api.example.com path=/h
name=del key=ip limit=1/1m method=DELETE path=/del`
	lua := newStack(t, proxyNamed(t, "haproxy"), rules, "")
	spoe := newStack(t, proxyNamed(t, "haproxy-spoe"), rules, "")
	type req struct {
		ip, line, body string
		headers        []string
	}
	h := func(extra ...string) []string { return append([]string{"Host", "localhost"}, extra...) }
	spoof := h("X-Forwarded-For", "198.51.100.9", "X-Real-IP", "198.51.100.9", "X-Forwarded-Uri", "/public", "X-Forwarded-Method", "GET", "X_Forwarded_For", "198.51.100.10")
	var corpus []req
	for _, p := range []string{"/login", "/login", "/LOGIN", "/x/../login", "/log%69n", "/login;jsessionid=1", "//login"} {
		corpus = append(corpus, req{"127.0.8.1", "POST " + p + " HTTP/1.1", "u=1", append(spoof, "Content-Length", "3")})
	}
	for _, k := range [][]string{{"X-Api-Key", "k1"}, {"X-Api-Key", "k1"}, {"X-Api-Key", "k1", "X-Api-Key", "k2"}, {"X_Api_Key", "k1"}, {"x-api-key", "k1"}, {"X-Api-Key", "k3", "X_Api_Key", "k4"}, {"User-Agent", "a", "User-Agent", "b", "X-Api-Key", "k5"}} {
		corpus = append(corpus, req{"127.0.8.2", "GET /api HTTP/1.1", "", h(k...)})
	}
	for _, c := range [][]string{{"X-Cost", "4"}, {"X-Cost", "4", "X-Cost", "1"}, {"X-Cost", "6"}, {"X-Cost", "1"}, {"X-Cost", "x"}, {"X_Cost", "11"}} {
		corpus = append(corpus, req{"127.0.8.3", "GET /cost HTTP/1.1", "", h(c...)})
	}
	for i := 0; i < 3; i++ {
		corpus = append(corpus, req{"127.0.8.4", "POST /upload HTTP/1.1", strings.Repeat("b", 5000), h("Content-Length", "5000", "X-Original-Content-Length", "1")})
	}
	corpus = append(corpus,
		req{"127.0.8.5", "POST /upload HTTP/1.1", "5\r\nabcde\r\n0\r\n\r\n", h("Transfer-Encoding", "chunked")},
		req{"127.0.8.5", "POST /del HTTP/1.1", "", h("X-HTTP-Method-Override", "DELETE", "Content-Length", "0")},
		req{"127.0.8.5", "DELETE /del HTTP/1.1", "", h()},
		req{"127.0.8.6", "GET /h HTTP/1.1", "", []string{"Host", "API.example.com:80", "X-Forwarded-Host", "a.example"}},
		req{"127.0.8.6", "GET /h HTTP/1.1", "", []string{"Host", "api.example.com.", "X-Forwarded-Host", "b.example"}},
		req{"127.0.8.6", "GET /h HTTP/1.1", "", []string{"Host", "api.example.com"}},
		req{"127.0.8.6", "GET http://api.example.com/h HTTP/1.1", "", []string{"Host", "api.example.com"}},
		req{"127.0.8.7", "OPTIONS * HTTP/1.1", "", h()},
	)
	for i, r := range corpus {
		raw := rawRequest(r.line, r.body, r.headers...)
		a, b := rawDo(t, r.ip, lua.proxy[0], raw), rawDo(t, r.ip, spoe.proxy[0], raw)
		if d := agree(a, b); d != "" {
			t.Errorf("request %d, %q from %s with %q: %s\n Lua:  %d %v %q\n SPOE: %d %v %q", i+1, r.line, r.ip, r.headers, d, a.status, a.header, firstLine(a.body), b.status, b.header, firstLine(b.body))
		}
	}
	for _, p := range []string{"/login", "/api", "/cost", "/upload", "/del", "/h"} {
		if a, b := lua.backend.count(p), spoe.backend.count(p); a != b {
			t.Errorf("%s: %d requests reached the backend behind the Lua action, %d behind SPOE", p, a, b)
		}
	}
}

// agree says how two answers to one request differ in what authlimit
// decides, or "".
func agree(a, b result) string {
	if a.status != b.status {
		return "status"
	}
	for _, h := range []string{"RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining"} {
		if a.header.Get(h) != b.header.Get(h) {
			return h
		}
	}
	if (a.header.Get("Retry-After") == "") != (b.header.Get("Retry-After") == "") {
		return "Retry-After"
	}
	if problemOf(a.body) != problemOf(b.body) {
		return "the problem type"
	}
	return ""
}

func problemOf(body string) string {
	if m := problemType.FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}
