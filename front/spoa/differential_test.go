package spoa

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/handler"
	"github.com/authlimit/authlimit/rules"
)

// The differential test: every request of the bypass corpus (the e2e
// bypass tests' paths, methods, header spellings, repeated headers,
// forwarding headers, byte counts, tiers and hosts) decided by the agent,
// as HAProxy asks it with haproxy/spoe-authlimit.conf, and by /auth, as
// haproxy/authlimit.lua asks it, each with a store of its own on the same
// clock: same status, same headers, same body, request after request, so
// that every count agrees too.

// differentialRules apply to the corpus's paths.
const differentialRules = `
name=per-ip key=ip limit=40/1m
name=login key=ip limit=2/1m path=/login method=POST
name=api key=header:X-Api-Key limit=3/1m path=/api tier=header:X-Plan
tier rule=api name=pro limit=5/1m
name=ua key=header:User-Agent limit=1/1m path=/ua
name=accept key=header:Accept limit=1/1m path=/accept on_missing=deny
name=ct key=header:Content-Type limit=1/1m path=/ct
name=cookie key=header:Cookie limit=1/1m path=/cookie
name=ae key=header:Accept-Encoding limit=1/1m path=/ae
name=cost key=ip limit=10/1m cost=header:X-Cost path=/cost
name=upload key=ip limit=12000/1h cost=header:X-Original-Content-Length cost_missing=deny method=POST,PUT path=/upload
name=stream key=ip limit=5000/1h cost=header:X-Original-Content-Length cost_missing=2000 method=POST,PUT path=/stream
name=hosted key=ip limit=2/1m host=api.example.com path=/h
name=byhost key=host limit=2/1m path=/k
name=get key=ip limit=2/1m method=GET path=/get
name=del key=ip limit=1/1m method=DELETE path=/del
name=proto key=header:X-Forwarded-Proto limit=1/1m path=/proto
name=up key=ip limit=2/1m path=~^/api/v[0-9]+/upload$
name=forwarded key=header:X-Forwarded-For limit=2/1m path=/xff
`

// luaRequest is the /auth request haproxy/authlimit.lua sends for c: the
// client's headers but those it drops (Host, Content-Length, the
// hop-by-hop ones, X-Forwarded-*, X-Original-*, X-Real-IP, Forwarded,
// '_' spellings alike), each line kept; User-Agent and Accept empty when
// the client sent none in any spelling; and what HAProxy states itself.
func (c clientRequest) luaRequest() string {
	dropped := map[string]bool{"host": true, "content-length": true, "transfer-encoding": true, "connection": true,
		"keep-alive": true, "proxy-connection": true, "te": true, "trailer": true, "upgrade": true, "expect": true,
		"x-real-ip": true, "forwarded": true}
	var b strings.Builder
	b.WriteString("GET /auth HTTP/1.1\r\nHost: authlimit\r\n")
	seen := map[string]bool{}
	length := ""
	for i := 0; i+1 < len(c.headers); i += 2 {
		name := strings.ToLower(c.headers[i])
		folded := strings.ReplaceAll(name, "_", "-")
		seen[folded] = true
		if name == "content-length" {
			length = c.headers[i+1]
		}
		if dropped[folded] || strings.HasPrefix(folded, "x-forwarded-") || strings.HasPrefix(folded, "x-original-") {
			continue
		}
		fmt.Fprintf(&b, "%s: %s\r\n", name, c.headers[i+1])
	}
	for _, name := range []string{"user-agent", "accept"} {
		if !seen[name] {
			fmt.Fprintf(&b, "%s: \r\n", name)
		}
	}
	uri, ok := c.pathq()
	if !ok {
		uri = c.target
	}
	proto := "http"
	if c.https {
		proto = "https"
	}
	fmt.Fprintf(&b, "x-forwarded-for: %s\r\nx-forwarded-method: %s\r\nx-forwarded-uri: %s\r\nx-forwarded-proto: %s\r\n", c.src, c.method, uri, proto)
	if h, ok := c.host(); ok {
		fmt.Fprintf(&b, "x-forwarded-host: %s\r\n", h)
	}
	if length != "" {
		fmt.Fprintf(&b, "x-original-content-length: %s\r\n", length)
	}
	b.WriteString("\r\n")
	return b.String()
}

// auth decides raw with h, as read from HAProxy's connection.
func auth(t *testing.T, h *handler.Handler, raw string) answer {
	t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("read %q: %v", raw, err)
	}
	h.Serve(&ctx)
	a := answer{status: ctx.Response.StatusCode(), headers: map[string]string{}}
	for _, name := range []string{"RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "Retry-After"} {
		if v := ctx.Response.Header.Peek(name); len(v) > 0 {
			a.headers[name] = string(v)
		}
	}
	if a.status != 200 {
		// The agent's body is /auth's without its final newline.
		a.body = strings.TrimSuffix(string(ctx.Response.Body()), "\n")
	}
	return a
}

// differentialCorpus is the requests, in order: each group spends a quota
// and then tries to get around it.
func differentialCorpus() []clientRequest {
	var c []clientRequest
	add := func(rs ...clientRequest) { c = append(c, rs...) }
	post := func(src, path string, headers ...string) clientRequest {
		r := get(src, path, headers...)
		r.method = "POST"
		return r
	}

	// Forwarding headers: a spoofed client address, path, method or host
	// moves nothing.
	spoof := []string{"X-Forwarded-For", "198.51.100.9", "X-Real-IP", "198.51.100.9", "X-Forwarded-Uri", "/public",
		"X-Forwarded-Method", "GET", "X-Original-URI", "/public", "X-Forwarded-Host", "elsewhere.example",
		"Forwarded", "for=198.51.100.9", "X_Forwarded_For", "198.51.100.10"}
	for i := 0; i < 3; i++ {
		add(post("203.0.113.1", "/login", spoof...))
	}
	for _, p := range []string{"/login", "/login?next=/", "//login", "/x/../login", "/log%69n", "/LOGIN", "/Login/", "/login;jsessionid=x/", "/%4Cogin", "/x/..;/login", "/login;/step2", `/login\`} {
		add(post("203.0.113.1", p, spoof...))
	}
	add(get("203.0.113.1", "/logins"), post("203.0.113.2", "http://api.example.com/login"), post("203.0.113.2", "/login"), post("203.0.113.2", "/login"))
	for i := 0; i < 3; i++ {
		add(get("203.0.113.3", "/xff", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i)))
	}

	// Repeated and respelled key headers.
	for _, v := range []string{"k1", "k1", "k1", "k1"} {
		add(get("203.0.113.4", "/api", "X-Api-Key", v))
	}
	add(get("203.0.113.4", "/api", "X-Api-Key", "k2", "X-Api-Key", "k3"),
		get("203.0.113.4", "/api", "X_Api_Key", "k2"),
		get("203.0.113.4", "/api", "x-api-key", "k2", "X_API_KEY", "k4"),
		get("203.0.113.4", "/api", "X-Api-Key", "k2", "X-Api-Key", ""),
		get("203.0.113.4", "/api", "X-API-KEY", "k2"))
	// Tiers: the trusted peer's X-Plan is believed, spelled as it may be.
	for i := 0; i < 6; i++ {
		add(get("203.0.113.5", "/api", "X-Api-Key", "k-pro", "X-Plan", "pro"))
	}
	add(get("203.0.113.5", "/api", "X-Api-Key", "k-pro", "x_plan", "pro"), get("203.0.113.5", "/api", "X-Api-Key", "k-pro", "X-Plan", "pro", "X-Plan", "free"))
	for _, h := range []string{"User-Agent", "Content-Type", "Cookie", "Accept-Encoding", "Accept"} {
		path := map[string]string{"User-Agent": "/ua", "Content-Type": "/ct", "Cookie": "/cookie", "Accept-Encoding": "/ae", "Accept": "/accept"}[h]
		add(get("203.0.113.6", path, h, "victim"), get("203.0.113.6", path, h, "victim"),
			get("203.0.113.6", path, h, "victim", h, "r1"), get("203.0.113.6", path, h, "r2", h, "victim"),
			get("203.0.113.6", path, h, "fresh", h, ""), get("203.0.113.6", path, strings.ReplaceAll(h, "-", "_"), "other"),
			get("203.0.113.7", path))
	}
	// Costs.
	add(get("203.0.113.8", "/cost", "X-Cost", "5", "X-Cost", "1"), get("203.0.113.8", "/cost", "X-Cost", "10"),
		get("203.0.113.8", "/cost", "X-Cost", "1"), get("203.0.113.9", "/cost", "X-Cost", "-1"), get("203.0.113.9", "/cost", "X-Cost", "abc"),
		get("203.0.113.9", "/cost", "X-Cost", "0"), get("203.0.113.9", "/cost", "X_Cost", "11"))
	// Byte counts: the length HAProxy forwards, whatever the client claims.
	for i := 0; i < 3; i++ {
		add(post("203.0.113.10", "/upload", "Content-Length", "5000", "X-Original-Content-Length", "1"))
	}
	add(post("203.0.113.10", "/upload", "Content-Length", "0"), post("203.0.113.11", "/upload", "Content-Length", "20000"),
		post("203.0.113.12", "/upload", "Transfer-Encoding", "chunked", "X-Original-Content-Length", "1"),
		post("203.0.113.12", "/stream", "Transfer-Encoding", "chunked"), post("203.0.113.12", "/stream", "Transfer-Encoding", "chunked"),
		post("203.0.113.12", "/stream", "Transfer-Encoding", "chunked"), post("203.0.113.12", "/stream", "Content-Length", "1000"),
		post("203.0.113.12", "/stream", "Content-Length", "1"))
	// Methods: HEAD is GET; an override header names the method.
	head := get("203.0.113.13", "/get")
	head.method = "HEAD"
	add(head, head, get("203.0.113.13", "/get"), head)
	add(post("203.0.113.13", "/del", "X-HTTP-Method-Override", "DELETE"), post("203.0.113.13", "/del", "X-Method-Override", "delete"),
		post("203.0.113.13", "/del", "X-HTTP-Method", "delete"), post("203.0.113.13", "/del"))
	del := get("203.0.113.13", "/del")
	del.method = "delete"
	add(del)
	// Hosts: the Host header, in any spelling; X-Forwarded-Host is HAProxy's.
	for i, h := range []string{"api.example.com", "API.Example.com", "api.example.com:80", "api.example.com."} {
		r := get("203.0.113.14", "/h", "X-Forwarded-Host", fmt.Sprintf("r%d.example", i))
		r.headers[1] = h
		add(r)
	}
	for i := 0; i < 3; i++ {
		r := get(fmt.Sprintf("203.0.113.%d", 20+i), "/k", "X-Forwarded-Host", fmt.Sprintf("r%d.example", i))
		r.headers[1] = "api.example.com"
		add(r)
	}
	noHost := clientRequest{src: "203.0.113.15", method: "GET", target: "/k"}
	add(noHost, noHost, noHost)
	// The scheme is HAProxy's.
	tls := get("203.0.113.16", "/proto", "X-Forwarded-Proto", "a")
	tls.https = true
	add(tls, get("203.0.113.16", "/proto", "X-Forwarded-Proto", "https"), get("203.0.113.17", "/proto", "X_Forwarded_Proto", "b"))
	// Regular expressions against trailing slashes and case.
	for _, p := range []string{"/api/v1/upload/", "/api/v1/upload/.", "/api/v1/upload", "/API/v1/upload//", "/api/v1/upload/x"} {
		add(get("203.0.113.18", p))
	}
	// A target without a path, and IPv6 clients grouped by /64.
	options := get("203.0.113.19", "*")
	options.method = "OPTIONS"
	add(options, get("2001:db8::1", "/api", "X-Api-Key", "v6"), get("2001:db8::2", "/"), get("::ffff:203.0.113.19", "/"))
	return c
}

// TestDifferentialAuth: the agent and /auth agree on the whole corpus.
func TestDifferentialAuth(t *testing.T) {
	if _, err := rules.Parse(differentialRules); err != nil {
		t.Fatal(err)
	}
	p := agentPeer(t, newEngine(t, differentialRules), 16380)
	h, err := handler.New(handler.Options{
		Engine:       newEngine(t, differentialRules),
		Proxies:      rules.Proxies{Trusted: loopback},
		MethodHeader: "X-Forwarded-Method", URIHeader: "X-Forwarded-Uri", HostHeader: "X-Forwarded-Host",
	})
	if err != nil {
		t.Fatal(err)
	}
	corpus := differentialCorpus()
	kinds := map[string]int{}
	for i, c := range corpus {
		got, vars := p.ask(c, uint64(i+1))
		want := auth(t, h, c.luaRequest())
		if got.String() != want.String() {
			t.Errorf("request %d, %s %s from %s with %q:\n agent: %s\n /auth: %s", i+1, c.method, c.target, c.src, c.headers, got, want)
		}
		kinds[string(vars["verdict"].b)+" "+string(vars["reason"].b)]++
	}
	t.Logf("%d requests: %v", len(corpus), kinds)
	// The corpus reaches every outcome it is meant to.
	for _, k := range []string{"allow ", "deny rate-limited", "deny cost-too-high", "invalid repeated-header", "invalid missing-key", "invalid missing-cost", "invalid invalid-cost"} {
		if kinds[k] == 0 {
			t.Errorf("no request of the corpus was %q", k)
		}
	}
}
