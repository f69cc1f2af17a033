package handler

import (
	"bufio"
	"net/netip"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// The seed corpora live in testdata/fuzz (run as tests by go test); `make
// fuzz` fuzzes each target.

// FuzzAuth sends requests with arbitrary forwarded headers through the
// whole handler: it never panics or hangs, and answers only with the
// statuses README lists.
func FuzzAuth(f *testing.F) {
	f.Add("203.0.113.7", "", "/login?x=1", "POST", "api.example.com", "k1", "3")
	f.Add("garbage, 10.0.0.5", "198.51.100.1", "//x/../login", "post", "API.example.com:8080", "", "abc")
	f.Add(strings.Repeat("1.1.1.1,", 100), "\xff", "%zz", "\x00", "[::1]", strings.Repeat("k", 300), "-1")
	h := newHandler(f, "name=per-ip limit=3/1m; name=login key=ip+header:X-Api-Key limit=2/1m path=/login on_missing=deny;"+
		"name=cost key=header:X-Api-Key limit=10/1m algorithm=token_bucket cost=header:X-Cost host=*.example.com",
		func(o *testOptions) { o.engine.BlockCIDRs = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")} })
	f.Fuzz(func(t *testing.T, xff, realIP, uri, method, host, apiKey, cost string) {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/auth")
		hdr := &ctx.Request.Header
		for name, v := range map[string]string{"X-Forwarded-For": xff, "X-Real-IP": realIP, "X-Forwarded-Uri": uri,
			"X-Forwarded-Method": method, "X-Forwarded-Host": host, "X-Api-Key": apiKey, "X-Cost": cost} {
			if v != "" {
				hdr.Set(name, v)
			}
		}
		h.Serve(&ctx)
		switch ctx.Response.StatusCode() {
		case 200, 429:
			if ct := string(ctx.Response.Header.ContentType()); ctx.Response.StatusCode() == 429 && ct != "application/problem+json" {
				t.Fatalf("a 429 with Content-Type %q", ct)
			}
		default:
			t.Fatalf("status %d for %q %q %q %q %q %q %q", ctx.Response.StatusCode(), xff, realIP, uri, method, host, apiKey, cost)
		}
	})
}

// FuzzAuthPath sends requests whose request line holds any path under
// /auth/, as Envoy's HTTP ext_authz sends the original path: each is a
// decision (200 or 429), never a health check, metrics or not found,
// whatever dot segments, escapes or bytes it holds.
func FuzzAuthPath(f *testing.F) {
	f.Add("GET", "login?x=1")
	f.Add("POST", "../healthz")
	f.Add("GET", "%2e%2e/%2E%2e/metrics")
	f.Add("HEAD", "a/../../readyz;x=1")
	f.Add("GET", "\\..\\healthz")
	h := newHandler(f, "name=per-ip limit=1/1h; name=ops key=ip limit=1/1h path=~^/(healthz|readyz|metrics)$")
	f.Fuzz(func(t *testing.T, method, rest string) {
		raw := method + " /auth/" + rest + " HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n"
		var ctx fasthttp.RequestCtx
		if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return // not a request fasthttp reads
		}
		if !strings.HasPrefix(string(ctx.Request.URI().PathOriginal()), "/auth/") {
			return // the target ended before the path did
		}
		h.Serve(&ctx)
		if code := ctx.Response.StatusCode(); code != 200 && code != 429 {
			t.Fatalf("%q: status %d %q, want a decision", raw, code, ctx.Response.Body())
		}
		if code := ctx.Response.StatusCode(); code == 200 && len(ctx.Response.Body()) > 0 {
			t.Fatalf("%q: 200 with a body %q: not a decision", raw, ctx.Response.Body())
		}
	})
}
