package handler

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
)

var defaultTrusted = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fc00::/7"),
}

// newHandler returns a handler deciding src's rules with the memory store
// through a guard, as authlimit does without Redis.
func newHandler(tb testing.TB, src string, opts ...func(*Options)) *Handler {
	tb.Helper()
	rs, err := rules.Parse(src)
	if err != nil {
		tb.Fatal(err)
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	tb.Cleanup(func() { _ = m.Close() })
	var policies []*algo.Policy
	for _, r := range rs {
		policies = append(policies, r.Policy)
	}
	g, err := guard.New(guard.Options{Store: m, Policies: policies, DenyCacheSize: 1000})
	if err != nil {
		tb.Fatal(err)
	}
	o := Options{
		Rules: rs, Decider: g, Ready: g, Proxies: rules.Proxies{Trusted: defaultTrusted},
		IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429,
		MethodHeader: "X-Forwarded-Method", URIHeader: "X-Forwarded-Uri", HostHeader: "X-Forwarded-Host",
		Sleep: func(time.Duration) {},
	}
	for _, f := range opts {
		f(&o)
	}
	h, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	return h
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
	if raceEnabled {
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
}

// BenchmarkAuth measures one auth request through the handler on the
// memory store, serially and in parallel, for one rule and three.
func BenchmarkAuth(b *testing.B) {
	for _, tc := range []struct{ name, rules string }{
		{"rules=1", "name=a key=ip limit=1000000000/1m"},
		{"rules=3", "name=a key=ip limit=1000000000/1m; name=b key=ip limit=1000000000/1h algorithm=token_bucket; name=c key=ip limit=1000000000/1d algorithm=gcra"},
	} {
		h := newHandler(b, tc.rules)
		ips := make([]string, 10_000)
		for i := range ips {
			ips[i] = netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}).String()
		}
		b.Run(tc.name+"/serial", func(b *testing.B) {
			ctx := newCtx()
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				authRequest(ctx, ips[i%len(ips)])
				h.Serve(ctx)
			}
		})
		b.Run(tc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := newCtx()
				i := 0
				for pb.Next() {
					authRequest(ctx, ips[i%len(ips)])
					h.Serve(ctx)
					i++
				}
			})
		})
	}
}
