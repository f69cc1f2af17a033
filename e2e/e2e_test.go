//go:build e2e

package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
)

// stack is one deployment: a Redis, a backend, and per replica an authlimit
// with a proxy in front of it.
type stack struct {
	redis     *redistest.Server
	backend   *backend
	authlimit []*authlimit
	proxy     []string // proxy addresses, one per replica
}

// newStack starts len(replicas) authlimits, each with the shared settings,
// the rules and its replica's extra variables, and one proxy in front of
// each, all on one Redis and one backend.
func newStack(t *testing.T, px proxy, rules, variant string, replicas ...map[string]string) *stack {
	t.Helper()
	if len(replicas) == 0 {
		replicas = []map[string]string{nil}
	}
	redis, err := redistest.Start(t, bins.redis)
	if err != nil {
		t.Fatal(err)
	}
	s := &stack{redis: redis, backend: startBackend(t)}
	for i, extra := range replicas {
		env := map[string]string{
			"AUTHLIMIT_REDIS_URL":       redis.URL,
			"AUTHLIMIT_RULES":           rules,
			"AUTHLIMIT_TRUSTED_PROXIES": "127.0.0.1/32", // the proxy; clients come from other loopback addresses
			"AUTHLIMIT_REDIS_TIMEOUT":   "200ms",
		}
		if px.denyStatus != "" {
			env["AUTHLIMIT_DENY_STATUS"] = px.denyStatus
		}
		switch {
		case px.unix:
			env["AUTHLIMIT_SPOA_LISTEN"] = "unix:" + filepath.Join(socketDir(t), fmt.Sprintf("spoa-%d.sock", i))
		case px.spoe:
			env["AUTHLIMIT_SPOA_LISTEN"] = freeAddr(t)
		}
		for k, v := range extra {
			env[k] = v
		}
		a := startAuthlimit(t, fmt.Sprintf("authlimit-%d", i), env)
		if path, ok := strings.CutPrefix(a.spoa, "unix:"); ok {
			if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
				t.Fatalf("%s: AUTHLIMIT_SPOA_LISTEN=%s, but %v, %v there", px.name, a.spoa, fi, err)
			}
		}
		s.authlimit = append(s.authlimit, a)
		s.proxy = append(s.proxy, px.start(t, a.target(px), s.backend.addr, variant))
	}
	return s
}

func (s *stack) url(replica int, path string) string {
	return "http://" + s.proxy[replica] + path
}

// TestProxies runs every scenario behind every proxy. A proxy that cannot
// be had fails its tests, saying how to get it.
func TestProxies(t *testing.T) {
	scenarios := []struct {
		name string
		run  func(t *testing.T, px proxy)
	}{
		{"limit holds", limitHolds},
		{"one limit across replicas", replicasShare},
		{"no spoofing", noSpoofing},
		{"bodies pass", bodiesPass},
		{"per-route rules", perRoute},
		{"no rule applies", unmatched},
		{"authlimit down", authlimitDown},
		{"redis down", redisDown},
	}
	for _, px := range proxies {
		t.Run(px.name, func(t *testing.T) {
			t.Parallel()
			if err := bins.missing[px.name]; err != nil {
				t.Fatalf("%s is not available: %v", px.name, err)
			}
			for _, sc := range scenarios {
				if px.scenarios != nil && !slices.Contains(px.scenarios, sc.name) {
					continue
				}
				t.Run(sc.name, func(t *testing.T) { sc.run(t, px) })
			}
		})
	}
}

var rateHeaders = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"}

// limitHolds: with limit N per client IP, exactly N of N+k requests reach
// the backend; the rest get 429 with Retry-After and the headers.
func limitHolds(t *testing.T, px proxy) {
	const n, extra = 5, 3
	s := newStack(t, px, "name=per-ip key=ip limit=5/1m algorithm=sliding_window_log", "")
	c := newClient("127.0.0.11")
	for i := 0; i < n+extra; i++ {
		r := c.do(t, "GET", s.url(0, "/limit"), nil)
		if i < n {
			if r.status != 200 {
				t.Fatalf("request %d: %d %q, want 200", i+1, r.status, firstLine(r.body))
			}
			if px.relaysOnAllowed {
				if got, want := r.header.Get("X-RateLimit-Remaining"), strconv.Itoa(n-1-i); got != want {
					t.Errorf("request %d: X-RateLimit-Remaining = %q, want %q (headers %v)", i+1, got, want, r.header)
				}
				for _, h := range rateHeaders {
					if r.header.Get(h) == "" {
						t.Errorf("allowed request %d lacks %s", i+1, h)
					}
				}
				if got := r.header.Get("RateLimit-Policy"); got != `"per-ip";q=5;w=60` {
					t.Errorf("RateLimit-Policy = %q", got)
				}
			} else if r.header.Get("X-RateLimit-Remaining") != "" {
				t.Errorf("%s relayed headers on an allowed request, which README says it cannot: update README", px.name)
			}
			continue
		}
		if r.status != 429 {
			t.Fatalf("request %d: %d %q, want 429", i+1, r.status, firstLine(r.body))
		}
		if retry, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || retry < 1 || retry > 60 {
			t.Errorf("denial %d: Retry-After = %q, want 1..60", i+1, r.header.Get("Retry-After"))
		}
		for _, h := range rateHeaders {
			if r.header.Get(h) == "" {
				t.Errorf("denial %d lacks %s (headers %v)", i+1, h, r.header)
			}
		}
		if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("denial Content-Type = %q", ct)
		}
		if !strings.Contains(r.body, `"status":429`) {
			t.Errorf("denial body %q", r.body)
		}
	}
	if got := s.backend.count("/limit"); got != n {
		t.Errorf("%d requests reached the backend, want exactly %d", got, n)
	}
}

// replicasShare: two proxies in front of two authlimit replicas on one Redis
// enforce one limit.
func replicasShare(t *testing.T, px proxy) {
	s := newStack(t, px, "name=per-ip key=ip limit=6/1m algorithm=gcra", "", nil, nil)
	c := newClient("127.0.0.12")
	allowed := 0
	for i := 0; i < 12; i++ {
		if c.do(t, "GET", s.url(i%2, "/shared"), nil).status == 200 {
			allowed++
		}
	}
	if got := s.backend.count("/shared"); got != 6 || allowed != 6 {
		t.Errorf("two replicas let %d requests through (%d reached the backend), want 6", allowed, got)
	}
}

// noSpoofing: a client sending its own X-Forwarded-For, X-Real-IP,
// X-Forwarded-Uri, X-Forwarded-Method or X-Original-URI gets neither a
// fresh quota nor past a path or method rule.
func noSpoofing(t *testing.T, px proxy) {
	s := newStack(t, px, "name=per-ip key=ip limit=3/1m; name=login key=ip limit=1/1m path=/login method=POST", "")
	spoof := func(n int) []string {
		fake := fmt.Sprintf("198.51.100.%d", n)
		return []string{"X-Forwarded-For", fake, "X-Real-IP", fake, "X-Forwarded-Uri", "/public", "X-Forwarded-Method", "GET",
			"X-Original-URI", "/public", "X-Forwarded-Host", "elsewhere.example"}
	}
	c := newClient("127.0.0.13")
	for i := 0; i < 3; i++ {
		if r := c.do(t, "GET", s.url(0, "/a"), nil, spoof(i)...); r.status != 200 {
			t.Fatalf("request %d: %d", i+1, r.status)
		}
	}
	if r := c.do(t, "GET", s.url(0, "/a"), nil, spoof(9)...); r.status != 429 {
		t.Errorf("a spoofed client address got a fresh quota: %d", r.status)
	}

	login := newClient("127.0.0.14")
	if r := login.do(t, "POST", s.url(0, "/login"), []byte("u=1")); r.status != 200 {
		t.Fatalf("first login: %d", r.status)
	}
	for _, path := range []string{"/login", "/login?next=/", "//login", "/x/../login", "/log%69n"} {
		if r := login.do(t, "POST", s.url(0, path), []byte("u=1"), spoof(7)...); r.status != 429 {
			t.Errorf("POST %s with spoofed headers: %d, want 429 (the login rule dodged)", path, r.status)
		}
	}
	if got := s.backend.count("/login"); got != 1 {
		t.Errorf("%d logins reached the backend, want 1", got)
	}
}

// bodiesPass: a POST with a body reaches the backend intact and at once
// (the auth subrequest must not wait for a body it never gets).
func bodiesPass(t *testing.T, px proxy) {
	s := newStack(t, px, "name=per-ip key=ip limit=100/1m", "")
	c := newClient("127.0.0.15")
	for _, size := range []int{1, 64 << 10, 1 << 20} {
		body := make([]byte, size)
		_, _ = rand.Read(body)
		r := c.do(t, "POST", s.url(0, "/upload"), body, "Content-Type", "application/octet-stream")
		if r.status != 200 {
			t.Fatalf("POST of %d bytes: %d %q", size, r.status, firstLine(r.body))
		}
		if r.elapsed > 10*time.Second {
			t.Errorf("POST of %d bytes took %v: the auth subrequest waited for a body", size, r.elapsed)
		}
		sums := s.backend.bodies("/upload")
		if len(sums) == 0 || sums[len(sums)-1] != sha256.Sum256(body) {
			t.Errorf("the backend did not get the %d-byte body intact", size)
		}
	}
}

// perRoute: a stricter rule on /login applies there and nowhere else.
func perRoute(t *testing.T, px proxy) {
	s := newStack(t, px, "name=per-ip key=ip limit=100/1m; name=login key=ip limit=2/1m path=/login", "")
	c := newClient("127.0.0.16")
	want := []struct {
		path   string
		status int
	}{
		{"/login", 200}, {"/login", 200}, {"/login", 429}, {"/login/step2", 429},
		{"/logins", 200}, {"/other", 200}, {"/", 200},
	}
	for _, w := range want {
		r := c.do(t, "GET", s.url(0, w.path), nil)
		if r.status != w.status {
			t.Errorf("GET %s: %d, want %d", w.path, r.status, w.status)
		}
		if w.status == 429 && !strings.Contains(r.header.Get("RateLimit-Policy"), `"login"`) {
			t.Errorf("GET %s denial: RateLimit-Policy = %q, want the login rule", w.path, r.header.Get("RateLimit-Policy"))
		}
	}
}

// unmatched: a request no rule applies to passes without rate-limit
// headers, and what the client sends under those names is not echoed back.
func unmatched(t *testing.T, px proxy) {
	s := newStack(t, px, "name=api key=ip limit=1/1m path=/api", "")
	c := newClient("127.0.0.18")
	for i := 0; i < 3; i++ {
		r := c.do(t, "GET", s.url(0, "/elsewhere"), nil, "X-RateLimit-Remaining", "999", "RateLimit", `"x";r=999;t=1`)
		if r.status != 200 {
			t.Fatalf("request %d: %d", i+1, r.status)
		}
		for name, vals := range r.header {
			for _, v := range vals {
				if strings.Contains(v, "999") || strings.HasPrefix(v, "{") {
					t.Errorf("response header %s: %q", name, v)
				}
			}
		}
		for _, h := range rateHeaders {
			if r.header.Get(h) != "" {
				t.Errorf("no rule applied, yet %s = %q", h, r.header.Get(h))
			}
		}
	}
	if got := s.backend.count("/elsewhere"); got != 3 {
		t.Errorf("%d requests reached the backend, want 3", got)
	}
}

// authlimitDown: what the client gets when authlimit cannot be reached, as
// documented per proxy; for nginx, OpenResty and HAProxy also the
// fail-open variant.
func authlimitDown(t *testing.T, px proxy) {
	variants := []string{""}
	if px.name == "nginx" || px.name == "openresty" || px.name == "haproxy" || px.name == "haproxy-spoe" {
		variants = append(variants, "failopen")
	}
	for _, v := range variants {
		s := newStack(t, px, "name=per-ip key=ip limit=100/1m", v)
		c := newClient("127.0.0.17")
		if r := c.do(t, "GET", s.url(0, "/down"), nil); r.status != 200 {
			t.Fatalf("%s with authlimit up: %d", v, r.status)
		}
		s.authlimit[0].stop()
		want := px.authlimitDown
		if v == "failopen" {
			want = 200
		}
		r := c.do(t, "GET", s.url(0, "/down"), nil)
		if r.status != want {
			t.Errorf("variant %q, authlimit down: %d %q, want %d", v, r.status, firstLine(r.body), want)
		}
		if v == "failopen" && s.backend.count("/down") != 2 {
			t.Errorf("fail-open: the backend got %d requests, want 2", s.backend.count("/down"))
		}
	}
}

// redisDown: with Redis gone, each fail mode behaves as documented behind
// the proxy: open lets requests through, closed refuses them (503, which
// nginx's auth_request turns into 500), local enforces the limit divided by
// AUTHLIMIT_LOCAL_DIVISOR.
func redisDown(t *testing.T, px proxy) {
	s := newStack(t, px, "name=per-ip key=ip limit=4/1m", "",
		map[string]string{"AUTHLIMIT_FAIL_MODE": "open"},
		map[string]string{"AUTHLIMIT_FAIL_MODE": "closed"},
		map[string]string{"AUTHLIMIT_FAIL_MODE": "local", "AUTHLIMIT_LOCAL_DIVISOR": "2"})
	s.redis.Stop(t)
	want := [][]int{
		{200, 200, 200, 200, 200},
		{px.closed, px.closed, px.closed},
		{200, 200, 429, 429},
	}
	for replica, statuses := range want {
		c := newClient(fmt.Sprintf("127.0.0.%d", 20+replica))
		for i, w := range statuses {
			r := c.do(t, "GET", s.url(replica, "/redis-down"), nil)
			if r.status != w {
				t.Errorf("replica %d (%s), request %d: %d %q, want %d", replica, []string{"open", "closed", "local"}[replica], i+1, r.status, firstLine(r.body), w)
			}
		}
	}
	if got := s.backend.count("/redis-down"); got != 5+2 {
		t.Errorf("%d requests reached the backend, want 7 (5 failing open, 2 within the local limit)", got)
	}
}
