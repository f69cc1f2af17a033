//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/authlimit/authlimit/internal/redistest"
)

// The bypass tests: a client trying to get around a limit behind a real
// proxy with the shipped configuration, with requests net/http will not
// send (a header twice, User-Agent included; a chunked body; an
// absolute-form request line; HTTP/1.0 without Host), written byte by byte.

// bypassProxies are the proxies whose shipped files these tests run:
// nginx/example.conf (auth_request, which replaces authlimit's denial body
// with its own), nginx/openresty.conf (Lua, which relays it) and
// haproxy/haproxy-lua.cfg (Lua, which relays it and passes every copy of a
// header) and haproxy/haproxy.cfg (SPOE, which sends every header line and
// relays the denial).
var bypassProxies = []string{"nginx", "openresty", "haproxy", "haproxy-spoe"}

func proxyNamed(t *testing.T, name string) proxy {
	t.Helper()
	for _, px := range proxies {
		if px.name == name {
			if err := bins.missing[name]; err != nil {
				t.Fatalf("%s is not available: %v", name, err)
			}
			return px
		}
	}
	t.Fatalf("no proxy %q", name)
	return proxy{}
}

// byteCountingProxies are the proxies whose shipped files pass the body's
// length for byte-counting rules: nginx's and OpenResty's as
// X-Original-Content-Length from $content_length, Caddy's from the
// request's Content-Length (header_up), HAProxy's from its Content-Length
// (authlimit.lua, and the headers SPOE sends). Traefik's forwardAuth cannot
// set it.
var byteCountingProxies = []string{"nginx", "openresty", "caddy", "haproxy", "haproxy-spoe"}

// forBypassProxies runs f behind each of bypassProxies, in parallel.
func forBypassProxies(t *testing.T, f func(t *testing.T, px proxy)) {
	forProxies(t, bypassProxies, f)
}

// forProxies runs f behind each of the named proxies, in parallel.
func forProxies(t *testing.T, names []string, f func(t *testing.T, px proxy)) {
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, proxyNamed(t, name))
		})
	}
}

// rawRequest writes an HTTP/1.1 request: the request line, then the
// headers as name, value pairs (repeats kept, none added but Connection:
// close), then the body.
func rawRequest(line, body string, headers ...string) string {
	var b strings.Builder
	b.WriteString(line + "\r\n")
	for i := 0; i+1 < len(headers); i += 2 {
		b.WriteString(headers[i] + ": " + headers[i+1] + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n")
	b.WriteString(body)
	return b.String()
}

// rawDo sends req from the client address ip to addr and reads the answer.
func rawDo(t *testing.T, ip, addr, req string) result {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ip, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	start := time.Now()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("%q from %s: %v", firstLine(req), ip, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%q from %s: %v", firstLine(req), ip, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), elapsed: time.Since(start)}
}

// denial says what a denial must look like behind px: 429; Retry-After
// only when waiting helps (a rate-limited denial); and, where the proxy
// relays authlimit's body (all but nginx auth_request, which writes its
// own), the problem type.
func checkDenial(t *testing.T, px proxy, what string, r result, kind string) {
	t.Helper()
	if r.status != 429 {
		t.Errorf("%s: %d %q, want 429 (%s)", what, r.status, firstLine(r.body), kind)
		return
	}
	retry := r.header.Get("Retry-After")
	if kind == "rate-limited" && retry == "" || kind != "rate-limited" && retry != "" {
		t.Errorf("%s: %s denial with Retry-After %q", what, kind, retry)
	}
	if px.denyStatus == "" && !strings.Contains(r.body, `"type":"urn:authlimit:`+kind+`"`) {
		t.Errorf("%s: body %q, want the problem type urn:authlimit:%s", what, firstLine(r.body), kind)
	}
}

func invalidCount(t *testing.T, a *authlimit) float64 {
	t.Helper()
	// Every front's: behind HAProxy with SPOE the requests come by the
	// agent (front="spoa"), behind the others by /auth (front="http").
	var n float64
	for series, v := range scrape(t, a.addr) {
		if strings.HasPrefix(series, "authlimit_requests_total{") && strings.HasSuffix(series, `result="invalid"}`) {
			n += v
		}
	}
	return n
}

// TestBypassRepeatedHeader: a key or cost header sent twice never gets a
// fresh quota. The proxy forwards every copy and a backend reads one, so
// authlimit refuses such a request (the deny status,
// urn:authlimit:repeated-header, no Retry-After) and counts nothing for it;
// that holds for the headers fasthttp parses itself too (User-Agent,
// Content-Type, Cookie), whose repeats its header API hides, and for the
// list-valued ones a backend may still read one value of (Accept-Encoding,
// Via). nginx/authlimit.lua passes every line of the client's request as
// it came, so behind OpenResty authlimit refuses these too.
func TestBypassRepeatedHeader(t *testing.T) {
	forBypassProxies(t, func(t *testing.T, px proxy) {
		s := newStack(t, px, `
name=apikey key=header:X-Api-Key limit=3/1m path=/api
name=ua key=header:User-Agent limit=1/1m path=/ua
name=ct key=header:Content-Type limit=1/1m path=/ct
name=cookie key=header:Cookie limit=1/1m path=/cookie
name=ae key=header:Accept-Encoding limit=1/1m path=/ae
name=via key=header:Via limit=1/1m path=/via
name=cost key=ip limit=10/1m cost=header:X-Cost path=/cost`, "")
		addr, ip := s.proxy[0], "127.0.1.1"
		get := func(path string, headers ...string) result {
			return rawDo(t, ip, addr, rawRequest("GET "+path+" HTTP/1.1", "", append([]string{"Host", "localhost"}, headers...)...))
		}
		invalid := 0

		// X-Api-Key: k1 three times, then k1 with a random second value.
		for i := 0; i < 3; i++ {
			if r := get("/api", "X-Api-Key", "k1"); r.status != 200 {
				t.Fatalf("X-Api-Key k1, request %d: %d", i+1, r.status)
			}
		}
		for i := 0; i < 3; i++ {
			r := get("/api", "X-Api-Key", "k1", "X-Api-Key", fmt.Sprintf("r%d", i))
			checkDenial(t, px, "X-Api-Key k1 and r"+strconv.Itoa(i), r, "repeated-header")
			invalid++
		}
		checkDenial(t, px, "X-Api-Key k1 after its 3", get("/api", "X-Api-Key", "k1"), "rate-limited")
		// A refused repeat consumed nothing: k2 still has its 3.
		checkDenial(t, px, "X-Api-Key k2 and k3", get("/api", "X-Api-Key", "k2", "X-Api-Key", "k3"), "repeated-header")
		invalid++
		for i := 0; i < 3; i++ {
			if r := get("/api", "X-Api-Key", "k2"); r.status != 200 {
				t.Errorf("X-Api-Key k2, request %d after a refused repeat: %d, want 200", i+1, r.status)
			}
		}
		if got := s.backend.count("/api"); got != 6 {
			t.Errorf("%d requests reached /api, want 6", got)
		}

		// The headers fasthttp keeps one value of, and list-valued ones.
		for _, tc := range []struct{ path, header string }{
			{"/ua", "User-Agent"}, {"/ct", "Content-Type"}, {"/cookie", "Cookie"},
			{"/ae", "Accept-Encoding"}, {"/via", "Via"},
		} {
			victim := "victim"
			if tc.header == "Cookie" {
				victim = "session=victim"
			}
			if r := get(tc.path, tc.header, victim); r.status != 200 {
				t.Fatalf("%s %q: %d", tc.header, victim, r.status)
			}
			checkDenial(t, px, tc.header+" victim again", get(tc.path, tc.header, victim), "rate-limited")
			repeated := func(what string, r result) {
				t.Helper()
				checkDenial(t, px, what, r, "repeated-header")
				invalid++
			}
			for i := 0; i < 3; i++ {
				other := fmt.Sprintf("r%d", i)
				if tc.header == "Cookie" {
					other = "x=" + other
				}
				repeated(tc.header+" victim then "+other, get(tc.path, tc.header, victim, tc.header, other))
				repeated(tc.header+" "+other+" then victim", get(tc.path, tc.header, other, tc.header, victim))
			}
			repeated(tc.header+" fresh and empty", get(tc.path, tc.header, "fresh", tc.header, ""))
			if got := s.backend.count(tc.path); got != 1 {
				t.Errorf("%d requests reached %s, want 1", got, tc.path)
			}
		}

		// The cost header.
		checkDenial(t, px, "X-Cost 5 and 1", get("/cost", "X-Cost", "5", "X-Cost", "1"), "repeated-header")
		invalid++
		if r := get("/cost", "X-Cost", "10"); r.status != 200 {
			t.Errorf("X-Cost 10 after a refused repeat: %d, want 200", r.status)
		}
		checkDenial(t, px, "X-Cost 1 after 10 of 10", get("/cost", "X-Cost", "1"), "rate-limited")

		if got := invalidCount(t, s.authlimit[0]); got != float64(invalid) {
			t.Errorf("authlimit counted %v invalid requests, want %d", got, invalid)
		}
	})
}

// uploadRules count bytes as the README says, from the length nginx passes
// in X-Original-Content-Length: /upload refuses a body without a length,
// /stream charges 2000 for one.
const uploadRules = `
name=upload key=ip limit=12000/1h cost=header:X-Original-Content-Length cost_missing=deny method=POST,PUT path=/upload
name=stream key=ip limit=5000/1h cost=header:X-Original-Content-Length cost_missing=2000 method=POST,PUT path=/stream`

// TestBypassByteCounting: a rule counting bytes charges each request its
// body's length, through the proxy, whatever the client claims; a chunked
// body (no length) is refused or charged the rule's cost_missing; an empty
// body is not an invalid cost and is charged nothing.
// TestBypassClaimedLengthBehindTraefik: Traefik cannot pass the body's
// length, and its shipped file drops the length a client claims, so a
// byte-counting rule refuses (cost_missing=deny) rather than believes it.
func TestBypassClaimedLengthBehindTraefik(t *testing.T) {
	px := proxyNamed(t, "traefik")
	s := newStack(t, px, uploadRules, "")
	r := rawDo(t, "127.0.1.5", s.proxy[0], rawRequest("POST /upload HTTP/1.1", strings.Repeat("b", 5000),
		"Host", "localhost", "Content-Length", "5000", "X-Original-Content-Length", "1"))
	checkDenial(t, px, "5000-byte POST claiming 1 byte", r, "missing-cost")
	if got := s.backend.count("/upload"); got != 0 {
		t.Errorf("%d POSTs reached /upload, want 0", got)
	}
}

func TestBypassByteCounting(t *testing.T) {
	forProxies(t, byteCountingProxies, func(t *testing.T, px proxy) {
		s := newStack(t, px, uploadRules, "")
		addr := s.proxy[0]
		post := func(ip, path string, size int, headers ...string) result {
			h := append([]string{"Host", "localhost", "Content-Type", "application/octet-stream", "Content-Length", strconv.Itoa(size)}, headers...)
			return rawDo(t, ip, addr, rawRequest("POST "+path+" HTTP/1.1", strings.Repeat("b", size), h...))
		}
		chunked := func(ip, path string, size int, headers ...string) result {
			h := append([]string{"Host", "localhost", "Transfer-Encoding", "chunked"}, headers...)
			body := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", size, strings.Repeat("c", size))
			return rawDo(t, ip, addr, rawRequest("POST "+path+" HTTP/1.1", body, h...))
		}

		// Four 5000-byte POSTs against 12000 an hour: two fit. The
		// client's own X-Original-Content-Length changes nothing.
		a := "127.0.1.2"
		for i, want := range []int{200, 200, 429, 429} {
			r := post(a, "/upload", 5000, "X-Original-Content-Length", "1")
			if want == 200 {
				if r.status != 200 {
					t.Errorf("5000-byte POST %d: %d %q, want 200", i+1, r.status, firstLine(r.body))
				}
				if px.relaysOnAllowed {
					if got, want := r.header.Get("X-RateLimit-Remaining"), strconv.Itoa(12000-5000*(i+1)); got != want {
						t.Errorf("5000-byte POST %d: X-RateLimit-Remaining %q, want %s", i+1, got, want)
					}
				}
				continue
			}
			checkDenial(t, px, fmt.Sprintf("5000-byte POST %d", i+1), r, "rate-limited")
		}
		if got := s.backend.count("/upload"); got != 2 {
			t.Errorf("%d POSTs reached /upload, want 2", got)
		}
		// An empty body costs nothing: admitted with the budget spent,
		// not refused as an invalid cost.
		if r := post(a, "/upload", 0); r.status != 200 {
			t.Errorf("empty POST with the byte budget spent: %d %q, want 200", r.status, firstLine(r.body))
		}
		if got := s.backend.count("/upload"); got != 3 {
			t.Errorf("the empty POST did not reach the backend")
		}

		// More than the rule ever admits: refused for good.
		checkDenial(t, px, "20000-byte POST", post("127.0.1.3", "/upload", 20000), "cost-too-high")

		// No length: refused where cost_missing=deny, whatever the
		// client claims.
		c := "127.0.1.4"
		checkDenial(t, px, "chunked POST to /upload", chunked(c, "/upload", 100, "X-Original-Content-Length", "1"), "missing-cost")
		if got := s.backend.count("/upload"); got != 3 {
			t.Errorf("a chunked POST reached /upload")
		}
		// ... and charged cost_missing=2000 where set: two of 5000 fit,
		// then 1000 bytes with a length.
		for i := 0; i < 2; i++ {
			if r := chunked(c, "/stream", 100, "X-Original-Content-Length", "1"); r.status != 200 {
				t.Errorf("chunked POST %d to /stream: %d %q, want 200", i+1, r.status, firstLine(r.body))
			} else if px.relaysOnAllowed && r.header.Get("X-RateLimit-Remaining") != strconv.Itoa(5000-2000*(i+1)) {
				t.Errorf("chunked POST %d to /stream: X-RateLimit-Remaining %q, want %d", i+1, r.header.Get("X-RateLimit-Remaining"), 5000-2000*(i+1))
			}
		}
		checkDenial(t, px, "third chunked POST to /stream", chunked(c, "/stream", 100), "rate-limited")
		if r := post(c, "/stream", 1000); r.status != 200 {
			t.Errorf("1000-byte POST to /stream with 1000 left: %d, want 200", r.status)
		}
		checkDenial(t, px, "1-byte POST to /stream with 0 left", post(c, "/stream", 1), "rate-limited")
		if got := s.backend.count("/stream"); got != 3 {
			t.Errorf("%d POSTs reached /stream, want 3", got)
		}
	})
}

// TestBypassPathSpellings: path=/login applies wherever a common backend
// would route the request to /login: path parameters (Tomcat, Jetty,
// Spring) and other cases (Express, ASP.NET) included.
func TestBypassPathSpellings(t *testing.T) {
	forBypassProxies(t, func(t *testing.T, px proxy) {
		s := newStack(t, px, "name=login key=ip limit=2/1m path=/login", "")
		spellings := []string{"/login;a=1", "/LOGIN", "/Login/", "/login;jsessionid=x/", "/LoGiN;x=1?q=2", "/%4Cogin", "/x/..;/login", "/login;/step2"}
		for i, path := range spellings {
			ip := fmt.Sprintf("127.0.1.%d", 10+i)
			get := func(path string) result {
				return rawDo(t, ip, s.proxy[0], rawRequest("GET "+path+" HTTP/1.1", "", "Host", "localhost"))
			}
			// The spelling uses up the login quota...
			for j := 0; j < 2; j++ {
				if r := get(path); r.status != 200 {
					t.Fatalf("GET %s, request %d: %d", path, j+1, r.status)
				}
			}
			checkDenial(t, px, "GET /login after 2 of "+path, get("/login"), "rate-limited")
			// ... and is limited by it.
			checkDenial(t, px, "GET "+path+" a third time", get(path), "rate-limited")
			if r := get("/logins"); r.status != 200 {
				t.Errorf("GET /logins: %d, want 200 (not under /login)", r.status)
			}
		}
	})
}

// ingressAnnotations reads the annotations of deploy/kubernetes/ingress.yaml.
func ingressAnnotations(t *testing.T) map[string]string {
	t.Helper()
	var ing struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"metadata"`
	}
	if err := yaml.Unmarshal(readRepo(t, "deploy/kubernetes/ingress.yaml"), &ing); err != nil || ing.Kind != "Ingress" {
		t.Fatalf("deploy/kubernetes/ingress.yaml: kind %q, %v", ing.Kind, err)
	}
	return ing.Metadata.Annotations
}

// deploymentEnv reads the authlimit container's environment from
// deploy/kubernetes/authlimit.yaml.
func deploymentEnv(t *testing.T) map[string]string {
	t.Helper()
	return authlimitDeployment(t).env
}

// ingressNginx is ingress-nginx as far as authlimit can tell: nginx with a
// server for the Ingress's host whose location and auth location are
// written as ingress-nginx's template (rootfs/etc/nginx/template/nginx.tmpl)
// writes them for an Ingress with the auth-url annotation, holding the
// snippets of deploy/kubernetes/ingress.yaml. The auth location sends
// exactly ingress-nginx's header set: Host set to the auth service,
// X-Original-URL built from the client's Host header, X-Original-Method,
// X-Sent-From, X-Real-IP, X-Forwarded-For, X-Auth-Request-Redirect,
// X-Request-ID, X-Forwarded-Proto emptied, X-Original-URI and X-Scheme with
// auth-method, and every header the client sent but these (a spoofed
// X-Forwarded-Host included): no X-Forwarded-Host of its own.
//
// edit, when set, rewrites the configuration-snippet.
func ingressNginx(edit func(snippet string) string) func(t *testing.T, authlimit, backend, variant string) string {
	return func(t *testing.T, authlimit, backend, _ string) string {
		t.Helper()
		ann := ingressAnnotations(t)
		authURL := ann["nginx.ingress.kubernetes.io/auth-url"]
		const svc = "http://authlimit.default.svc.cluster.local:8080/auth"
		if authURL != svc {
			t.Fatalf("ingress.yaml: auth-url %q, want %q", authURL, svc)
		}
		authMethod := ""
		if m := ann["nginx.ingress.kubernetes.io/auth-method"]; m != "" {
			authMethod = fmt.Sprintf(`
            proxy_method                %s;
            proxy_set_header            X-Original-URI          $request_uri;
            proxy_set_header            X-Scheme                $pass_access_scheme;`, m)
		}
		config := ann["nginx.ingress.kubernetes.io/configuration-snippet"]
		if edit != nil {
			config = edit(config)
		}
		dir := t.TempDir()
		addr := freeAddr(t)
		site := fmt.Sprintf(`
upstream authlimit { server %[1]s; }
upstream upstream_balancer { server %[2]s; }
map $http_x_request_id $req_id {
    default   $http_x_request_id;
    ""        $request_id;
}
map '' $pass_access_scheme {
    default          $scheme;
}

server {
    server_name api.example.com;
    listen %[3]s default_server;

    %[4]s

    location = /_external-auth-Lw-Prefix {
        internal;

        set $proxy_upstream_name "default-api-80";

        proxy_pass_request_body     off;
        proxy_set_header            Content-Length          "";
        proxy_set_header            X-Forwarded-Proto       "";
        proxy_set_header            X-Request-ID            $req_id;
%[5]s

        proxy_set_header            Host                    authlimit.default.svc.cluster.local;
        proxy_set_header            X-Original-URL          $scheme://$http_host$request_uri;
        proxy_set_header            X-Original-Method       $request_method;
        proxy_set_header            X-Sent-From             "nginx-ingress-controller";
        proxy_set_header            X-Real-IP               $remote_addr;
        proxy_set_header            X-Forwarded-For        $remote_addr;
        proxy_set_header            X-Auth-Request-Redirect $request_uri;

        proxy_buffering                         off;
        proxy_buffer_size                       4k;
        proxy_buffers                           4 4k;
        proxy_request_buffering                 on;
        proxy_http_version                      1.1;

        proxy_ssl_server_name       on;
        proxy_pass_request_headers  on;
        client_max_body_size        1m;

        %[6]s

        set $target http://authlimit/auth;
        proxy_pass $target;
    }

    location / {
        set $namespace      "default";
        set $ingress_name   "api";
        set $service_name   "api";
        set $service_port   "80";
        set $location_path  "/";

        set $proxy_upstream_name "default-api-80";
        set $pass_access_scheme  $scheme;
        set $best_http_host      $http_host;

        # this location requires authentication
        auth_request        /_external-auth-Lw-Prefix;
        auth_request_set    $auth_cookie $upstream_http_set_cookie;
        add_header          Set-Cookie $auth_cookie;

        client_max_body_size                    1m;
        proxy_set_header Host                   $best_http_host;
        proxy_set_header X-Request-ID           $req_id;
        proxy_set_header X-Real-IP              $remote_addr;
        proxy_set_header X-Forwarded-For        $remote_addr;
        proxy_set_header X-Forwarded-Host       $best_http_host;
        proxy_set_header X-Forwarded-Proto      $pass_access_scheme;
        proxy_set_header X-Scheme               $pass_access_scheme;
        proxy_set_header Proxy                  "";
        proxy_http_version                      1.1;

        %[7]s

        proxy_pass http://upstream_balancer;
    }
}
`, authlimit, backend, addr, ann["nginx.ingress.kubernetes.io/server-snippet"], authMethod,
			ann["nginx.ingress.kubernetes.io/auth-snippet"], config)
		runNginx(t, "ingress-nginx", dir, addr, site, false)
		return addr
	}
}

// ingressStack runs authlimit with the environment of
// deploy/kubernetes/authlimit.yaml (but Redis, the trusted proxy and the
// rules) behind ingressNginx.
func ingressStack(t *testing.T, rules string, edit func(string) string) *stack {
	t.Helper()
	if err := bins.missing["nginx"]; err != nil {
		t.Fatalf("nginx is not available: %v", err)
	}
	redis, err := redistest.Start(t, bins.redis)
	if err != nil {
		t.Fatal(err)
	}
	env := deploymentEnv(t)
	env["AUTHLIMIT_REDIS_URL"] = redis.URL
	env["AUTHLIMIT_TRUSTED_PROXIES"] = "127.0.0.1/32"
	env["AUTHLIMIT_RULES"] = rules
	s := &stack{redis: redis, backend: startBackend(t)}
	a := startAuthlimit(t, "authlimit", env)
	s.authlimit = append(s.authlimit, a)
	s.proxy = append(s.proxy, ingressNginx(edit)(t, a.addr, s.backend.addr, ""))
	return s
}

// ingressRules: one rule on the Ingress's host, one keyed by host, one on
// a path.
const ingressRules = `
name=api key=ip limit=2/1m host=api.example.com path=/h
name=per-host key=host limit=2/1m path=/k
name=login key=ip limit=1/1m path=/login`

// TestBypassIngressNginx: behind ingress-nginx with the shipped
// deploy/kubernetes files, host= rules and key=host follow the host the
// request was routed by (X-Original-URL), never a client's
// X-Forwarded-Host, and path rules the path, whatever the client puts in
// its Host header or request line.
func TestBypassIngressNginx(t *testing.T) {
	s := ingressStack(t, ingressRules, nil)
	addr := s.proxy[0]
	nginx := proxy{name: "ingress-nginx", denyStatus: "403"}
	do := func(ip, line string, headers ...string) result {
		return rawDo(t, ip, addr, rawRequest(line, "", headers...))
	}

	// host=api.example.com applies to api.example.com, whatever
	// X-Forwarded-Host the client sends.
	a := "127.0.1.30"
	for i, want := range []int{200, 200, 429, 429} {
		r := do(a, "GET /h HTTP/1.1", "Host", "api.example.com", "X-Forwarded-Host", fmt.Sprintf("elsewhere%d.example", i))
		if want == 200 && r.status != 200 {
			t.Errorf("GET /h with X-Forwarded-Host elsewhere%d.example, request %d: %d, want 200", i, i+1, r.status)
		} else if want == 429 {
			checkDenial(t, nginx, fmt.Sprintf("GET /h with X-Forwarded-Host elsewhere%d.example, request %d", i, i+1), r, "rate-limited")
		}
		if want == 200 && r.header.Get("RateLimit-Policy") != `"api";q=2;w=60` {
			t.Errorf("GET /h request %d: RateLimit-Policy %q, want the api rule", i+1, r.header.Get("RateLimit-Policy"))
		}
	}
	// ... and to its spellings: case, port, trailing dot.
	b := "127.0.1.31"
	for i, host := range []string{"API.Example.com", "api.example.com:80", "api.example.com."} {
		want := 200
		if i >= 2 {
			want = 429
		}
		if r := do(b, "GET /h HTTP/1.1", "Host", host); r.status != want {
			t.Errorf("GET /h with Host %q, request %d: %d, want %d", host, i+1, r.status, want)
		}
	}

	// key=host: one quota for the host, whatever X-Forwarded-Host says,
	// from any client.
	for i, want := range []int{200, 200, 429, 429} {
		ip := fmt.Sprintf("127.0.1.%d", 40+i)
		r := do(ip, "GET /k HTTP/1.1", "Host", "api.example.com", "X-Forwarded-Host", fmt.Sprintf("r%d.example", i))
		if r.status != want {
			t.Errorf("GET /k with X-Forwarded-Host r%d.example: %d, want %d", i, r.status, want)
		}
	}

	// An absolute-form request line is routed by its own host, and
	// nginx ignores the Host header for routing; ingress-nginx still
	// writes that header into X-Original-URL. The shipped snippet
	// refuses a Host header that disagrees, so that it cannot choose
	// the host authlimit sees nor, with "?" or "#", move the path.
	c := "127.0.1.50"
	for _, tc := range []struct{ target, host string }{
		{"http://api.example.com/k", "r9.example"},
		{"http://api.example.com/h", "elsewhere.example"},
		{"http://api.example.com/login", "api.example.com?"},
		{"http://api.example.com/login", "api.example.com#"},
	} {
		if r := do(c, "GET "+tc.target+" HTTP/1.1", "Host", tc.host); r.status != 400 {
			t.Errorf("GET %s with Host %q: %d, want 400 (refused by the snippet)", tc.target, tc.host, r.status)
		}
	}
	// One that agrees passes, and counts against the host.
	if r := do(c, "GET http://api.example.com/login HTTP/1.1", "Host", "API.example.com:80"); r.status != 200 {
		t.Errorf("absolute-form GET /login with a matching Host: %d, want 200", r.status)
	}
	checkDenial(t, nginx, "second GET /login", do(c, "GET /login HTTP/1.1", "Host", "api.example.com"), "rate-limited")
	if got := s.backend.count("/k") + s.backend.count("/h") + s.backend.count("/login"); got != 2+2+2+1 {
		t.Errorf("%d requests reached the backend, want 7", got)
	}
}

// TestBypassIngressNginxWithoutHostCheck: authlimit alone, without the
// Host check of ingress.yaml's snippet, where the client's Host header
// reaches X-Original-URL. A "?" or "#" in it does not move the path: path
// rules still apply. And where X-Original-URL is not an absolute URL with
// a host (ingress-nginx writes "http:///k" for an HTTP/1.0 request without
// Host), authlimit configured to read it refuses the request
// (urn:authlimit:invalid-url) instead of reading the client's
// X-Forwarded-Host.
func TestBypassIngressNginxWithoutHostCheck(t *testing.T) {
	noCheck := func(snippet string) string {
		i := strings.Index(snippet, "set $authlimit_host_check")
		j := strings.Index(snippet, "return 400;")
		if i < 0 || j < i {
			t.Fatalf("ingress.yaml's configuration-snippet has no Host check:\n%s", snippet)
		}
		end := j + strings.Index(snippet[j:], "}") + 1
		return snippet[:i] + snippet[end:]
	}
	s := ingressStack(t, ingressRules, noCheck)
	nginx := proxy{name: "ingress-nginx", denyStatus: "403"}

	for i, host := range []string{"api.example.com?", "api.example.com#"} {
		ip := fmt.Sprintf("127.0.1.%d", 61+i)
		// Whatever the backend makes of this Host, the login rule
		// counted the request...
		rawDo(t, ip, s.proxy[0], rawRequest("GET http://api.example.com/login HTTP/1.1", "", "Host", host))
		// ... so the next login is over the limit.
		r := rawDo(t, ip, s.proxy[0], rawRequest("GET /login HTTP/1.1", "", "Host", "api.example.com"))
		checkDenial(t, nginx, fmt.Sprintf("GET /login after GET http://api.example.com/login with Host %q", host), r, "rate-limited")
	}

	for i := 0; i < 3; i++ {
		r := rawDo(t, "127.0.1.60", s.proxy[0], fmt.Sprintf("GET /k HTTP/1.0\r\nX-Forwarded-Host: r%d.example\r\n\r\n", i))
		checkDenial(t, nginx, fmt.Sprintf("HTTP/1.0 GET /k without Host, X-Forwarded-Host r%d.example", i), r, "invalid-url")
	}
	if got := invalidCount(t, s.authlimit[0]); got != 3 {
		t.Errorf("authlimit counted %v invalid requests, want 3", got)
	}
	if got := s.backend.count("/k"); got != 0 {
		t.Errorf("%d requests without a URL reached the backend", got)
	}
}
