package handler

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/algo"
)

// The seed corpora live in testdata/fuzz (run as tests by go test); `make
// fuzz` fuzzes each target.

func FuzzParseRules(f *testing.F) {
	f.Add("name=default key=ip limit=100/1m")
	f.Add("name=a key=ip+header:X-Api-Key limit=5/1m algorithm=gcra burst=2 method=POST path=/login; name=b limit=1/d")
	f.Add("name=x limit=0/0s burst=-1 algorithm=nope\n# c\nname=y limit=1/1m path=~[")
	f.Fuzz(func(t *testing.T, src string) {
		rules, err := ParseRules(src)
		if err != nil {
			if rules != nil {
				t.Fatalf("ParseRules(%q) returned rules with an error", src)
			}
			if !utf8.ValidString(err.Error()) && utf8.ValidString(src) {
				t.Fatalf("ParseRules(%q) error is not UTF-8", src)
			}
			return
		}
		// A valid rule set prints as a rule set that parses to the
		// same thing.
		for _, r := range rules {
			again, err := ParseRules(r.String())
			if err != nil {
				t.Fatalf("ParseRules(%q) = %v; its String %q does not parse: %v", src, r, r.String(), err)
			}
			if again[0].String() != r.String() {
				t.Fatalf("round trip of %q: %q then %q", src, r.String(), again[0].String())
			}
		}
	})
}

func FuzzClientIP(f *testing.F) {
	f.Add("203.0.113.7, 10.0.0.5", "", byte(0))
	f.Add("[2001:db8::1]:443,garbage,,", "198.51.100.1", byte(1))
	f.Add("", "10.0.0.1", byte(2))
	f.Fuzz(func(t *testing.T, xff, realIP string, peerPick byte) {
		peers := []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("198.51.100.9"), netip.MustParseAddr("::1")}
		peer := peers[int(peerPick)%len(peers)]
		r := ipResolver{trusted: defaultTrusted}
		var hdrs [][]byte
		if xff != "" {
			hdrs = bytes.Split([]byte(xff), []byte("\n"))
		}
		got := r.clientIP(hdrs, []byte(realIP), peer)
		if !got.IsValid() {
			t.Fatalf("clientIP(%q, %q, %v) is not an address", xff, realIP, peer)
		}
		if got == peer {
			return
		}
		// Any other answer must come from the headers, and only if
		// the peer is a trusted proxy.
		if !r.isTrusted(peer) {
			t.Fatalf("clientIP(%q, %q, %v) = %v: believed an untrusted peer", xff, realIP, peer, got)
		}
		found := false
		for _, e := range append(strings.FieldsFunc(xff, func(c rune) bool { return c == ',' || c == '\n' }), realIP) {
			if a, ok := parseIP([]byte(strings.TrimSpace(e))); ok && a == got {
				found = true
			}
		}
		if !found {
			t.Fatalf("clientIP(%q, %q, %v) = %v, which is not in the headers", xff, realIP, peer, got)
		}
	})
}

func FuzzNormalizePath(f *testing.F) {
	f.Add("/login?next=/admin")
	f.Add("/x/%2e%2e/log%69n//")
	f.Add("http://host/a/../b/./c/")
	f.Fuzz(func(t *testing.T, uri string) {
		p := normalizePath([]byte(uri))
		if !strings.HasPrefix(p, "/") {
			t.Fatalf("normalizePath(%q) = %q: no leading slash", uri, p)
		}
		if strings.Contains(p, "//") {
			t.Fatalf("normalizePath(%q) = %q: empty segment", uri, p)
		}
		for _, seg := range strings.Split(p, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("normalizePath(%q) = %q: dot segment", uri, p)
			}
		}
	})
}

// FuzzAuth sends requests with arbitrary forwarded headers through the
// whole handler: it never panics or hangs, and answers only with the
// statuses README lists.
func FuzzAuth(f *testing.F) {
	f.Add("203.0.113.7", "", "/login?x=1", "POST", "api.example.com", "k1", "3")
	f.Add("garbage, 10.0.0.5", "198.51.100.1", "//x/../login", "post", "API.example.com:8080", "", "abc")
	f.Add(strings.Repeat("1.1.1.1,", 100), "\xff", "%zz", "\x00", "[::1]", strings.Repeat("k", 300), "-1")
	rules, err := ParseRules("name=per-ip limit=3/1m; name=login key=ip+header:X-Api-Key limit=2/1m path=/login on_missing=deny;" +
		"name=cost key=header:X-Api-Key limit=10/1m algorithm=token_bucket cost=header:X-Cost host=*.example.com")
	if err != nil {
		f.Fatal(err)
	}
	h, err := New(Options{Rules: rules, Store: algo.NewMemory(algo.MemoryOptions{SweepInterval: -1}), TrustedProxies: defaultTrusted,
		BlockCIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Sleep: func(time.Duration) {}})
	if err != nil {
		f.Fatal(err)
	}
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
		default:
			t.Fatalf("status %d for %q %q %q %q %q %q %q", ctx.Response.StatusCode(), xff, realIP, uri, method, host, apiKey, cost)
		}
	})
}
