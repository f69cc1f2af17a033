//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests run nginx/openresty.conf with nginx/authlimit.lua in front of
// a scripted auth server instead of authlimit: it records the requests the
// module sends and answers each with the bytes a test chose, well-formed
// or not, so that what authlimit gets and what a client gets for every
// kind of answer are checked on the wire.

// scriptedAuth is an HTTP/1.1 server on loopback answering each request by
// the path of its X-Forwarded-Uri, with 200 and no body for a path it has
// no answer for.
type scriptedAuth struct {
	addr    string
	answers map[string]func(c net.Conn) (keep bool)
	mu      sync.Mutex
	reqs    []*http.Request
	conns   int
}

func startScriptedAuth(t *testing.T, answers map[string]func(c net.Conn) bool) *scriptedAuth {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveScriptedAuth(t, l, l.Addr().String(), answers)
}

// serveScriptedAuth serves answers on l, which addr names.
func serveScriptedAuth(t *testing.T, l net.Listener, addr string, answers map[string]func(c net.Conn) bool) *scriptedAuth {
	t.Helper()
	s := &scriptedAuth{addr: addr, answers: answers}
	var wg sync.WaitGroup
	var open sync.Map
	t.Cleanup(func() {
		l.Close()
		open.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			s.mu.Unlock()
			open.Store(c, nil)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer open.Delete(c)
				defer c.Close()
				s.serve(c)
			}()
		}
	}()
	return s
}

func (s *scriptedAuth) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		s.mu.Unlock()
		path, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Uri"), "?")
		answer := s.answers[path]
		if answer == nil {
			answer = raw("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
		}
		if !answer(c) {
			return
		}
	}
}

// last returns the last request received for path.
func (s *scriptedAuth) last(t *testing.T, path string) *http.Request {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.reqs) - 1; i >= 0; i-- {
		if p, _, _ := strings.Cut(s.reqs[i].Header.Get("X-Forwarded-Uri"), "?"); p == path {
			return s.reqs[i]
		}
	}
	t.Fatalf("the auth server got no request for %s", path)
	return nil
}

func (s *scriptedAuth) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.reqs {
		if p, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Uri"), "?"); p == path {
			n++
		}
	}
	return n
}

func (s *scriptedAuth) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// raw answers with b and keeps the connection.
func raw(b string) func(net.Conn) bool {
	return func(c net.Conn) bool {
		_, err := io.WriteString(c, b)
		return err == nil
	}
}

// rawThenClose answers with b and closes the connection.
func rawThenClose(b string) func(net.Conn) bool {
	return func(c net.Conn) bool {
		_, _ = io.WriteString(c, b)
		return false
	}
}

// byteByByte answers with b one byte per write.
func byteByByte(b string) func(net.Conn) bool {
	return func(c net.Conn) bool {
		for i := 0; i < len(b); i++ {
			if _, err := c.Write([]byte{b[i]}); err != nil {
				return false
			}
			time.Sleep(time.Millisecond)
		}
		return true
	}
}

// startOpenResty runs nginx/openresty.conf with nginx/authlimit.lua in front
// of auth and a backend, with the fail behaviour given ("closed" or
// "open") and the read timeout in milliseconds.
func startOpenResty(t *testing.T, auth string, unreachable string, readTimeout int) (addr string, b *backend) {
	t.Helper()
	if err := bins.missing["openresty"]; err != nil {
		t.Fatalf("openresty is not available: %v", err)
	}
	b = startBackend(t)
	dir := t.TempDir()
	addr = freeAddr(t)
	site := openrestySite(t, dir, auth, b.addr, addr)
	site = render2(t, site, "read_timeout = 65000,", fmt.Sprintf("read_timeout = %d,", readTimeout))
	site = render2(t, site, "set $authlimit_unreachable closed;", "set $authlimit_unreachable "+unreachable+";")
	runNginx(t, "openresty", dir, addr, site, true)
	return addr, b
}

// TestOpenRestyRequestToAuthlimit: what authlimit gets from
// nginx/authlimit.lua is nginx's own account of the request (client
// address, method, URI, host, scheme, body length), whatever the client
// sent under those names, and every other header line of the client as it
// came: repeats as repeats, past the 100 headers ngx.req.get_headers reads
// by default, and no Content-Length (the request to authlimit has no body).
func TestOpenRestyRequestToAuthlimit(t *testing.T) {
	auth := startScriptedAuth(t, nil)
	addr, b := startOpenResty(t, auth.addr, "closed", 65000)

	headers := []string{"Host", "Example.test:8080", "Content-Length", "5", "Content-Type", "text/plain",
		"X-Forwarded-For", "198.51.100.1", "X-Real-IP", "198.51.100.2", "Forwarded", "for=198.51.100.3",
		"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/public", "X-Forwarded-Host", "elsewhere.example",
		"X-Forwarded-Proto", "https", "X-Forwarded-Port", "443", "X-Original-URI", "/public",
		"X-Original-URL", "http://elsewhere.example/public", "X-Original-Content-Length", "1",
		"Keep-Alive", "timeout=5", "TE", "trailers", "Upgrade", "h2c",
		"User-Agent", "ua-1", "User-Agent", "ua-2", "Via", "1.1 a", "Via", "1.1 b"}
	for i := 0; i < 120; i++ {
		headers = append(headers, fmt.Sprintf("X-Filler-%d", i), "f")
	}
	headers = append(headers, "X-Api-Key", "k1", "x-api-key", "k2")
	r := rawDo(t, "127.0.3.1", addr, rawRequest("POST /wire?q=1&r=%2F HTTP/1.1", "hello", headers...))
	if r.status != 200 {
		t.Fatalf("POST /wire: %d %q, want 200", r.status, firstLine(r.body))
	}
	if got := b.count("/wire"); got != 1 {
		t.Fatalf("%d requests reached the backend, want 1", got)
	}

	got := auth.last(t, "/wire")
	if got.Method != "GET" || got.URL.Path != "/auth" {
		t.Errorf("request line %s %s, want GET /auth", got.Method, got.URL.Path)
	}
	if host, _, _ := strings.Cut(auth.addr, ":"); got.Host != host {
		t.Errorf("Host %q, want authlimit's own %q", got.Host, host)
	}
	if got.ContentLength != 0 || len(got.TransferEncoding) != 0 {
		t.Errorf("the request to authlimit has a body: Content-Length %d, Transfer-Encoding %v", got.ContentLength, got.TransferEncoding)
	}
	for name, want := range map[string][]string{
		"X-Forwarded-For":           {"127.0.3.1"},
		"X-Forwarded-Method":        {"POST"},
		"X-Forwarded-Uri":           {"/wire?q=1&r=%2F"},
		"X-Forwarded-Host":          {"example.test"},
		"X-Forwarded-Proto":         {"http"},
		"X-Original-Content-Length": {"5"},
		"User-Agent":                {"ua-1", "ua-2"},
		"Via":                       {"1.1 a", "1.1 b"},
		"X-Api-Key":                 {"k1", "k2"},
		"Content-Type":              {"text/plain"},
		"X-Filler-119":              {"f"},
		"X-Real-Ip":                 nil,
		"Forwarded":                 nil,
		"X-Forwarded-Port":          nil,
		"X-Original-Uri":            nil,
		"X-Original-Url":            nil,
		"Keep-Alive":                nil,
		"Te":                        nil,
		"Upgrade":                   nil,
		"Content-Length":            nil,
	} {
		if vals := got.Header.Values(name); strings.Join(vals, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: %q, want %q", name, vals, want)
		}
	}

	// A chunked upload has no length: none is stated, and the client's
	// own is dropped.
	r = rawDo(t, "127.0.3.1", addr, rawRequest("POST /chunked HTTP/1.1", "5\r\nhello\r\n0\r\n\r\n",
		"Host", "localhost", "Transfer-Encoding", "chunked", "X-Original-Content-Length", "1"))
	if r.status != 200 {
		t.Fatalf("chunked POST: %d %q, want 200", r.status, firstLine(r.body))
	}
	got = auth.last(t, "/chunked")
	if vals := got.Header.Values("X-Original-Content-Length"); len(vals) != 0 {
		t.Errorf("chunked POST: X-Original-Content-Length %q, want none", vals)
	}
	if vals := got.Header.Values("Transfer-Encoding"); len(vals) != 0 || len(got.TransferEncoding) != 0 {
		t.Errorf("chunked POST: the client's Transfer-Encoding reached authlimit")
	}
}

// denialBody is a problem+json body as authlimit writes one.
const denialBody = `{"type":"urn:authlimit:rate-limited","title":"Too Many Requests","status":429}`

// TestOpenRestyAnswers: every answer the auth server can give has a defined
// outcome behind nginx/authlimit.lua. Well-formed ones, however framed
// (Content-Length, chunked, until close, written a byte at a time), are
// relayed: a denial with its status, headers and body, an allowed request
// with its rate-limit headers. Malformed ones, a connection closed or
// silent, fail as unreachable: 503 with $authlimit_unreachable closed, the
// backend with open. A connection that gave a bad answer is never used
// again, nor one whose answer ends it (Connection: close, HTTP/1.0, bytes
// after the answer), and good answers keep theirs.
func TestOpenRestyAnswers(t *testing.T) {
	chunkedDenial := "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/problem+json\r\nRetry-After: 7\r\n" +
		"X-RateLimit-Remaining: 0\r\nTransfer-Encoding: chunked\r\n\r\n" +
		fmt.Sprintf("%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n", 10, denialBody[:10], len(denialBody)-10, denialBody[10:])
	clDenial := "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/problem+json\r\nRetry-After: 7\r\n" +
		"X-RateLimit-Remaining: 0\r\nContent-Length: " + strconv.Itoa(len(denialBody)) + "\r\n\r\n" + denialBody
	allowed := "HTTP/1.1 200 OK\r\nX-RateLimit-Remaining: 41\r\nRateLimit-Policy: \"p\";q=42;w=60\r\nContent-Length: 0\r\n\r\n"
	cases := []struct {
		path   string
		answer func(net.Conn) bool
		// relayed: the answer's status reaches the client (0: the
		// answer is bad, and the client gets the fail behaviour).
		relayed   int
		remaining string // X-RateLimit-Remaining the client sees
	}{
		{"/cl-denial", raw(clDenial), 429, "0"},
		{"/chunked-denial", raw(chunkedDenial), 429, "0"},
		{"/byte-denial", byteByByte(chunkedDenial), 429, "0"},
		{"/close-denial", rawThenClose("HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/problem+json\r\nRetry-After: 7\r\nX-RateLimit-Remaining: 0\r\nConnection: close\r\n\r\n" + denialBody), 429, "0"},
		{"/http10-denial", rawThenClose("HTTP/1.0 429 Too Many Requests\r\nContent-Type: application/problem+json\r\nRetry-After: 7\r\nX-RateLimit-Remaining: 0\r\nContent-Length: " + strconv.Itoa(len(denialBody)) + "\r\n\r\n" + denialBody), 429, "0"},
		{"/allowed", raw(allowed), 200, "41"},
		{"/byte-allowed", byteByByte(allowed), 200, "41"},
		{"/chunked-allowed", raw("HTTP/1.1 204 No Content\r\nX-RateLimit-Remaining: 41\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 200, "41"},
		// Lines may end in a bare LF.
		{"/lf-only", raw("HTTP/1.1 200 OK\nX-RateLimit-Remaining: 41\nContent-Length: 0\n\n"), 200, "41"},
		// Bytes after the answer: it is relayed, and the connection
		// closed, so the next request never reads them as its answer.
		{"/extra-bytes-close", raw(allowed + "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n"), 200, "41"},
		{"/unavailable", raw("HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/problem+json\r\nContent-Length: 2\r\n\r\n{}"), 503, ""},

		{"/not-http", rawThenClose("SSH-2.0-OpenSSH\r\n\r\n"), 0, ""},
		{"/bad-status", raw("HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/status-4-digits", raw("HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/http2", raw("HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/continue", raw("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/status-600", raw("HTTP/1.1 600 What\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/no-colon", raw("HTTP/1.1 200 OK\r\nX-RateLimit-Remaining 5\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/bad-name", raw("HTTP/1.1 200 OK\r\nX Rate: 5\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/cr-in-line", raw("HTTP/1.1 200 OK\r\nX-RateLimit-Remaining: 4\r1\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/folded", raw("HTTP/1.1 200 OK\r\nX-RateLimit-Remaining: 5\r\n 6\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/many-headers", raw("HTTP/1.1 200 OK\r\n" + strings.Repeat("X-A: b\r\n", 101) + "Content-Length: 0\r\n\r\n"), 0, ""},
		{"/long-line", raw("HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("b", 9000) + "\r\nContent-Length: 0\r\n\r\n"), 0, ""},
		{"/cl-letters", raw("HTTP/1.1 429 Too Many Requests\r\nContent-Length: 1x\r\n\r\n{}"), 0, ""},
		{"/cl-negative", raw("HTTP/1.1 429 Too Many Requests\r\nContent-Length: -1\r\n\r\n{}"), 0, ""},
		{"/cl-twice", raw("HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"), 0, ""},
		{"/cl-too-big", raw("HTTP/1.1 429 Too Many Requests\r\nContent-Length: 70000\r\n\r\n" + strings.Repeat("x", 70000)), 0, ""},
		{"/cl-short", rawThenClose("HTTP/1.1 429 Too Many Requests\r\nContent-Length: 100\r\n\r\n{}"), 0, ""},
		{"/te-gzip", raw("HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"), 0, ""},
		{"/te-and-cl", raw("HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"), 0, ""},
		{"/chunk-not-hex", raw("HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"), 0, ""},
		{"/chunk-no-crlf", raw("HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}xx\r\n0\r\n\r\n"), 0, ""},
		{"/chunk-too-big", raw("HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n11170\r\n" + strings.Repeat("x", 70000) + "\r\n0\r\n\r\n"), 0, ""},
		{"/chunk-cut", rawThenClose("HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{}"), 0, ""},
		{"/until-close-too-big", rawThenClose("HTTP/1.1 429 Too Many Requests\r\n\r\n" + strings.Repeat("x", 70000)), 0, ""},
		{"/closed", func(net.Conn) bool { return false }, 0, ""},
		{"/headers-cut", rawThenClose("HTTP/1.1 200 OK\r\nX-RateLimit-Remaining: 5\r\n"), 0, ""},
		{"/silent", func(c net.Conn) bool {
			_, _ = io.Copy(io.Discard, c) // until nginx gives up and closes
			return false
		}, 0, ""},
	}
	answers := map[string]func(net.Conn) bool{}
	for _, tc := range cases {
		answers[tc.path] = tc.answer
	}
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) {
			auth := startScriptedAuth(t, answers)
			addr, b := startOpenResty(t, auth.addr, mode, 3000) // a read_timeout a loaded machine still meets
			c := newClient("127.0.3.2")
			for _, tc := range cases {
				before := auth.connections()
				start := time.Now()
				r := c.do(t, "GET", "http://"+addr+tc.path, nil)
				reached := b.count(tc.path) == 1
				switch {
				case tc.relayed == 200:
					if r.status != 200 || !reached {
						t.Errorf("%s: %d %q (backend reached: %v), want the backend's 200", tc.path, r.status, firstLine(r.body), reached)
					}
				case tc.relayed != 0:
					if r.status != tc.relayed || reached {
						t.Errorf("%s: %d %q (backend reached: %v), want the relayed %d", tc.path, r.status, firstLine(r.body), reached, tc.relayed)
					}
					if tc.relayed == 429 {
						if r.body != denialBody || r.header.Get("Content-Type") != "application/problem+json" || r.header.Get("Retry-After") != "7" {
							t.Errorf("%s: body %q, Content-Type %q, Retry-After %q, want the auth server's", tc.path, r.body, r.header.Get("Content-Type"), r.header.Get("Retry-After"))
						}
					}
				case mode == "open":
					if r.status != 200 || !reached {
						t.Errorf("%s, failing open: %d %q (backend reached: %v), want the backend's 200", tc.path, r.status, firstLine(r.body), reached)
					}
				default:
					if r.status != 503 || reached {
						t.Errorf("%s, failing closed: %d %q (backend reached: %v), want 503", tc.path, r.status, firstLine(r.body), reached)
					}
				}
				if got := r.header.Get("X-RateLimit-Remaining"); got != tc.remaining {
					t.Errorf("%s: X-RateLimit-Remaining %q, want %q", tc.path, got, tc.remaining)
				}
				// A pooled connection found closed before any answer
				// is replaced once (authlimit closes its idle ones at
				// shutdown): /closed, asked on the connection the
				// previous request left in the pool, is asked twice.
				// Any other failure is never asked again: it may have
				// been counted.
				want := 1
				if tc.path == "/closed" {
					want = 2
				}
				if n := auth.count(tc.path); n != want {
					t.Errorf("%s: the auth server got %d requests, want %d", tc.path, n, want)
				}
				if tc.path == "/silent" && time.Since(start) > 20*time.Second {
					t.Errorf("/silent took %v with read_timeout 3s", time.Since(start))
				}
				// The next request must not inherit this one's
				// connection if its answer was bad.
				r = c.do(t, "GET", "http://"+addr+"/after"+tc.path, nil)
				if r.status != 200 {
					t.Errorf("the request after %s: %d %q, want 200", tc.path, r.status, firstLine(r.body))
				}
				if tc.relayed == 0 && auth.connections() == before {
					t.Errorf("after the bad answer to %s, nginx kept using its connection", tc.path)
				}
				if tc.relayed != 0 && strings.Contains(tc.path, "close") && auth.connections() == before {
					t.Errorf("after the answer to %s, which ends its connection, nginx kept using it", tc.path)
				}
			}
			// Good answers kept their connections: one per bad
			// answer and per answer that said close, a few more at most.
			closing := 0
			for _, tc := range cases {
				if tc.relayed == 0 || strings.Contains(tc.path, "close") || strings.Contains(tc.path, "http10") {
					closing++
				}
			}
			if n := auth.connections(); n > closing+4 {
				t.Errorf("%d connections for %d requests, %d of them closing theirs: good answers do not keep their connections", n, 2*len(cases), closing)
			}
		})
	}
}

// TestOpenRestyConfigErrors: nginx refuses to start with a bad option of
// nginx/authlimit.lua's configure, and its error names every bad option.
func TestOpenRestyConfigErrors(t *testing.T) {
	if err := bins.missing["openresty"]; err != nil {
		t.Fatalf("openresty is not available: %v", err)
	}
	for _, tc := range []struct {
		name, options string
		want          []string
	}{
		{"unknown and mistyped", `pool_size = "256", poolsize = 2,`,
			[]string{"pool_size must be a number, got string", "unknown option poolsize"}},
		{"bad values", `pool_size = 0, unreachable = "maybe", send_timeout = 1.5, backlog = -1, path = "auth", max_body = 0,`,
			[]string{"pool_size 0 must be a whole number above 0", `unreachable maybe must be "closed" or "open"`,
				"send_timeout 1.5 must be a whole number of milliseconds", "backlog -1 must be a whole number",
				"path auth must start with /", "max_body 0 must be a whole number above 0"}},
		{"bad address", `address = "authlimit",`, []string{"address authlimit is not host:port"}},
		{"port out of range", `address = "127.0.0.1:70000",`, []string{"address 127.0.0.1:70000 is not host:port (port 1-65535)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			site := openrestySite(t, dir, "127.0.0.1:1", "127.0.0.1:2", freeAddr(t))
			site = render2(t, site, "pool_size = 256,", tc.options)
			conf := writeNginxConf(t, dir, site, true)
			// nginx -t skips init_by_lua: start it for real.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bins.nginx, "-p", dir, "-e", dir+"/startup.log", "-c", conf).CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("nginx started with %s", tc.options)
			}
			if err == nil {
				t.Fatalf("nginx accepts %s:\n%s", tc.options, out)
			}
			logged := string(out) + tail(dir+"/startup.log", 20) + tail(dir+"/error.log", 20)
			for _, w := range tc.want {
				if !strings.Contains(logged, w) {
					t.Errorf("nginx with %s: the log lacks %q:\n%s", tc.options, w, logged)
				}
			}
		})
	}
	// The shipped options pass.
	dir := t.TempDir()
	conf := writeNginxConf(t, dir, openrestySite(t, dir, "127.0.0.1:1", "127.0.0.1:2", freeAddr(t)), true)
	if out, err := exec.Command(bins.nginx, "-t", "-p", dir, "-e", dir+"/startup.log", "-c", conf).CombinedOutput(); err != nil {
		t.Errorf("nginx -t rejects the shipped openresty.conf: %v\n%s", err, out)
	}
}

// TestOpenRestyUntokenHeaderName: with ignore_invalid_headers off, nginx
// passes a header name that is not an HTTP token to Lua; authlimit.lua
// refuses the request (400) rather than write it to authlimit.
func TestOpenRestyUntokenHeaderName(t *testing.T) {
	auth := startScriptedAuth(t, nil)
	b := startBackend(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	site := openrestySite(t, dir, auth.addr, b.addr, addr)
	site = render2(t, site, "    listen "+addr+";", "    listen "+addr+";\n    ignore_invalid_headers off;")
	runNginx(t, "openresty", dir, addr, site, true)

	if r := rawDo(t, "127.0.3.3", addr, rawRequest("GET /token HTTP/1.1", "", "Host", "localhost", "X-Api-Key", "k")); r.status != 200 {
		t.Fatalf("GET /token with token names: %d, want 200", r.status)
	}
	r := rawDo(t, "127.0.3.3", addr, rawRequest("GET /untoken HTTP/1.1", "", "Host", "localhost", "X-Api{Key}", "k"))
	if r.status != 400 {
		t.Errorf("GET /untoken with the header name X-Api{Key}: %d %q, want 400", r.status, firstLine(r.body))
	}
	if n := auth.count("/untoken"); n != 0 {
		t.Errorf("authlimit got %d requests with an untoken header name, want 0", n)
	}
	if got := b.count("/untoken"); got != 0 {
		t.Errorf("%d requests with an untoken header name reached the backend", got)
	}
}

// TestOpenRestyUnixSocket: authlimit.lua reaches authlimit on a unix:
// address, with Host localhost.
func TestOpenRestyUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "authlimit.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	deny := "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/problem+json\r\nRetry-After: 7\r\nContent-Length: " + strconv.Itoa(len(denialBody)) + "\r\n\r\n" + denialBody
	auth := serveScriptedAuth(t, l, "unix:"+sock, map[string]func(net.Conn) bool{"/denied": raw(deny)})
	addr, b := startOpenResty(t, auth.addr, "closed", 65000)
	c := newClient("127.0.3.4")
	if r := c.do(t, "GET", "http://"+addr+"/allowed", nil); r.status != 200 || b.count("/allowed") != 1 {
		t.Errorf("GET /allowed over a unix socket: %d, want the backend's 200", r.status)
	}
	if r := c.do(t, "GET", "http://"+addr+"/denied", nil); r.status != 429 || r.body != denialBody {
		t.Errorf("GET /denied over a unix socket: %d %q, want the relayed 429", r.status, r.body)
	}
	if got := auth.last(t, "/allowed"); got.Host != "localhost" {
		t.Errorf("Host %q over a unix socket, want localhost", got.Host)
	}
}

// TestOpenRestyBacklog: with pool_size 1 and backlog 0, a worker opens one
// connection to authlimit at most; a request that finds it busy fails as
// unreachable at once (503), and the next one, once it is free, passes.
func TestOpenRestyBacklog(t *testing.T) {
	release := make(chan struct{})
	held := make(chan struct{}, 1)
	auth := startScriptedAuth(t, map[string]func(net.Conn) bool{
		"/held": func(c net.Conn) bool {
			held <- struct{}{}
			<-release
			return raw("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")(c)
		},
	})
	b := startBackend(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	site := render2(t, openrestySite(t, dir, auth.addr, b.addr, addr), "pool_size = 256,", "pool_size = 1, backlog = 0,")
	runNginx(t, "openresty", dir, addr, site, true)
	c := newClient("127.0.3.5")
	// waitProxy's probe left the one connection idle in the pool.
	done := make(chan result, 1)
	go func() {
		r, err := rawTry("127.0.3.5", addr, rawRequest("GET /held HTTP/1.1", "", "Host", "localhost"))
		if err != nil {
			t.Errorf("GET /held: %v", err)
		}
		done <- r
	}()
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("GET /held never reached the auth server")
	}
	if r := c.do(t, "GET", "http://"+addr+"/busy", nil); r.status != 503 {
		t.Errorf("GET /busy while the only connection is busy: %d %q, want 503", r.status, firstLine(r.body))
	}
	close(release)
	if r := <-done; r.status != 200 {
		t.Errorf("GET /held: %d, want 200", r.status)
	}
	if r := c.do(t, "GET", "http://"+addr+"/free", nil); r.status != 200 {
		t.Errorf("GET /free once the connection is free: %d, want 200", r.status)
	}
	if n := auth.connections(); n != 1 {
		t.Errorf("%d connections with pool_size 1, want 1", n)
	}
}

// rawTry is rawDo that reports errors instead of failing the test, for use
// off the test's goroutine.
func rawTry(ip, addr, req string) (result, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		return result{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(body)}, nil
}

// TestOpenRestyIPv6: authlimit.lua reaches authlimit on an IPv6 address in
// brackets.
func TestOpenRestyIPv6(t *testing.T) {
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	auth := serveScriptedAuth(t, l, l.Addr().String(), nil)
	addr, b := startOpenResty(t, auth.addr, "closed", 65000)
	if r := newClient("127.0.3.6").do(t, "GET", "http://"+addr+"/v6", nil); r.status != 200 || b.count("/v6") != 1 {
		t.Errorf("GET /v6 with authlimit on %s: %d, want the backend's 200", auth.addr, r.status)
	}
	if got := auth.last(t, "/v6"); got.Host != "[::1]" {
		t.Errorf("Host %q, want [::1]", got.Host)
	}
}
