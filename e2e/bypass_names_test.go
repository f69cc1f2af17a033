//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// The bypass tests of other spellings: a trailing slash against a
// regular-expression path rule, HEAD against a GET rule, a method-override
// header against a rule for the method it names, and a header name with
// '_' for '-'.

// namesProxies are the proxies these tests run behind: nginx drops header
// names with '_', Caddy and Traefik forward them, and HAProxy's SPOE sends
// them.
var namesProxies = []string{"nginx", "caddy", "traefik", "haproxy-spoe"}

// rawDoMethod is rawDo for a request whose answer is read as an answer to
// method (a HEAD's has no body).
func rawDoMethod(t *testing.T, ip, addr, method, req string) result {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ip, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("%q from %s: %v", firstLine(req), ip, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%q from %s: %v", firstLine(req), ip, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// TestBypassRegexTrailingSlash: a regular-expression path rule applies to
// the path with a trailing slash (or "/."), which backends route as the
// path without it.
func TestBypassRegexTrailingSlash(t *testing.T) {
	forProxies(t, namesProxies, func(t *testing.T, px proxy) {
		s := newStack(t, px, "name=up key=ip limit=2/1m path=~^/api/v[0-9]+/upload$", "")
		get := func(path string) result {
			return rawDo(t, "127.0.2.1", s.proxy[0], rawRequest("GET "+path+" HTTP/1.1", "", "Host", "localhost"))
		}
		for _, path := range []string{"/api/v1/upload/", "/api/v1/upload/."} {
			if r := get(path); r.status != 200 {
				t.Fatalf("GET %s: %d %q", path, r.status, firstLine(r.body))
			}
		}
		for _, path := range []string{"/api/v1/upload", "/api/v1/upload/", "/API/v1/upload//"} {
			checkDenial(t, px, "GET "+path+" after 2 of 2", get(path), "rate-limited")
		}
		if r := get("/api/v1/upload/x"); r.status != 200 {
			t.Errorf("GET /api/v1/upload/x: %d, want 200 (not the rule's path)", r.status)
		}
	})
}

// TestBypassHeadAndMethodOverride: a rule for GET applies to HEAD, and on a
// POST a rule for the method X-HTTP-Method-Override (or X-Method-Override,
// X-HTTP-Method) names applies too: backends route by both.
func TestBypassHeadAndMethodOverride(t *testing.T) {
	forProxies(t, namesProxies, func(t *testing.T, px proxy) {
		s := newStack(t, px, "name=get key=ip limit=2/1m method=GET path=/get; name=del key=ip limit=1/1m method=DELETE path=/del", "")
		do := func(method, path string, headers ...string) result {
			return rawDoMethod(t, "127.0.2.2", s.proxy[0], method, rawRequest(method+" "+path+" HTTP/1.1", "", append([]string{"Host", "localhost"}, headers...)...))
		}
		for i := 0; i < 2; i++ {
			if r := do("HEAD", "/get"); r.status != 200 {
				t.Fatalf("HEAD /get %d: %d", i+1, r.status)
			}
		}
		checkDenial(t, px, "GET /get after 2 HEADs", do("GET", "/get"), "rate-limited")
		if r := do("HEAD", "/get"); r.status != 429 {
			t.Errorf("HEAD /get after 2 of 2: %d, want 429", r.status)
		}

		if r := do("POST", "/del", "X-HTTP-Method-Override", "DELETE"); r.status != 200 {
			t.Fatalf("POST /del standing for DELETE: %d %q", r.status, firstLine(r.body))
		}
		checkDenial(t, px, "DELETE /del after 1 of 1", do("DELETE", "/del"), "rate-limited")
		for _, h := range []string{"X-HTTP-Method-Override", "X-Method-Override", "X-HTTP-Method"} {
			checkDenial(t, px, "POST /del with "+h+": delete", do("POST", "/del", h, "delete"), "rate-limited")
		}
		if r := do("POST", "/del"); r.status != 200 {
			t.Errorf("a plain POST /del: %d, want 200 (no rule for POST)", r.status)
		}
	})
}

// TestBypassUnderscoreHeader: behind Caddy and Traefik, which forward
// header names with '_', X_Api_Key reaches a CGI-style backend as
// HTTP_X_API_KEY, as X-Api-Key does: authlimit counts it as X-Api-Key, and
// refuses the two together as a repeated header. nginx drops such names:
// behind it nothing changes.
func TestBypassUnderscoreHeader(t *testing.T) {
	forProxies(t, namesProxies, func(t *testing.T, px proxy) {
		s := newStack(t, px, "name=apikey key=header:X-Api-Key limit=2/1m path=/api", "")
		get := func(headers ...string) result {
			return rawDo(t, "127.0.2.3", s.proxy[0], rawRequest("GET /api HTTP/1.1", "", append([]string{"Host", "localhost"}, headers...)...))
		}
		if px.name == "nginx" {
			// Dropped: the rule does not apply, and the backend never
			// sees the header either.
			for i := 0; i < 3; i++ {
				if r := get("X_Api_Key", "victim"); r.status != 200 {
					t.Fatalf("X_Api_Key victim %d behind nginx: %d, want 200", i+1, r.status)
				}
			}
			for i := 0; i < 2; i++ {
				if r := get("X_Api_Key", "victim", "X-Api-Key", "victim"); r.status != 200 {
					t.Fatalf("X_Api_Key and X-Api-Key victim %d behind nginx: %d, want 200", i+1, r.status)
				}
			}
			checkDenial(t, px, "X-Api-Key victim after 2 of 2", get("X-Api-Key", "victim"), "rate-limited")
			return
		}
		for i := 0; i < 2; i++ {
			if r := get("X_Api_Key", "victim"); r.status != 200 {
				t.Fatalf("X_Api_Key victim %d: %d %q", i+1, r.status, firstLine(r.body))
			}
		}
		checkDenial(t, px, "X-Api-Key victim after X_Api_Key's 2", get("X-Api-Key", "victim"), "rate-limited")
		checkDenial(t, px, "x_api_key victim after 2 of 2", get("x_api_key", "victim"), "rate-limited")
		for i := 0; i < 3; i++ {
			fresh := fmt.Sprintf("fresh%d", i)
			checkDenial(t, px, "X_Api_Key victim with X-Api-Key "+fresh, get("X_Api_Key", "victim", "X-Api-Key", fresh), "repeated-header")
			checkDenial(t, px, "X-Api-Key "+fresh+" with X_Api_Key victim", get("X-Api-Key", fresh, "X_Api_Key", "victim"), "repeated-header")
		}
		if got := s.backend.count("/api"); got != 2 {
			t.Errorf("%d requests reached /api, want 2", got)
		}
	})
}
