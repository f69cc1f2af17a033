package handler

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
	"github.com/authlimit/authlimit/store/redis"
)

var defaultTrusted = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fc00::/7"),
}

// newHandler returns a handler deciding src's rules with the memory store
// through a guard, as authlimit does without Redis.
func newHandler(tb testing.TB, src string, opts ...func(*testOptions)) *Handler {
	tb.Helper()
	rs, err := rules.Parse(src)
	if err != nil {
		tb.Fatal(err)
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	tb.Cleanup(func() { _ = m.Close() })
	sets := rulesettest.Holder(tb, rs)
	g, err := guard.New(guard.Options{Store: m, Rules: sets, DenyCacheSize: 1000})
	if err != nil {
		tb.Fatal(err)
	}
	o := testOptions{
		Options: Options{
			Ready: g, Proxies: rules.Proxies{Trusted: defaultTrusted},
			MethodHeader: "X-Forwarded-Method", URIHeader: "X-Forwarded-Uri", HostHeader: "X-Forwarded-Host",
			Registry: prometheus.NewRegistry(),
			Sleep:    func(time.Duration) {},
		},
		engine: decide.Options{Rules: sets, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429},
	}
	for _, f := range opts {
		f(&o)
	}
	o.engine.Registry = o.Registry
	if o.Engine, err = decide.New(o.engine); err != nil {
		tb.Fatal(err)
	}
	h, err := New(o.Options)
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

// testOptions are a test handler's options and its engine's.
type testOptions struct {
	Options
	engine decide.Options
}

// authRequest prepares ctx as a proxy's auth subrequest for the client ip,
// from a trusted peer, with more headers.
func authRequest(ctx *fasthttp.RequestCtx, ip string, headers ...string) {
	ctx.Request.Reset()
	ctx.Response.Reset()
	ctx.Request.SetRequestURI("/auth")
	ctx.Request.Header.Set("X-Forwarded-For", ip)
	for i := 0; i+1 < len(headers); i += 2 {
		ctx.Request.Header.Add(headers[i], headers[i+1])
	}
}

func newCtx() *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	return &ctx
}

// TestAuthAllocatesNothing: deciding a request, allowed or denied, one rule
// or three, with keys from headers and hashed tags, allocates nothing once
// the pools are warm.
func TestAuthAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts mean nothing under the race detector; make test runs this test without it")
	}
	h := newHandler(t, "name=per-ip key=ip limit=1000000/1m; name=api key=ip+header:X-Api-Key limit=1000000/1h algorithm=token_bucket path=/api;"+
		"name=long key=header:X-Api-Key limit=1000000/1d algorithm=gcra cost=header:X-Cost; name=tiny key=ip limit=1/1h algorithm=fixed_window host=tiny.example.com")
	ctx := newCtx()
	cases := map[string][]string{
		"one rule":            nil,
		"three rules":         {"X-Forwarded-Uri", "/API/v1;x=1", "X-Api-Key", strings.Repeat("k", 100), "X-Cost", "3"},
		"denied":              {"X-Forwarded-Host", "Tiny.Example.com:443"},
		"no rule, bad header": {"X-Forwarded-Uri", "/api", "X-Api-Key", "a", "X-Api-Key", "b"},
	}
	for name, headers := range cases {
		run := func() {
			authRequest(ctx, "203.0.113.7", headers...)
			h.Serve(ctx)
		}
		run()
		run()
		if name != "no rule, bad header" {
			if got := testing.AllocsPerRun(200, run); got != 0 {
				t.Errorf("%s: %v allocations per request, want 0 (status %d)", name, got, ctx.Response.StatusCode())
			}
		}
	}

	// A request read from a connection, whose raw header block is
	// searched for repeats, keyed by a header fasthttp parses itself, and
	// with its host and path from a URL header.
	hu := newHandler(t, "name=ua key=header:User-Agent+host limit=1000000/1m path=/api; name=len key=ip limit=1000000/1h cost=header:X-Original-Content-Length",
		func(o *testOptions) { o.URLHeader = "X-Original-URL" })
	parsed := serveRaw(t, hu, rawAuth("User-Agent: curl/8.0", "X-Original-URL: https://api.example.com/API/v1?x=1", "X-Original-Content-Length: 5000", "Accept: */*"))
	if parsed.Response.StatusCode() != 200 || len(parsed.Response.Header.Peek("RateLimit-Policy")) == 0 {
		t.Fatalf("parsed request: %d %s", parsed.Response.StatusCode(), parsed.Response.Body())
	}
	run := func() {
		parsed.Response.Reset()
		hu.Serve(parsed)
	}
	run()
	if got := testing.AllocsPerRun(200, run); got != 0 {
		t.Errorf("parsed request: %v allocations per request, want 0 (status %d)", got, parsed.Response.StatusCode())
	}

	// Envoy's HTTP ext_authz: the original method and path in the
	// request line, behind /auth.
	he := newHandler(t, "name=api key=ip+header:X-Api-Key limit=1000000/1m method=POST path=/api")
	envoy := serveRaw(t, he, "POST /auth/API/v1?x=1 HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-For: 203.0.113.7\r\nX-Api-Key: k\r\nContent-Length: 0\r\n\r\n")
	if envoy.Response.StatusCode() != 200 || len(envoy.Response.Header.Peek("RateLimit-Policy")) == 0 {
		t.Fatalf("envoy request: %d %s", envoy.Response.StatusCode(), envoy.Response.Body())
	}
	run = func() {
		envoy.Response.Reset()
		he.Serve(envoy)
	}
	if got := testing.AllocsPerRun(200, run); got != 0 {
		t.Errorf("envoy request: %v allocations per request, want 0 (status %d)", got, envoy.Response.StatusCode())
	}
}

// serveRaw serves a request read from raw bytes, as from a connection
// (so that it has a raw header block), and returns its context.
func serveRaw(t testing.TB, h *Handler, raw string) *fasthttp.RequestCtx {
	t.Helper()
	ctx := newCtx()
	if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("read %q: %v", raw, err)
	}
	h.Serve(ctx)
	return ctx
}

// rawAuth is an auth subrequest for the client 203.0.113.7 with more
// header lines.
func rawAuth(lines ...string) string {
	return "GET /auth HTTP/1.1\r\nHost: authlimit\r\nX-Forwarded-For: 203.0.113.7\r\n" + strings.Join(lines, "\r\n") + "\r\n\r\n"
}

// TestHeaderNamesInAnyCase: the method, URI and host headers are found
// whatever the case of their configured names and of the request's lines,
// the Host header itself included, and so is X-Real-IP.
func TestHeaderNamesInAnyCase(t *testing.T) {
	const rule = "name=login key=ip limit=1/1h method=POST path=/login host=api.example.com"
	const xff = "X-Forwarded-For: 203.0.113.7"
	for _, tc := range []struct {
		name              string
		method, uri, host string
		lines             []string // after the request line
		applies           bool
	}{
		{"as documented", "X-Forwarded-Method", "X-Forwarded-Uri", "X-Forwarded-Host",
			[]string{"Host: authlimit", xff, "X-Forwarded-Method: POST", "X-Forwarded-Uri: /login", "X-Forwarded-Host: api.example.com"}, true},
		{"names in odd case", "x-ORIGINAL-method", "X-original-URI", "x-original-host",
			[]string{"Host: authlimit", xff, "x-original-method: POST", "X-ORIGINAL-URI: /login", "X-Original-Host: api.example.com"}, true},
		{"the Host header itself", "X-Forwarded-Method", "X-Forwarded-Uri", "host",
			[]string{"HOST: api.example.com", xff, "X-Forwarded-Method: POST", "X-Forwarded-Uri: /login"}, true},
		{"another method", "X-Forwarded-Method", "X-Forwarded-Uri", "X-Forwarded-Host",
			[]string{"Host: authlimit", xff, "X-Forwarded-Method: GET", "X-Forwarded-Uri: /login", "X-Forwarded-Host: api.example.com"}, false},
		{"X-Real-IP in lower case", "X-Forwarded-Method", "X-Forwarded-Uri", "X-Forwarded-Host",
			[]string{"Host: authlimit", "x-real-ip: 198.51.100.9", "X-Forwarded-Method: POST", "X-Forwarded-Uri: /login", "X-Forwarded-Host: api.example.com"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHandler(t, rule, func(o *testOptions) {
				o.MethodHeader, o.URIHeader, o.HostHeader = tc.method, tc.uri, tc.host
			})
			raw := "GET /auth HTTP/1.1\r\n" + strings.Join(tc.lines, "\r\n") + "\r\n\r\n"
			first := serveRaw(t, h, raw)
			if got := len(first.Response.Header.Peek("RateLimit-Policy")) > 0; got != tc.applies {
				t.Fatalf("rule applied %v, want %v (%d %q)", got, tc.applies, first.Response.StatusCode(), first.Response.Body())
			}
			if !tc.applies {
				return
			}
			if second := serveRaw(t, h, raw); second.Response.StatusCode() != 429 {
				t.Fatalf("second request: %d, want 429", second.Response.StatusCode())
			}
			// Another client has its own budget: the client was read.
			other := strings.NewReplacer("203.0.113.7", "203.0.113.8", "198.51.100.9", "198.51.100.10").Replace(raw)
			if third := serveRaw(t, h, other); third.Response.StatusCode() != 200 {
				t.Fatalf("another client: %d, want 200", third.Response.StatusCode())
			}
		})
	}
}

// TestRepeatedHeader: a key or cost header that a request has more than
// once is refused with the deny status and urn:authlimit:repeated-header,
// and counts nothing, for the headers fasthttp keeps one value of
// (User-Agent, Content-Type, Cookie) as for any other.
func TestRepeatedHeader(t *testing.T) {
	for _, name := range []string{"User-Agent", "Content-Type", "Cookie", "X-Api-Key", "user-agent"} {
		t.Run(name, func(t *testing.T) {
			h := newHandler(t, "name=k key=header:"+name+" limit=1/1m; name=c key=ip limit=5/1m cost=header:X-Cost")
			status := func(lines ...string) (int, string) {
				ctx := serveRaw(t, h, rawAuth(lines...))
				return ctx.Response.StatusCode(), string(ctx.Response.Body())
			}
			for _, lines := range [][]string{
				{name + ": victim", name + ": r1"},
				{name + ": r2", name + ": victim"},
				{"USER-AGENT: victim", "user-agent: r3"},
				{name + ": victim", name + ":"},
			} {
				if name != "User-Agent" && name != "user-agent" && strings.HasPrefix(lines[0], "USER-AGENT") {
					continue
				}
				code, body := status(lines...)
				if code != 429 || !strings.Contains(body, "urn:authlimit:repeated-header") {
					t.Errorf("%q: %d %s, want 429 repeated-header", lines, code, body)
				}
			}
			// None of that counted: the victim's one request passes,
			// then the next is rate-limited.
			if code, body := status(name + ": victim"); code != 200 {
				t.Errorf("victim alone: %d %s, want 200", code, body)
			}
			if code, body := status(name + ": victim"); code != 429 || !strings.Contains(body, "rate-limited") {
				t.Errorf("victim again: %d %s, want 429 rate-limited", code, body)
			}
		})
	}
	t.Run("cost", func(t *testing.T) {
		h := newHandler(t, "name=c key=ip limit=5/1m cost=header:X-Cost")
		ctx := serveRaw(t, h, rawAuth("X-Cost: 5", "x-cost: 1"))
		if ctx.Response.StatusCode() != 429 || !strings.Contains(string(ctx.Response.Body()), "urn:authlimit:repeated-header") {
			t.Errorf("X-Cost twice: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		if ctx := serveRaw(t, h, rawAuth("X-Cost: 5")); ctx.Response.StatusCode() != 200 {
			t.Errorf("X-Cost 5 after a refused repeat: %d, want 200", ctx.Response.StatusCode())
		}
	})
}

// TestCostZero: a cost header of 0 (an empty body) is not an invalid
// cost: the rule counts nothing and is left out, even when its quota is
// spent.
func TestCostZero(t *testing.T) {
	h := newHandler(t, "name=bytes key=ip limit=10/1m cost=header:X-Len")
	ctx := newCtx()
	for _, tc := range []struct {
		len    string
		status int
	}{{"10", 200}, {"1", 429}, {"0", 200}, {"0", 200}} {
		authRequest(ctx, "203.0.113.7", "X-Len", tc.len)
		h.Serve(ctx)
		if got := ctx.Response.StatusCode(); got != tc.status {
			t.Errorf("X-Len %s: %d %s, want %d", tc.len, got, ctx.Response.Body(), tc.status)
		}
		if tc.len == "0" && len(ctx.Response.Header.Peek("X-RateLimit-Limit")) != 0 {
			t.Errorf("X-Len 0: rate-limit headers of a rule left out")
		}
	}
}

// TestURLHeader: with a URL header (ingress-nginx's X-Original-URL), the
// host and the path come from it alone; a request without one, with two,
// or with one that has no host is refused (urn:authlimit:invalid-url),
// never read from X-Forwarded-Host or X-Forwarded-Uri.
func TestURLHeader(t *testing.T) {
	rules := "name=api key=ip limit=1/1m host=api.example.com path=/login; name=host key=host limit=1/1m path=/k"
	withURL := func(o *testOptions) { o.URLHeader = "X-Original-URL" }
	serve := func(h *Handler, headers ...string) (int, string) {
		ctx := newCtx()
		authRequest(ctx, "203.0.113.7", headers...)
		h.Serve(ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Body())
	}

	h := newHandler(t, rules, withURL)
	// The URL decides, whatever X-Forwarded-Host and -Uri say.
	spoof := []string{"X-Forwarded-Host", "elsewhere.example", "X-Forwarded-Uri", "/public"}
	for i, want := range []int{200, 429} {
		code, body := serve(h, append([]string{"X-Original-URL", "https://API.example.com:443/Login;a=1?x=1"}, spoof...)...)
		if code != want {
			t.Errorf("request %d to api.example.com/login: %d %s, want %d", i+1, code, body, want)
		}
	}
	if code, _ := serve(h, "X-Original-URL", "https://other.example/login", "X-Forwarded-Host", "api.example.com"); code != 200 {
		t.Errorf("other.example/login with X-Forwarded-Host api.example.com: %d, want 200 (no rule)", code)
	}
	// key=host: one quota per URL host.
	for i, want := range []int{200, 429} {
		code, _ := serve(h, "X-Original-URL", "http://api.example.com/k", "X-Forwarded-Host", "r"+string(rune('0'+i)))
		if code != want {
			t.Errorf("key=host request %d: %d, want %d", i+1, code, want)
		}
	}
	// No usable URL: refused.
	for _, headers := range [][]string{
		{"X-Forwarded-Host", "fresh.example", "X-Forwarded-Uri", "/k"},
		{"X-Original-URL", "", "X-Forwarded-Host", "fresh.example"},
		{"X-Original-URL", "http:///k", "X-Forwarded-Host", "fresh.example"},
		{"X-Original-URL", "/k", "X-Forwarded-Host", "fresh.example"},
		{"X-Original-URL", "http://a.example/k", "X-Original-URL", "http://b.example/k"},
	} {
		code, body := serve(h, headers...)
		if code != 429 || !strings.Contains(body, "urn:authlimit:invalid-url") || !strings.Contains(body, "X-Original-URL") {
			t.Errorf("%q: %d %s, want 429 invalid-url", headers, code, body)
		}
	}
	// An allow-listed client is let through before any of that.
	allow := newHandler(t, rules, withURL, func(o *testOptions) { o.engine.AllowCIDRs = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")} })
	if code, _ := serve(allow); code != 200 {
		t.Errorf("allow-listed client without a URL: %d, want 200", code)
	}

	// Without a URL header, the host and URI headers as before.
	plain := newHandler(t, rules)
	for i, want := range []int{200, 429} {
		if code, _ := serve(plain, "X-Forwarded-Host", "api.example.com", "X-Forwarded-Uri", "/LOGIN"); code != want {
			t.Errorf("without a URL header, request %d: %d, want %d", i+1, code, want)
		}
	}
}

// BenchmarkAuth measures one auth request through the handler on the
// memory store, serially and in parallel, for one rule and three.
func BenchmarkAuth(b *testing.B) {
	for _, tc := range []struct{ name, rules string }{
		{"rules=1", "name=a key=ip limit=1000000000/1m"},
		{"rules=3", "name=a key=ip limit=1000000000/1m; name=b key=ip limit=1000000000/1h algorithm=token_bucket; name=c key=ip limit=1000000000/1d algorithm=gcra"},
	} {
		benchServe(b, tc.name, newHandler(b, tc.rules), 1)
	}
}

// benchServe runs auth requests from 10,000 client IPs through h, serially
// and from parallelism × GOMAXPROCS goroutines, each answered 200.
func benchServe(b *testing.B, name string, h *Handler, parallelism int) {
	ips := make([]string, 10_000)
	for i := range ips {
		ips[i] = netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}).String()
	}
	b.Run(name+"/serial", func(b *testing.B) {
		ctx := newCtx()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			authRequest(ctx, ips[i%len(ips)])
			h.Serve(ctx)
			if ctx.Response.StatusCode() != 200 {
				b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
			}
		}
	})
	b.Run(name+"/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(parallelism)
		b.RunParallel(func(pb *testing.PB) {
			ctx := newCtx()
			i := 0
			for pb.Next() {
				authRequest(ctx, ips[i%len(ips)])
				h.Serve(ctx)
				if ctx.Response.StatusCode() != 200 {
					b.Errorf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
					return
				}
				i++
			}
		})
	})
}

// BenchmarkAuthRedis measures one auth request through the handler, the
// guard and the Redis store on a real redis-server, serially (a batch per
// request) and in parallel (requests share batches): its allocs/op is the
// request path's allocations per decision on Redis.
func BenchmarkAuthRedis(b *testing.B) {
	srv := redistest.New(b)
	base, err := goredis.ParseURL(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	base.PoolSize, base.Protocol = redis.DefaultConns+4, 2
	client := goredis.NewClient(base)
	b.Cleanup(func() { _ = client.Close() })
	for _, tc := range []struct{ name, rules string }{
		{"rules=1", "name=a key=ip limit=1000000000/1m"},
		{"rules=3", "name=a key=ip limit=1000000000/1m; name=b key=ip limit=1000000000/1h algorithm=token_bucket; name=c key=ip limit=1000000000/1d algorithm=gcra"},
	} {
		rs, err := rules.Parse(tc.rules)
		if err != nil {
			b.Fatal(err)
		}
		store := redis.New(client, redis.Options{Prefix: srv.Prefix(b), Timeout: time.Second})
		b.Cleanup(func() { _ = store.Close() })
		local := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
		b.Cleanup(func() { _ = local.Close() })
		sets := rulesettest.Holder(b, rs)
		g, err := guard.New(guard.Options{
			Store: store, Remote: true, Local: local, Rules: sets, DenyCacheSize: 1000,
			BreakerFailures: 5, BreakerBackoff: 100 * time.Millisecond, BreakerMaxBackoff: 500 * time.Millisecond, ProbeTimeout: time.Second,
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(g.Close)
		e, err := decide.New(decide.Options{Rules: sets, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429})
		if err != nil {
			b.Fatal(err)
		}
		h, err := New(Options{
			Engine: e, Ready: g, Proxies: rules.Proxies{Trusted: defaultTrusted},
			MethodHeader: "X-Forwarded-Method", URIHeader: "X-Forwarded-Uri", HostHeader: "X-Forwarded-Host",
		})
		if err != nil {
			b.Fatal(err)
		}
		// Concurrent requests, as from a proxy's connections, share
		// batches.
		benchServe(b, tc.name, h, 16)
	}
}

// TestCostTooHighOverRateLimited: a request that one rule rate-limits and
// another can never admit (its cost is above what that rule ever admits)
// is answered cost-too-high, without Retry-After, since no wait admits it;
// so is every such request after, the deny cache holding the first rule's
// denial included. A request that can pass some day still hears
// rate-limited, with the wait.
func TestCostTooHighOverRateLimited(t *testing.T) {
	h := newHandler(t, "name=per-ip key=ip limit=1/1m; name=bytes key=ip limit=5/1m cost=header:X-Cost")
	ctx := newCtx()
	serve := func(cost string) {
		t.Helper()
		authRequest(ctx, "203.0.113.7", "X-Cost", cost)
		h.Serve(ctx)
	}
	serve("1")
	if got := ctx.Response.StatusCode(); got != 200 {
		t.Fatalf("first request: %d %s, want 200", got, ctx.Response.Body())
	}
	for i := range 3 {
		serve("6")
		body := string(ctx.Response.Body())
		if got := ctx.Response.StatusCode(); got != 429 || !strings.Contains(body, "urn:authlimit:cost-too-high") {
			t.Errorf("cost 6, request %d: %d %s, want 429 cost-too-high", i+1, got, body)
		}
		if got := ctx.Response.Header.Peek("Retry-After"); len(got) != 0 {
			t.Errorf("cost 6, request %d: Retry-After %q, want none", i+1, got)
		}
		if !strings.Contains(body, `"violated-policies":["per-ip","bytes"]`) {
			t.Errorf("cost 6, request %d: %s, want both rules violated", i+1, body)
		}
		if got, want := string(ctx.Response.Header.Peek("RateLimit")), `"bytes";`; !strings.HasPrefix(got, want) {
			t.Errorf("cost 6, request %d: RateLimit %q, want %s... (the rule that never admits)", i+1, got, want)
		}
	}
	serve("2")
	if got, body := ctx.Response.StatusCode(), string(ctx.Response.Body()); got != 429 || !strings.Contains(body, "urn:authlimit:rate-limited") || len(ctx.Response.Header.Peek("Retry-After")) == 0 {
		t.Errorf("cost 2: %d %s Retry-After %q, want 429 rate-limited with Retry-After", got, body, ctx.Response.Header.Peek("Retry-After"))
	}
}

// TestPathsUnderAuth: Envoy's HTTP ext_authz sends the original method as
// the request's and the original path behind its path_prefix, /auth. Every
// path under /auth/ decides, with the method from the request line and the
// path from the rest of it, normalized as X-Forwarded-Uri is; /auth itself
// keeps its own path; /authx is not found.
func TestPathsUnderAuth(t *testing.T) {
	const rules = "name=login key=ip limit=1/1h method=POST path=/login; name=self key=ip limit=1/1h path=/auth; name=root key=ip limit=1/1h path=~^/$; name=ops key=ip limit=1/1h path=~^/(healthz|metrics)$"
	for _, tc := range []struct {
		name   string
		line   string   // the request line's method and target
		lines  []string // more header lines
		status int
		rule   string // the rule in RateLimit-Policy; "" for none
	}{
		{"envoy's path with a query", "POST /auth/login?x=1", nil, 200, "login"},
		{"normalized like X-Forwarded-Uri", "POST /auth/Log%69n;jsessionid=1/", nil, 200, "login"},
		{"dot segments resolved after the prefix goes", "POST /auth/x/../login", nil, 200, "login"},
		{"dot segments above the original root", "POST /auth/../login", nil, 200, "login"},
		{"method from the request line", "GET /auth/login", nil, 200, ""},
		{"the original root", "GET /auth/", nil, 200, "root"},
		{"the original root with a query", "GET /auth/?a=/login", nil, 200, "root"},
		{"X-Forwarded-Uri wins", "POST /auth/elsewhere", []string{"X-Forwarded-Uri: /login"}, 200, "login"},
		{"X-Forwarded-Method wins", "GET /auth/login", []string{"X-Forwarded-Method: POST"}, 200, "login"},
		{"/auth keeps its own path", "GET /auth", nil, 200, "self"},
		{"/auth with a query keeps its own path", "GET /auth?x=/login", nil, 200, "self"},
		{"not a path under /auth/", "GET /authx", nil, 404, ""},
		{"not a path under /auth/ either", "POST /authlogin", nil, 404, ""},
		// fasthttp's own normalization makes this /healthz: it must
		// still be a decision, never the health check's 200.
		{"the health check behind the prefix", "GET /auth/../healthz", nil, 200, "ops"},
		{"the metrics behind the prefix", "GET /auth/%2e%2e/metrics", nil, 200, "ops"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHandler(t, rules)
			raw := tc.line + " HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-For: 203.0.113.7\r\n"
			for _, l := range tc.lines {
				raw += l + "\r\n"
			}
			raw += "\r\n"
			ctx := serveRaw(t, h, raw)
			if got := ctx.Response.StatusCode(); got != tc.status {
				t.Fatalf("%s: %d %q, want %d", tc.line, got, ctx.Response.Body(), tc.status)
			}
			if tc.status == 404 {
				return
			}
			if body := string(ctx.Response.Body()); body != "" {
				t.Errorf("%s: body %q, want the empty body of an allowed decision", tc.line, body)
			}
			policy := string(ctx.Response.Header.Peek("RateLimit-Policy"))
			if tc.rule == "" {
				if policy != "" {
					t.Errorf("%s: RateLimit-Policy %q, want no rule", tc.line, policy)
				}
				return
			}
			if want := `"` + tc.rule + `";q=1;w=3600`; policy != want {
				t.Errorf("%s: RateLimit-Policy %q, want %q", tc.line, policy, want)
			}
			// The second request is denied at once, 429 with the
			// rate-limit headers, for Envoy to relay.
			again := serveRaw(t, h, raw)
			if got := again.Response.StatusCode(); got != 429 {
				t.Fatalf("%s again: %d, want 429", tc.line, got)
			}
			for _, name := range []string{"Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "RateLimit-Policy"} {
				if len(again.Response.Header.Peek(name)) == 0 {
					t.Errorf("%s again: no %s", tc.line, name)
				}
			}
			if body := string(again.Response.Body()); !strings.Contains(body, `"violated-policies":["`+tc.rule+`"]`) {
				t.Errorf("%s again: body %s, want %s violated", tc.line, body, tc.rule)
			}
		})
	}
}
