package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/authlimit/authlimit/internal/redistest"
)

// testApp is authlimit built from an environment exactly as main builds it,
// served over an in-memory listener.
type testApp struct {
	ln     *fasthttputil.InmemoryListener
	client *fasthttp.Client
	logs   *syncBuffer
	app    *app
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startApp(t *testing.T, environ map[string]string) *testApp {
	t.Helper()
	s, err := loadConfig(environ)
	if err != nil {
		t.Fatalf("loadConfig(%v): %v", environ, err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, err := newApp(context.Background(), s, log)
	if err != nil {
		t.Fatalf("newApp: %v", err)
	}
	ln := fasthttputil.NewInmemoryListener()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- a.serve(ctx, a.listener(ln, s), 5*time.Second)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		a.close()
		if t.Failed() {
			t.Logf("authlimit logs:\n%s", logs.String())
		}
	})
	return &testApp{
		app:    a,
		ln:     ln,
		logs:   logs,
		client: &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }, ReadTimeout: 10 * time.Second, DisableHeaderNamesNormalizing: true},
	}
}

// request is an auth subrequest as a proxy would send it.
type request struct {
	method  string // of the subrequest itself; default GET
	path    string // default /auth
	headers [][2]string
	body    string
	peer    string // the TCP peer's address; default loopback
}

func authFrom(ip string, more ...string) request {
	r := request{headers: [][2]string{{"X-Forwarded-For", ip}}}
	for i := 0; i+1 < len(more); i += 2 {
		r.headers = append(r.headers, [2]string{more[i], more[i+1]})
	}
	return r
}

type response struct {
	status  int
	headers map[string]string
	body    string
	elapsed time.Duration
}

func (a *testApp) do(t *testing.T, r request) response {
	t.Helper()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if r.path == "" {
		r.path = "/auth"
	}
	if r.method == "" {
		r.method = "GET"
	}
	req.SetRequestURI("http://authlimit" + r.path)
	req.Header.SetMethod(r.method)
	req.Header.DisableNormalizing()
	for _, h := range r.headers {
		req.Header.Add(h[0], h[1])
	}
	if r.body != "" {
		req.SetBodyString(r.body)
	}
	c := a.client
	if r.peer != "" {
		addr := &net.TCPAddr{IP: net.ParseIP(r.peer), Port: 40000}
		c = &fasthttp.Client{Dial: func(string) (net.Conn, error) { return a.ln.DialWithLocalAddr(addr) }, DisableHeaderNamesNormalizing: true}
	}
	start := time.Now()
	if err := c.Do(req, resp); err != nil {
		t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	out := response{status: resp.StatusCode(), headers: map[string]string{}, body: string(resp.Body()), elapsed: time.Since(start)}
	for k, v := range resp.Header.All() {
		out.headers[string(k)] = string(v)
	}
	return out
}

func (r response) header(name string) string {
	for k, v := range r.headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

type problem struct {
	Type     string   `json:"type"`
	Title    string   `json:"title"`
	Status   int      `json:"status"`
	Detail   string   `json:"detail"`
	Violated []string `json:"violated-policies"`
}

func (r response) problem(t *testing.T) problem {
	t.Helper()
	if ct := r.header("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json (body %q)", ct, r.body)
	}
	var p problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != r.status {
		t.Errorf("problem status %d, response status %d", p.Status, r.status)
	}
	return p
}

// stores runs a test against the memory store and against a real Redis.
func stores(t *testing.T, f func(t *testing.T, env map[string]string)) {
	t.Run("memory", func(t *testing.T) { f(t, map[string]string{}) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.New(t)
		f(t, map[string]string{"AUTHLIMIT_REDIS_URL": srv.URL, "AUTHLIMIT_KEY_PREFIX": srv.Prefix(t), "AUTHLIMIT_REDIS_TIMEOUT": "1s"})
	})
}

func with(env map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func wantStatus(t *testing.T, r response, want int, what string) {
	t.Helper()
	if r.status != want {
		t.Fatalf("%s: status %d, want %d (headers %v, body %q)", what, r.status, want, r.headers, r.body)
	}
}

func TestLimitHoldsWithHeaders(t *testing.T) {
	stores(t, func(t *testing.T, env map[string]string) {
		app := startApp(t, with(env, "AUTHLIMIT_RULES", "name=per-ip key=ip limit=3/1m algorithm=fixed_window"))
		for i := 0; i < 3; i++ {
			r := app.do(t, authFrom("203.0.113.7"))
			wantStatus(t, r, 200, fmt.Sprintf("request %d", i+1))
			if r.body != "" {
				t.Errorf("allowed body = %q, want empty", r.body)
			}
			checks := map[string]string{
				"X-RateLimit-Limit":     "3",
				"X-RateLimit-Remaining": strconv.Itoa(2 - i),
				"RateLimit-Policy":      `"per-ip";q=3;w=60`,
			}
			for h, want := range checks {
				if _, ok := r.headers[h]; !ok {
					t.Errorf("request %d: header %s missing or miscased (have %v)", i+1, h, r.headers)
				}
				if got := r.header(h); got != want {
					t.Errorf("request %d: %s = %q, want %q", i+1, h, got, want)
				}
			}
			if got := r.header("RateLimit"); !strings.HasPrefix(got, fmt.Sprintf(`"per-ip";r=%d;t=`, 2-i)) {
				t.Errorf("request %d: RateLimit = %q", i+1, got)
			}
			reset, err := strconv.ParseInt(r.header("X-RateLimit-Reset"), 10, 64)
			if now := time.Now().Unix(); err != nil || reset < now || reset > now+61 {
				t.Errorf("request %d: X-RateLimit-Reset = %q, want a Unix time within the next minute", i+1, r.header("X-RateLimit-Reset"))
			}
		}
		r := app.do(t, authFrom("203.0.113.7"))
		wantStatus(t, r, 429, "request 4")
		retry, err := strconv.Atoi(r.header("Retry-After"))
		if err != nil || retry < 1 || retry > 60 {
			t.Errorf("Retry-After = %q, want 1..60 seconds", r.header("Retry-After"))
		}
		if r.header("X-RateLimit-Remaining") != "0" || r.header("RateLimit-Policy") == "" {
			t.Errorf("denied headers = %v", r.headers)
		}
		if p := r.problem(t); len(p.Violated) != 1 || p.Violated[0] != "per-ip" || p.Title != "Too Many Requests" {
			t.Errorf("problem = %+v, want per-ip violated", p)
		}
		// Another client has its own quota.
		wantStatus(t, app.do(t, authFrom("203.0.113.8")), 200, "another client")
	})
}

func TestDenyStatusForNginx(t *testing.T) {
	app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=a limit=1/1m", "AUTHLIMIT_DENY_STATUS": "403"})
	wantStatus(t, app.do(t, authFrom("203.0.113.7")), 200, "first")
	r := app.do(t, authFrom("203.0.113.7"))
	wantStatus(t, r, 403, "second")
	if r.header("Retry-After") == "" || r.header("X-RateLimit-Remaining") != "0" {
		t.Errorf("403 denial lacks headers: %v", r.headers)
	}
}

// TestDefaultRule is what README's quick start shows: make run, then curl.
func TestDefaultRule(t *testing.T) {
	app := startApp(t, map[string]string{})
	var last response
	allowed := 0
	for i := 0; i < 150 && last.status != 429; i++ {
		last = app.do(t, authFrom("203.0.113.7"))
		if last.status == 200 {
			allowed++
		}
	}
	if allowed != 100 || last.status != 429 || last.header("Retry-After") == "" {
		t.Errorf("default rule admitted %d then %d (Retry-After %q), want 100 then 429", allowed, last.status, last.header("Retry-After"))
	}
	if !strings.Contains(app.logs.String(), "default rule") {
		t.Errorf("start-up log does not mention the default rule:\n%s", app.logs.String())
	}
}

// TestClientCannotChooseItsKey: through a trusted proxy, the key is the
// address that proxy saw; whatever the client puts left of it, or in
// X-Real-IP, changes nothing. An untrusted peer is its own key.
func TestClientCannotChooseItsKey(t *testing.T) {
	stores(t, func(t *testing.T, env map[string]string) {
		app := startApp(t, with(env, "AUTHLIMIT_RULES", "name=per-ip limit=2/1m"))
		spoofs := []request{
			authFrom("203.0.113.7"),
			authFrom("1.2.3.4, 203.0.113.7"),
			authFrom("5.6.7.8, 203.0.113.7", "X-Real-IP", "9.9.9.9"),
		}
		wantStatus(t, app.do(t, spoofs[0]), 200, "first")
		wantStatus(t, app.do(t, spoofs[1]), 200, "second")
		wantStatus(t, app.do(t, spoofs[2]), 429, "third with a spoofed left-most entry")

		untrusted := authFrom("203.0.113.99")
		untrusted.peer = "198.51.100.9"
		wantStatus(t, app.do(t, untrusted), 200, "untrusted peer, first")
		untrusted.headers = [][2]string{{"X-Forwarded-For", "203.0.113.100"}}
		wantStatus(t, app.do(t, untrusted), 200, "untrusted peer, second")
		untrusted.headers = [][2]string{{"X-Real-IP", "203.0.113.101"}}
		wantStatus(t, app.do(t, untrusted), 429, "untrusted peer, third: its headers are not believed")
	})
}

func TestPathAndMethodRules(t *testing.T) {
	stores(t, func(t *testing.T, env map[string]string) {
		app := startApp(t, with(env, "AUTHLIMIT_RULES", "name=per-ip limit=100/1m; name=login limit=2/1m path=/login method=POST"))
		login := func(uri, method string) request {
			return authFrom("203.0.113.7", "X-Forwarded-Uri", uri, "X-Forwarded-Method", method)
		}
		for i, uri := range []string{"/login", "//login?next=/", "/x/../log%69n"} {
			r := app.do(t, login(uri, "post"))
			if i < 2 {
				wantStatus(t, r, 200, uri)
				continue
			}
			wantStatus(t, r, 429, uri+": another spelling of /login")
			if p := r.problem(t); len(p.Violated) != 1 || p.Violated[0] != "login" {
				t.Errorf("violated = %v, want [login]", p.Violated)
			}
		}
		for _, other := range []request{login("/logins", "POST"), login("/login", "GET"), login("/api", "POST")} {
			r := app.do(t, other)
			wantStatus(t, r, 200, "a request the login rule does not cover")
			if got := r.header("RateLimit-Policy"); got != `"per-ip";q=100;w=60` {
				t.Errorf("RateLimit-Policy = %q, want only per-ip", got)
			}
		}
		// The auth request's own query string is no configuration
		// (Caddy appends the client's query to it).
		r := app.do(t, request{path: "/auth?rules=none&key=x", headers: login("/login", "POST").headers})
		wantStatus(t, r, 429, "query string on the auth request")
	})
}

// TestSMSCase: 1/min + 5/h + 10/day on one phone number, all-or-nothing.
func TestSMSCase(t *testing.T) {
	stores(t, func(t *testing.T, env map[string]string) {
		rules := "name=sms-minute key=header:X-Phone limit=1/1m algorithm=sliding_window_log on_missing=deny path=/sms;" +
			"name=sms-hour key=header:X-Phone limit=5/1h algorithm=sliding_window_log path=/sms;" +
			"name=sms-day key=header:X-Phone limit=10/24h algorithm=sliding_window_log path=/sms"
		app := startApp(t, with(env, "AUTHLIMIT_RULES", rules))
		sms := func(phone string) request {
			return authFrom("203.0.113.7", "X-Forwarded-Uri", "/sms", "X-Phone", phone)
		}
		r := app.do(t, sms("+15550001"))
		wantStatus(t, r, 200, "first SMS")
		if got := r.header("RateLimit-Policy"); got != `"sms-minute";q=1;w=60, "sms-hour";q=5;w=3600, "sms-day";q=10;w=86400` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
		if got := r.header("RateLimit"); !strings.HasPrefix(got, `"sms-minute";r=0;`) {
			t.Errorf("RateLimit = %q, want the minute rule (0 remaining)", got)
		}
		r = app.do(t, sms("+15550001"))
		wantStatus(t, r, 429, "second SMS within a minute")
		if p := r.problem(t); strings.Join(p.Violated, ",") != "sms-minute" {
			t.Errorf("violated = %v, want [sms-minute]", p.Violated)
		}
		if retry, _ := strconv.Atoi(r.header("Retry-After")); retry < 55 || retry > 60 {
			t.Errorf("Retry-After = %q, want about 60", r.header("Retry-After"))
		}
		wantStatus(t, app.do(t, sms("+15550002")), 200, "another phone")
		r = app.do(t, authFrom("203.0.113.7", "X-Forwarded-Uri", "/sms"))
		wantStatus(t, r, 429, "no phone number with on_missing=deny")
		if p := r.problem(t); p.Type != "urn:authlimit:missing-key" || !strings.Contains(p.Detail, "X-Phone") {
			t.Errorf("problem = %+v", p)
		}
	})
}

func TestAllowAndBlockLists(t *testing.T) {
	app := startApp(t, map[string]string{
		"AUTHLIMIT_RULES":       "name=a limit=1/1m",
		"AUTHLIMIT_ALLOW_CIDRS": "203.0.113.0/24",
		"AUTHLIMIT_BLOCK_CIDRS": "198.51.100.0/24, 2001:db8::1",
	})
	for i := 0; i < 3; i++ {
		r := app.do(t, authFrom("203.0.113.50"))
		wantStatus(t, r, 200, "allow-listed")
		if len(r.header("X-RateLimit-Limit")) > 0 {
			t.Errorf("allow-listed answer has rate-limit headers: %v", r.headers)
		}
	}
	for _, ip := range []string{"198.51.100.7", "2001:db8::1"} {
		r := app.do(t, authFrom(ip))
		wantStatus(t, r, 429, "block-listed "+ip)
		if p := r.problem(t); p.Type != "urn:authlimit:blocked" {
			t.Errorf("problem type = %q", p.Type)
		}
	}
}

func TestUnmatchedAndMissingKeys(t *testing.T) {
	app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=api key=header:X-Api-Key limit=1/1m path=/api"})
	r := app.do(t, authFrom("203.0.113.7", "X-Forwarded-Uri", "/other"))
	wantStatus(t, r, 200, "no rule applies")
	if r.header("RateLimit-Policy") != "" {
		t.Errorf("unmatched answer has headers: %v", r.headers)
	}
	// on_missing=skip (the default): no key, no rule.
	for i := 0; i < 3; i++ {
		wantStatus(t, app.do(t, authFrom("203.0.113.7", "X-Forwarded-Uri", "/api", "X-Api-Key", "")), 200, "empty API key")
	}
	wantStatus(t, app.do(t, authFrom("203.0.113.7", "X-Forwarded-Uri", "/api", "X-Api-Key", "k1")), 200, "k1 first")
	wantStatus(t, app.do(t, authFrom("203.0.113.8", "X-Forwarded-Uri", "/api", "X-Api-Key", "k1")), 429, "k1 from another IP")
	// A client repeating the header gets no quota: not k1's, not one of
	// its own.
	for _, second := range []string{"k2", "r123", "", "k1"} {
		r = app.do(t, request{headers: [][2]string{{"X-Forwarded-For", "203.0.113.9"}, {"X-Forwarded-Uri", "/api"}, {"X-Api-Key", "k1"}, {"X-Api-Key", second}}})
		wantStatus(t, r, 429, "repeated header")
		if p := r.problem(t); p.Type != "urn:authlimit:repeated-header" || !strings.Contains(p.Detail, "X-Api-Key") {
			t.Errorf("repeated header: problem %+v", p)
		}
	}
}

func TestCostHeader(t *testing.T) {
	stores(t, func(t *testing.T, env map[string]string) {
		app := startApp(t, with(env, "AUTHLIMIT_RULES", "name=bytes key=ip limit=10/1m algorithm=token_bucket cost=header:X-Cost"))
		r := app.do(t, authFrom("203.0.113.7", "X-Cost", "4"))
		wantStatus(t, r, 200, "cost 4")
		if r.header("X-RateLimit-Remaining") != "6" {
			t.Errorf("after cost 4: Remaining = %q, want 6", r.header("X-RateLimit-Remaining"))
		}
		r = app.do(t, authFrom("203.0.113.7"))
		wantStatus(t, r, 200, "no cost header: cost 1")
		if r.header("X-RateLimit-Remaining") != "5" {
			t.Errorf("after cost 1: Remaining = %q, want 5", r.header("X-RateLimit-Remaining"))
		}
		// An empty body costs nothing: the rule counts nothing and
		// leaves the request to the others (here, none).
		r = app.do(t, authFrom("203.0.113.7", "X-Cost", "0"))
		wantStatus(t, r, 200, "cost 0")
		if r.header("X-RateLimit-Remaining") != "" {
			t.Errorf("cost 0 answered with the rule's headers: %v", r.headers)
		}
		for _, bad := range []string{"abc", "-3", "+3", "1.5", "99999999999999999999", "4 4", "\xff"} {
			r := app.do(t, authFrom("203.0.113.7", "X-Cost", bad))
			wantStatus(t, r, 429, fmt.Sprintf("cost %q", bad))
			if p := r.problem(t); p.Type != "urn:authlimit:invalid-cost" {
				t.Errorf("cost %q: problem type %q", bad, p.Type)
			}
		}
		r = app.do(t, authFrom("203.0.113.7", "X-Cost", "11"))
		wantStatus(t, r, 429, "cost above the burst")
		if p := r.problem(t); p.Type != "urn:authlimit:cost-too-high" || r.header("Retry-After") != "" {
			t.Errorf("cost 11: problem %+v, Retry-After %q; want cost-too-high and no Retry-After", p, r.header("Retry-After"))
		}
		r = app.do(t, authFrom("203.0.113.7", "X-Cost", "6"))
		wantStatus(t, r, 429, "cost 6 with 5 left")
		if r.header("Retry-After") == "" {
			t.Error("a denial that waiting cures has no Retry-After")
		}
		wantStatus(t, app.do(t, authFrom("203.0.113.7", "X-Cost", "5")), 200, "cost 5 with 5 left")
	})
}

func TestShadowModeNeverDenies(t *testing.T) {
	app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=a limit=1/1m", "AUTHLIMIT_SHADOW": "true"})
	for i := 0; i < 5; i++ {
		wantStatus(t, app.do(t, authFrom("203.0.113.7")), 200, "shadow")
	}
	m := app.do(t, request{path: "/metrics"})
	if !strings.Contains(m.body, `authlimit_decisions_total{outcome="shadow_denied",rule="a"} 4`) {
		t.Errorf("metrics do not count 4 shadow denials:\n%s", grep(m.body, "authlimit_decisions_total"))
	}
}

func TestShapingHoldsTheAnswer(t *testing.T) {
	app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=smooth key=global limit=2/1s algorithm=leaky_bucket burst=1 delay=2s"})
	first := app.do(t, authFrom("203.0.113.7"))
	wantStatus(t, first, 200, "first")
	second := app.do(t, authFrom("203.0.113.8"))
	wantStatus(t, second, 200, "second, shaped")
	if second.elapsed < 300*time.Millisecond {
		t.Errorf("second answer came after %v, want it held about 500ms", second.elapsed)
	}
}

func TestBadInputHasDefinedOutcomes(t *testing.T) {
	app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=a key=ip+header:X-Api-Key limit=2/1m", "AUTHLIMIT_MAX_HEADER_BYTES": "8192"})
	tests := []struct {
		name string
		req  request
		want int
	}{
		{"a huge X-Forwarded-For", authFrom(strings.Repeat("10.1.2.3, ", 600)+"203.0.113.7", "X-Api-Key", "k"), 200},
		{"garbage X-Forwarded-For", authFrom("<script>, ;;; ,", "X-Api-Key", "k"), 200},
		{"a non-UTF-8 key", authFrom("203.0.113.7", "X-Api-Key", "\xff\xfe\xfd"), 200},
		{"a long key", authFrom("203.0.113.7", "X-Api-Key", strings.Repeat("k", 6000)), 200},
		{"a body", request{method: "POST", body: strings.Repeat("b", 10000), headers: [][2]string{{"X-Api-Key", "k"}}}, 200},
		{"headers beyond AUTHLIMIT_MAX_HEADER_BYTES", authFrom("203.0.113.7", "X-Api-Key", strings.Repeat("k", 9000)), 431},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantStatus(t, app.do(t, tc.req), tc.want, tc.name)
		})
	}
	// A body beyond 64 KiB is refused from its Content-Length, before
	// authlimit would wait for it.
	if got := app.raw(t, "POST /auth HTTP/1.1\r\nHost: a\r\nContent-Length: 70000\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 413 ") {
		t.Errorf("a 70000-byte body: %q, want 413", got)
	}
	if got := app.raw(t, "BROKEN\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 400 ") {
		t.Errorf("a malformed request: %q, want 400", got)
	}
}

// raw writes bytes on a new connection and returns the first response line.
func (a *testApp) raw(t *testing.T, data string) string {
	t.Helper()
	c, err := a.ln.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, data); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", data, err)
	}
	return line
}

func TestEndpoints(t *testing.T) {
	stores(t, func(t *testing.T, env map[string]string) {
		app := startApp(t, env)
		wantStatus(t, app.do(t, request{path: "/healthz"}), 200, "/healthz")
		if r := app.do(t, request{path: "/readyz"}); r.status != 200 || !strings.HasPrefix(r.body, "ready") {
			t.Errorf("/readyz = %d %q", r.status, r.body)
		}
		wantStatus(t, app.do(t, request{path: "/nope"}), 404, "/nope")
		app.do(t, authFrom("203.0.113.7"))
		m := app.do(t, request{path: "/metrics"})
		wantStatus(t, m, 200, "/metrics")
		for _, want := range []string{
			`authlimit_requests_total{front="http",result="allowed"} 1`,
			`authlimit_request_duration_seconds_count{front="http"} 1`,
			`authlimit_decisions_total{outcome="allowed",rule="default"} 1`,
			`authlimit_build_info{goversion="` + runtime.Version() + `",revision="`,
			`",version="dev"} 1`,
			`authlimit_store_duration_seconds_count{store="primary"} 1`,
			"go_goroutines",
		} {
			if !strings.Contains(m.body, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
	})
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestRunCheckAndVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-version"}, nil, &out, &errOut)
	if err != nil || !strings.HasPrefix(out.String(), "authlimit ") {
		t.Errorf("-version: %v, %q", err, out.String())
	}

	out.Reset()
	err = run(context.Background(), []string{"-check"}, []string{"AUTHLIMIT_RULES=name=login key=ip limit=5/1m path=/login", "AUTHLIMIT_FAIL_MODE=open", "PATH=/bin"}, &out, &errOut)
	if err != nil {
		t.Fatalf("-check with a valid environment: %v", err)
	}
	for _, want := range []string{"store            memory", "name=login key=ip limit=5/1m", "trusted proxies  127.0.0.0/8", "fail mode        open"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-check output lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	err = run(context.Background(), []string{"-check"}, []string{
		"AUTHLIMIT_RULES=name=login key=ip limit=5/x",
		"AUTHLIMIT_DENY_STATUS=abc",
		"AUTHLIMIT_FAIL_MODE=sideways",
		"AUTHLIMIT_TRUSTED_PROXIES=10.0.0.0/33",
		"AUTHLIMIT_REDIS_MODE=cluster",
		"AUTHLIMIT_LISTN=:9090",
	}, &out, &errOut)
	var u usageError
	if err == nil || !errorsAs(err, &u) {
		t.Fatalf("-check with a bad environment = %v, want a usage error (exit 2)", err)
	}
	for _, want := range []string{
		`AUTHLIMIT_RULES: rule 1 "login": limit "5/x": unknown unit "x"`,
		`AUTHLIMIT_DENY_STATUS: "abc" is not a whole number`,
		`AUTHLIMIT_FAIL_MODE: unknown fail mode "sideways"`,
		`AUTHLIMIT_TRUSTED_PROXIES: "10.0.0.0/33" is not a CIDR`,
		`AUTHLIMIT_REDIS_URL: not set, but other AUTHLIMIT_REDIS_* variables are`,
		`AUTHLIMIT_LISTN: unknown variable (did you mean AUTHLIMIT_LISTEN?)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("-check error does not say %q:\n%v", want, err)
		}
	}

	err = run(context.Background(), []string{"-nope"}, nil, io.Discard, io.Discard)
	if !errorsAs(err, &u) {
		t.Errorf("unknown flag = %v, want a usage error", err)
	}
}

func errorsAs(err error, target *usageError) bool {
	u, ok := err.(usageError)
	if ok {
		*target = u
	}
	return ok
}

// TestHealthcheckFlag runs authlimit for real on a loopback port and asks it
// with -healthcheck, as the container's health check does.
func TestHealthcheckFlag(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	environ := []string{"AUTHLIMIT_LISTEN=127.0.0.1:" + strconv.Itoa(port)}
	if err := run(context.Background(), []string{"-healthcheck"}, environ, io.Discard, io.Discard); err == nil {
		t.Fatal("-healthcheck succeeded with nothing listening")
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- run(ctx, nil, environ, io.Discard, io.Discard) }()
	deadline := time.Now().Add(10 * time.Second)
	for run(context.Background(), []string{"-healthcheck"}, environ, io.Discard, io.Discard) != nil {
		if time.Now().After(deadline) {
			t.Fatal("-healthcheck never succeeded against a running authlimit")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("run after shutdown: %v", err)
	}
}
