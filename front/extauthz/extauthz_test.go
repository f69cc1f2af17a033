package extauthz

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/front/grpcwire"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/handler"
	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
	"github.com/authlimit/authlimit/store/redis"
)

// trusted are the proxies both fronts trust: loopback (where the HTTP
// requests come from) and 10.0.0.0/8 (a proxy in front of Envoy).
var trusted = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}

// backend is where a stack keeps its limits.
type backend struct {
	name     string
	redis    *redistest.Server // nil: the memory store
	failMode guard.FailMode
	// proxy, if set, stands between the store and redis, with budget the
	// store's budget (default 1 s).
	proxy  *redistest.LatencyProxy
	budget time.Duration
}

// stack is authlimit as cmd wires it, on loopback: one engine behind /auth
// on a fasthttp server and behind Check on a gRPC server.
type stack struct {
	auth   string // the address /auth is served on
	grpc   *grpcwire.Server
	check  string // the address Check is served on
	conn   *grpc.ClientConn
	client authv3.AuthorizationClient
	server *Server
	slept  chan time.Duration // Check's shaping delays
}

func newStack(t testing.TB, b backend, src string, mod func(*decide.Options)) *stack {
	t.Helper()
	set := rulesettest.Parse(t, src)
	gopts := guard.Options{Rules: set, DenyCacheSize: 1000, FailMode: b.failMode}
	if b.redis == nil {
		m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
		t.Cleanup(func() { _ = m.Close() })
		gopts.Store = m
	} else {
		client := b.redis.Client(t)
		if b.proxy != nil {
			opts, err := goredis.ParseURL(b.redis.URL)
			if err != nil {
				t.Fatal(err)
			}
			opts.Addr, opts.MaxRetries, opts.ContextTimeoutEnabled = b.proxy.Addr, -1, true
			client = goredis.NewClient(opts)
			t.Cleanup(func() { _ = client.Close() })
		}
		budget := b.budget
		if budget == 0 {
			budget = time.Second
		}
		store := redis.New(client, redis.Options{Prefix: b.redis.Prefix(t), Timeout: budget})
		t.Cleanup(func() { _ = store.Close() })
		local := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
		t.Cleanup(func() { _ = local.Close() })
		gopts.Store, gopts.Remote, gopts.Local = store, true, local
		gopts.BreakerFailures, gopts.BreakerBackoff, gopts.BreakerMaxBackoff, gopts.ProbeTimeout = 3, time.Minute, time.Minute, time.Second
	}
	g, err := guard.New(gopts)
	if err != nil {
		t.Fatal(err)
	}
	_ = g.Start(context.Background()) // a stopped Redis: circuits start open
	t.Cleanup(g.Close)
	reg := prometheus.NewRegistry()
	eopts := decide.Options{Rules: set, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429, Registry: reg}
	if mod != nil {
		mod(&eopts)
	}
	e, err := decide.New(eopts)
	if err != nil {
		t.Fatal(err)
	}
	h, err := handler.New(handler.Options{Engine: e, Ready: g, Proxies: rules.Proxies{Trusted: trusted}, Registry: reg,
		MethodHeader: "X-Forwarded-Method", URIHeader: "X-Forwarded-Uri", HostHeader: "X-Forwarded-Host", Sleep: func(time.Duration) {}})
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &fasthttp.Server{Handler: h.Serve, NoDefaultServerHeader: true, NoDefaultContentType: true}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() { _ = hs.Shutdown() })

	st := &stack{auth: hl.Addr().String(), slept: make(chan time.Duration, 100)}
	srv, err := New(Options{Engine: e, Proxies: rules.Proxies{Trusted: trusted}, Sleep: func(_ context.Context, d time.Duration) { st.slept <- d }})
	if err != nil {
		t.Fatal(err)
	}
	st.server = srv
	gs := grpcwire.NewServer(grpcwire.Options{})
	st.grpc = gs
	if err := srv.Register(gs); err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	st.check = gl.Addr().String()
	go func() { _ = gs.Serve(gl) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	st.conn, st.client = conn, authv3.NewAuthorizationClient(conn)
	return st
}

// step is one request of a client, as the original request was.
type step struct {
	client  string   // the client's address
	method  string   // default GET
	path    string   // default /
	host    string   // default api.example.com
	headers []string // name, value, ...; a name twice is a repeated header
	spoof   string   // an X-Forwarded-For the client sends itself
	proxied bool     // Envoy's peer is a trusted proxy that forwarded the client
	// length are the original request's Content-Length lines: the
	// X-Original-Content-Length a proxy sends /auth, the content-length
	// Envoy forwards to Check.
	length []string
	// size is Envoy's attributes.request.http.size: the body bytes it has
	// received. /auth gets it as X-Original-Content-Length when above 0
	// and there is no length: the body's length, stated.
	size int64
	want int // the status /auth answers
}

// answer is what a front answered, as the client sees it.
type answer struct {
	status  int
	headers map[string]string
	body    string
}

var answerHeaders = []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After", "Content-Type"}

func (s *step) defaults() step {
	c := *s
	if c.method == "" {
		c.method = "GET"
	}
	if c.path == "" {
		c.path = "/"
	}
	if c.host == "" {
		c.host = "api.example.com"
	}
	if c.client == "" {
		c.client = "203.0.113.7"
	}
	return c
}

// viaHTTP sends s to /auth as a proxy's auth subrequest from loopback,
// written line by line (net/http would write one User-Agent of two).
func (st *stack) viaHTTP(t *testing.T, s step) answer {
	t.Helper()
	s = s.defaults()
	xff := s.client
	if s.spoof != "" {
		xff = s.spoof + ", " + xff
	}
	var b strings.Builder
	fmt.Fprintf(&b, "GET /auth HTTP/1.1\r\nHost: authlimit\r\nConnection: close\r\nX-Forwarded-For: %s\r\nX-Forwarded-Method: %s\r\nX-Forwarded-Uri: %s\r\nX-Forwarded-Host: %s\r\n", xff, s.method, s.path, s.host)
	for i := 0; i+1 < len(s.headers); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", s.headers[i], s.headers[i+1])
	}
	for _, l := range s.length {
		fmt.Fprintf(&b, "X-Original-Content-Length: %s\r\n", l)
	}
	if len(s.length) == 0 && s.size > 0 {
		fmt.Fprintf(&b, "X-Original-Content-Length: %d\r\n", s.size)
	}
	b.WriteString("\r\n")
	c, err := net.Dial("tcp", st.auth)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, headers: map[string]string{}, body: string(body)}
	for _, name := range answerHeaders {
		if v := resp.Header.Get(name); v != "" {
			a.headers[name] = v
		}
	}
	return a
}

// checkRequest is s as Envoy sends it to Check: with raw headers, one
// entry per line, or joined, Envoy's way (lower-case names, repeats joined
// with ",").
func checkRequest(s step, raw bool) *authv3.CheckRequest {
	s = s.defaults()
	source := s.client
	lines := append([]string{}, s.headers...)
	switch {
	case s.proxied && s.spoof != "":
		source = "10.0.0.5"
		lines = append(lines, "x-forwarded-for", s.spoof+", "+s.client)
	case s.proxied:
		source = "10.0.0.5"
		lines = append(lines, "x-forwarded-for", s.client)
	case s.spoof != "":
		lines = append(lines, "x-forwarded-for", s.spoof)
	}
	// Envoy forwards the client's own headers too: these must move
	// nothing.
	lines = append(lines, "x-forwarded-uri", "/elsewhere", "x-forwarded-method", "DELETE", "x-forwarded-host", "spoof.example", "x-real-ip", "198.18.0.77", "x-original-content-length", "1")
	for _, l := range s.length {
		lines = append(lines, "content-length", l)
	}
	lines = append(lines, ":authority", s.host, ":path", s.path, ":method", s.method)
	h := &authv3.AttributeContext_HttpRequest{Method: s.method, Path: s.path, Host: s.host, Protocol: "HTTP/1.1", Size: s.size}
	if raw {
		h.HeaderMap = &corev3.HeaderMap{}
		for i := 0; i+1 < len(lines); i += 2 {
			h.HeaderMap.Headers = append(h.HeaderMap.Headers, &corev3.HeaderValue{Key: strings.ToLower(lines[i]), RawValue: []byte(lines[i+1])})
		}
	} else {
		h.Headers = map[string]string{}
		for i := 0; i+1 < len(lines); i += 2 {
			k := strings.ToLower(lines[i])
			if v, ok := h.Headers[k]; ok {
				h.Headers[k] = v + "," + lines[i+1]
			} else {
				h.Headers[k] = lines[i+1]
			}
		}
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: source, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}}}}},
		Request: &authv3.AttributeContext_Request{Http: h},
	}}
}

// viaCheck sends s to Check and reads the answer as Envoy relays it.
func (st *stack) viaCheck(t *testing.T, s step, raw bool) answer {
	t.Helper()
	resp, err := st.client.Check(context.Background(), checkRequest(s, raw))
	if err != nil {
		t.Fatal(err)
	}
	return fromCheck(t, resp)
}

func fromCheck(t *testing.T, resp *authv3.CheckResponse) answer {
	t.Helper()
	a := answer{headers: map[string]string{}}
	var hs []*corev3.HeaderValueOption
	switch r := resp.GetHttpResponse().(type) {
	case *authv3.CheckResponse_OkResponse:
		if c := codes.Code(resp.GetStatus().GetCode()); c != codes.OK {
			t.Fatalf("an ok_response with status %v", c)
		}
		a.status, hs = 200, r.OkResponse.GetResponseHeadersToAdd()
		if len(r.OkResponse.GetHeaders()) > 0 {
			t.Errorf("headers added to the upstream request: %v", r.OkResponse.GetHeaders())
		}
	case *authv3.CheckResponse_DeniedResponse:
		if c := codes.Code(resp.GetStatus().GetCode()); c == codes.OK {
			t.Fatalf("a denied_response with status OK")
		}
		a.status, hs, a.body = int(r.DeniedResponse.GetStatus().GetCode()), r.DeniedResponse.GetHeaders(), r.DeniedResponse.GetBody()
	default:
		t.Fatalf("a CheckResponse without an HTTP response: %v", resp)
	}
	for _, h := range hs {
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			t.Errorf("header %s appended, not set", h.GetHeader().GetKey())
		}
		a.headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
	}
	return a
}

// same reports how a and b differ, "" if they do not; times in seconds
// (a reset, a wait) may differ by one, since the two were decided apart.
func same(a, b answer) string { return sameWithin(a, b, 1) }

// sameWithin is same, times in seconds differing by up to tol.
func sameWithin(a, b answer, tol int64) string {
	var diffs []string
	if a.status != b.status {
		diffs = append(diffs, fmt.Sprintf("status %d != %d", a.status, b.status))
	}
	if a.body != b.body {
		diffs = append(diffs, fmt.Sprintf("body %q != %q", a.body, b.body))
	}
	for _, name := range answerHeaders {
		x, y := a.headers[name], b.headers[name]
		if name == "Content-Type" && a.status == 200 {
			continue // the HTTP front answers an empty 200 without one
		}
		if x == y {
			continue
		}
		switch name {
		case "X-RateLimit-Reset", "Retry-After":
			if nearby(x, y, tol) {
				continue
			}
		case "RateLimit":
			xs, xt, _ := strings.Cut(x, ";t=")
			ys, yt, _ := strings.Cut(y, ";t=")
			if xs == ys && nearby(xt, yt, tol) {
				continue
			}
		}
		diffs = append(diffs, fmt.Sprintf("%s %q != %q", name, x, y))
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

func nearby(x, y string, tol int64) bool {
	a, err1 := strconv.ParseInt(x, 10, 64)
	b, err2 := strconv.ParseInt(y, 10, 64)
	return err1 == nil && err2 == nil && a-b <= tol && b-a <= tol
}

type sameCase struct {
	name  string
	rules string
	mod   func(*decide.Options)
	steps []step
	// rawOnly: a header value holds a comma, which Envoy's joined headers
	// cannot tell from two lines joined (see the package's documentation):
	// only raw headers can agree with /auth.
	rawOnly bool
}

// sameCases cover every rule feature; each step says what /auth answers,
// and Check must answer the same.
var sameCases = []sameCase{
	{name: "key ip", rules: "name=per-ip key=ip limit=2/1m", steps: []step{
		{want: 200}, {want: 200}, {want: 429}, {client: "203.0.113.8", want: 200},
		{spoof: "198.18.0.1", want: 429}, {proxied: true, want: 429}, {proxied: true, spoof: "198.18.0.2", want: 429},
		{client: "2001:db8::1", want: 200}, {client: "2001:db8::2", want: 200}, {client: "2001:db8::3", want: 429},
	}},
	{name: "key header", rules: "name=api key=header:X-Api-Key limit=1/1m", steps: []step{
		{headers: []string{"X-Api-Key", "a"}, want: 200}, {headers: []string{"X-Api-Key", "a"}, client: "203.0.113.9", want: 429},
		{headers: []string{"X-Api-Key", "b"}, want: 200}, {want: 200}, {headers: []string{"X-Api-Key", ""}, want: 200},
		{headers: []string{"X-Api-Key", "a", "X-Api-Key", "c"}, want: 429}, {headers: []string{"x-api-key", "c"}, want: 200},
	}},
	{name: "key header on missing deny", rules: "name=api key=ip+header:X-Api-Key limit=5/1m on_missing=deny", steps: []step{
		{want: 429}, {headers: []string{"X-Api-Key", "k"}, want: 200},
	}},
	{name: "keys host method path global", rules: "name=h key=host limit=1/1m path=/h; name=m key=method limit=1/1m path=/m; name=p key=path limit=1/1m path=/p; name=g key=global limit=2/1m path=/g", steps: []step{
		{path: "/h", want: 200}, {path: "/h", client: "203.0.113.9", want: 429}, {path: "/h", host: "Other.Example.com:8443", want: 200},
		{path: "/m", want: 200}, {path: "/m", method: "POST", want: 200}, {path: "/m", method: "post", want: 429},
		{path: "/p/a", want: 200}, {path: "/P/A;x=1", want: 429}, {path: "/p/b", want: 200},
		{path: "/g", want: 200}, {path: "/g", client: "198.18.0.9", want: 200}, {path: "/g", client: "198.18.0.10", want: 429},
	}},
	{name: "path host method matching", rules: "name=login key=ip limit=1/1m path=/login method=POST; name=re key=ip limit=1/1m path=~^/api/v[0-9]+/upload$; name=host key=ip limit=1/1m host=*.example.org", steps: []step{
		{path: "/login", method: "GET", want: 200}, {path: "/login", method: "POST", want: 200}, {path: "/LOGIN/x?y=1", method: "POST", want: 429},
		{path: "/logins", method: "POST", want: 200}, {path: "/a/../login", method: "POST", want: 429}, {path: "/log%69n", method: "POST", want: 429},
		{path: "/api/v2/upload", want: 200}, {path: "/api/v3/upload", want: 429}, {path: "/api/vx/upload", want: 200},
		{host: "a.example.org", want: 200}, {host: "B.example.org.", want: 429}, {host: "example.org", want: 200},
	}},
	{name: "costs", rules: "name=static key=ip limit=5/1m cost=2 path=/s; name=bytes key=ip limit=10/1m cost=header:X-Cost path=/b; name=strict key=ip limit=10/1m cost=header:X-Cost cost_missing=deny path=/d", steps: []step{
		{path: "/s", want: 200}, {path: "/s", want: 200}, {path: "/s", want: 429},
		{path: "/b", headers: []string{"X-Cost", "6"}, want: 200}, {path: "/b", headers: []string{"X-Cost", "5"}, want: 429}, {path: "/b", headers: []string{"X-Cost", "0"}, want: 200},
		{path: "/b", headers: []string{"X-Cost", "11"}, want: 429}, {path: "/b", headers: []string{"X-Cost", "x1"}, want: 429}, {path: "/b", headers: []string{"X-Cost", "1", "X-Cost", "1"}, want: 429},
		{path: "/b", want: 200}, {path: "/d", want: 429}, {path: "/d", headers: []string{"X-Cost", "10"}, want: 200},
	}},
	{name: "body length", rules: "name=bytes key=ip limit=100/1m cost=header:X-Original-Content-Length cost_missing=7 path=/u; name=strict key=ip limit=100/1m cost=header:X-Original-Content-Length cost_missing=deny path=/d", steps: []step{
		// The length Envoy forwards, then the size of a buffered body.
		{path: "/u", length: []string{"60"}, want: 200}, {path: "/u", size: 30, want: 200},
		// Unknown (-1) and 0 (no body received yet) state no length:
		// cost_missing= decides, 7 here, which fits once, then not.
		{path: "/u", size: -1, want: 200}, {path: "/u", size: 0, want: 429},
		// An empty body counts nothing; the forwarded length wins over a
		// size.
		{path: "/u", length: []string{"0"}, want: 200}, {path: "/u", length: []string{"3"}, size: 500, want: 200},
		{path: "/u", size: 1, want: 429},
		{path: "/d", size: -1, want: 429}, {path: "/d", size: 0, want: 429},
		// Too large for any limit, not a number, repeated.
		{path: "/d", size: 1 << 60, want: 429}, {path: "/d", length: []string{"99999999999999999"}, want: 429},
		{path: "/d", length: []string{"-1"}, want: 429}, {path: "/d", length: []string{"5", "5"}, want: 429},
		{path: "/d", size: 101, want: 429}, {path: "/d", size: 100, want: 200}, {path: "/d", length: []string{"1"}, size: 1, want: 429},
	}},
	{name: "rate-limited and cost too high", rules: "name=per-ip key=ip limit=1/1m; name=bytes key=ip limit=5/1m cost=header:X-Cost", steps: []step{
		{headers: []string{"X-Cost", "1"}, want: 200}, {headers: []string{"X-Cost", "6"}, want: 429}, {headers: []string{"X-Cost", "6"}, want: 429}, {headers: []string{"X-Cost", "1"}, want: 429},
	}},
	{name: "repeated headers fasthttp keeps one of", rules: "name=ua key=header:User-Agent limit=1/1m", steps: []step{
		{headers: []string{"User-Agent", "victim"}, want: 200}, {headers: []string{"User-Agent", "victim", "User-Agent", "r1"}, want: 429},
		{headers: []string{"User-Agent", "r2"}, want: 200},
	}},
	{name: "shadow", rules: "name=enforced key=ip limit=3/1m; name=watch key=ip limit=1/1m shadow=true", steps: []step{
		{want: 200}, {want: 200}, {want: 200}, {want: 429},
	}},
	{name: "shadow everything", rules: "name=a key=ip limit=1/1m", mod: func(o *decide.Options) { o.Shadow = true }, steps: []step{
		{want: 200}, {want: 200},
	}},
	{name: "allow and block lists, deny status", rules: "name=a key=ip limit=1/1m",
		mod: func(o *decide.Options) {
			o.AllowCIDRs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
			o.BlockCIDRs = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
			o.DenyStatus = 403
		}, steps: []step{
			{client: "192.0.2.1", want: 200}, {client: "192.0.2.1", want: 200}, {client: "198.51.100.1", want: 403},
			{client: "198.51.100.1", proxied: true, want: 403}, {spoof: "192.0.2.1", want: 200}, {spoof: "192.0.2.1", want: 403},
		}},
	{name: "shaping", rules: "name=smooth key=ip limit=10/1s algorithm=leaky_bucket burst=1 delay=5s", steps: []step{
		{want: 200}, {want: 200}, {want: 200},
	}},
}

// TestCheckAnswersAsAuth sends every case's requests through /auth, and
// then, on fresh limits, through Check with raw headers and with Envoy's
// joined ones, on the memory store and on Redis: each step's status is what
// the case says, and Check's status, headers and body are /auth's.
func TestCheckAnswersAsAuth(t *testing.T) {
	checkAnswersAsAuth(t, sameCases)
}

// checkAnswersAsAuth runs cases as TestCheckAnswersAsAuth says.
func checkAnswersAsAuth(t *testing.T, cases []sameCase) {
	backends := []backend{{name: "memory"}, {name: "redis", redis: redistest.New(t)}}
	for _, b := range backends {
		for _, tc := range cases {
			t.Run(b.name+"/"+tc.name, func(t *testing.T) {
				// The cases' windows are of a minute at most: one case's
				// runs land in one.
				awayFromMinuteEdge(t, 15*time.Second)
				httpStack := newStack(t, b, tc.rules, tc.mod)
				var want []answer
				began := time.Now()
				for i, s := range tc.steps {
					a := httpStack.viaHTTP(t, s)
					if s.want != 0 && a.status != s.want {
						t.Fatalf("step %d %+v: /auth answered %d %s, want %d", i+1, s, a.status, a.body, s.want)
					}
					want = append(want, a)
				}
				for _, raw := range []bool{true, false} {
					if !raw && tc.rawOnly {
						continue
					}
					st := newStack(t, b, tc.rules, tc.mod)
					// Times count down between the two runs.
					tol := int64(time.Since(began)/time.Second) + 1
					for i, s := range tc.steps {
						if d := sameWithin(want[i], st.viaCheck(t, s, raw), tol); d != "" {
							t.Errorf("step %d %+v, raw headers %v: Check differs from /auth: %s", i+1, s, raw, d)
						}
					}
				}
			})
		}
	}
}

// awayFromMinuteEdge waits until at least margin is left of the current
// minute, as the stores count fixed windows from the Unix epoch.
func awayFromMinuteEdge(t *testing.T, margin time.Duration) {
	t.Helper()
	for {
		left := time.Minute - time.Duration(time.Now().UnixNano()%int64(time.Minute))
		if left > margin {
			return
		}
		time.Sleep(left + 10*time.Millisecond)
	}
}

// TestCheckHoldsShapedRequests: Check holds an admitted request by its
// shaping delay before answering, as /auth does.
func TestCheckHoldsShapedRequests(t *testing.T) {
	st := newStack(t, backend{name: "memory"}, "name=smooth key=ip limit=10/1s algorithm=leaky_bucket burst=1 delay=5s", nil)
	for i := range 3 {
		if a := st.viaCheck(t, step{}, true); a.status != 200 {
			t.Fatalf("request %d: %d, want 200", i+1, a.status)
		}
	}
	var got []time.Duration
	for len(st.slept) > 0 {
		got = append(got, <-st.slept)
	}
	if len(got) != 2 || got[0] <= 0 || got[1] <= got[0] {
		t.Errorf("delays %v, want two growing ones (the first request passes at once)", got)
	}
}

// TestCheckFailModes: with Redis stopped, Check answers as /auth under
// each fail mode: closed is a 503 with Retry-After: 1, open admits without
// headers, local decides with the local store.
func TestCheckFailModes(t *testing.T) {
	srv := redistest.New(t)
	srv.Stop(t)
	for _, tc := range []struct {
		mode  guard.FailMode
		want  []int
		retry string
	}{
		{guard.FailClosed, []int{503, 503}, "1"},
		{guard.FailOpen, []int{200, 200}, ""},
		{guard.FailLocal, []int{200, 429}, ""},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			t.Parallel() // stacks of their own, one stopped server
			b := backend{name: "stopped redis", redis: srv, failMode: tc.mode}
			const src = "name=a key=ip limit=1/1m"
			httpStack, checkStack := newStack(t, b, src, nil), newStack(t, b, src, nil)
			for i, want := range tc.want {
				a := httpStack.viaHTTP(t, step{})
				if a.status != want {
					t.Fatalf("request %d: /auth %d %s, want %d", i+1, a.status, a.body, want)
				}
				if i == 0 && a.headers["Retry-After"] != tc.retry {
					t.Errorf("Retry-After %q, want %q", a.headers["Retry-After"], tc.retry)
				}
				if tc.mode == guard.FailOpen && len(a.headers) != 0 {
					t.Errorf("fail open answered headers %v", a.headers)
				}
				if d := same(a, checkStack.viaCheck(t, step{}, true)); d != "" {
					t.Errorf("request %d: Check differs from /auth: %s", i+1, d)
				}
			}
		})
	}
}

// TestCheckJoinedComma: in Envoy's joined headers a key header's value with
// a comma may be two lines joined, so it is refused as repeated (with raw
// headers, one such line is one value).
func TestCheckJoinedComma(t *testing.T) {
	st := newStack(t, backend{name: "memory"}, "name=api key=header:X-Api-Key limit=5/1m", nil)
	s := step{headers: []string{"X-Api-Key", "victim,r1"}}
	if a := st.viaCheck(t, s, false); a.status != 429 || !strings.Contains(a.body, "urn:authlimit:repeated-header") {
		t.Errorf("joined: %d %s, want 429 repeated-header", a.status, a.body)
	}
	if a := st.viaCheck(t, s, true); a.status != 200 || a.headers["X-RateLimit-Remaining"] != "4" {
		t.Errorf("raw: %d %v, want 200 with 4 remaining", a.status, a.headers)
	}
}

// TestCheckBodyLength: a rule counting by Content-Length, or by
// X-Original-Content-Length under any spelling the rules accept, reads the
// request's body length (the forwarded content-length, else a size above
// 0), never the client's own X-Original-Content-Length; the kind of each
// refusal is /auth's for the same header.
func TestCheckBodyLength(t *testing.T) {
	for _, header := range []string{"Content-Length", "X_Original_Content_Length"} {
		t.Run(header, func(t *testing.T) {
			st := newStack(t, backend{name: "memory"}, "name=b key=ip limit=100/1m cost_missing=deny cost=header:"+header, nil)
			for i, c := range []struct {
				s         step
				status    int
				remaining string // after an admission
				kind      string // of a refusal
			}{
				{s: step{size: 40}, status: 200, remaining: "60"},
				{s: step{length: []string{"10"}, size: 90}, status: 200, remaining: "50"},
				{s: step{headers: []string{"X-Original-Content-Length", "1"}, size: 5}, status: 200, remaining: "45"},
				{s: step{size: 0}, status: 429, kind: "missing-cost"},
				{s: step{size: -1}, status: 429, kind: "missing-cost"},
				{s: step{size: 1 << 62}, status: 429, kind: "invalid-cost"},
				{s: step{length: []string{"1e3"}}, status: 429, kind: "invalid-cost"},
				{s: step{length: []string{"2", "2"}}, status: 429, kind: "repeated-header"},
				{s: step{size: 46}, status: 429, kind: "rate-limited"},
			} {
				for _, raw := range []bool{true, false} {
					if c.status == 200 && !raw {
						continue // spent once is enough
					}
					a := st.viaCheck(t, c.s, raw)
					switch {
					case a.status != c.status:
						t.Errorf("case %d %+v raw %v: %d %s, want %d", i, c.s, raw, a.status, a.body, c.status)
					case c.status == 200 && a.headers["X-RateLimit-Remaining"] != c.remaining:
						t.Errorf("case %d %+v: %d remaining %q, want %q", i, c.s, a.status, a.headers["X-RateLimit-Remaining"], c.remaining)
					case c.kind != "" && !strings.Contains(a.body, "urn:authlimit:"+c.kind):
						t.Errorf("case %d %+v raw %v: %s, want %s", i, c.s, raw, a.body, c.kind)
					}
				}
			}
		})
	}
}

// rawCodec sends bytes as they are, to send Check what is not a
// CheckRequest.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestCheckBadInput: a CheckRequest with nothing to decide gets
// InvalidArgument; a malformed message gets a gRPC error; odd fields get
// an answer; nothing panics, and the server keeps answering.
func TestCheckBadInput(t *testing.T) {
	st := newStack(t, backend{name: "memory"}, "name=a key=ip limit=100/1m; name=k key=header:X-Key limit=100/1m", nil)
	ctx := context.Background()
	for _, req := range []*authv3.CheckRequest{
		{}, {Attributes: &authv3.AttributeContext{}}, {Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{}}},
	} {
		if _, err := st.client.Check(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Check(%v): %v, want InvalidArgument", req, err)
		}
	}
	for _, raw := range [][]byte{{0xff, 0xff, 0xff}, {0x0a, 0x80}, []byte(strings.Repeat("\x0a\x02", 1000))} {
		var out []byte
		if e := st.conn.Invoke(ctx, "/envoy.service.auth.v3.Authorization/Check", raw, &out, grpc.ForceCodec(rawCodec{})); status.Code(e) == codes.OK && len(out) == 0 {
			t.Errorf("malformed %x: OK with no answer", raw)
		}
	}
	odd := []*authv3.AttributeContext_HttpRequest{
		{},
		{Method: strings.Repeat("M", 10000), Path: strings.Repeat("/..", 10000), Host: strings.Repeat("[", 5000)},
		{Path: "\x00%zz\\..;", Host: ":::", HeaderMap: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{nil, {}, {Key: "x-key", RawValue: []byte{0, 0xff, '\n'}}}}},
		{Headers: map[string]string{"x-forwarded-for": strings.Repeat("1.1.1.1,", 1000), "x-key": strings.Repeat("k", 100000)}},
	}
	sources := []*authv3.AttributeContext_Peer{
		nil, {}, {Address: &corev3.Address{}},
		{Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/tmp/x"}}}},
		{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: "not an address"}}}},
	}
	for i, h := range odd {
		for j, src := range sources {
			resp, err := st.client.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Source: src, Request: &authv3.AttributeContext_Request{Http: h}}})
			if err != nil {
				t.Errorf("odd request %d, source %d: %v", i, j, err)
				continue
			}
			if a := fromCheck(t, resp); a.status != 200 && a.status != 429 {
				t.Errorf("odd request %d, source %d: %d %s, want 200 or 429", i, j, a.status, a.body)
			}
		}
	}
	if a := st.viaCheck(t, step{}, true); a.status != 200 {
		t.Errorf("after the bad input: %d, want 200", a.status)
	}
}

// TestCheckHeaderNotUTF8: Envoy puts a client's header value in the
// joined headers as it came, bytes above 0x7f included, which
// proto.Unmarshal refuses in a string: Check decides it by its bytes, as
// /auth does the same value, and never answers an error (which
// failure_mode_allow admits).
func TestCheckHeaderNotUTF8(t *testing.T) {
	st := newStack(t, backend{name: "memory"}, "name=k key=header:X-Key limit=1/1h", nil)
	req, err := proto.Marshal(checkRequest(step{headers: []string{"X-Key", "PLACEHOLDER"}}, false))
	if err != nil {
		t.Fatal(err)
	}
	raw := bytes.Replace(req, []byte("PLACEHOLDER"), []byte("\xffvictim123\xfe"), 1)
	if len(raw) != len(req) {
		t.Fatal("the placeholder is not in the request")
	}
	for i, want := range []int{200, 429} {
		var out []byte
		if err := st.conn.Invoke(context.Background(), CheckMethod, raw, &out, grpc.ForceCodec(rawCodec{})); err != nil {
			t.Fatalf("request %d: %v, want an answer", i+1, err)
		}
		var resp authv3.CheckResponse
		if err := proto.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		if a := fromCheck(t, &resp); a.status != want {
			t.Errorf("request %d: %d %s, want %d", i+1, a.status, a.body, want)
		}
	}
}

// TestCallerDeadlineDoesNotTripTheBreaker: calls whose deadline has passed,
// or that were cancelled, before Check decides are still decided by Redis,
// and do not count as Redis failing: with fail mode closed and a breaker
// that opens after 3 failures, the next call is still decided by Redis.
func TestCallerDeadlineDoesNotTripTheBreaker(t *testing.T) {
	b := backend{name: "redis", redis: redistest.New(t), failMode: guard.FailClosed}
	st := newStack(t, b, "name=a key=ip limit=100/1m", nil)
	srv := st.server
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	for i, ctx := range []context.Context{expired, cancelled, expired, cancelled, expired} {
		resp, err := srv.Check(ctx, checkRequest(step{}, true))
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if a := fromCheck(t, resp); a.status != 200 || a.headers["X-RateLimit-Remaining"] != strconv.Itoa(99-i) {
			t.Fatalf("call %d in a hurry: %d %v %s, want 200 with %d remaining", i+1, a.status, a.headers, a.body, 99-i)
		}
	}
	if a := st.viaCheck(t, step{}, true); a.status != 200 || a.headers["X-RateLimit-Remaining"] != "94" {
		t.Errorf("after the hurried calls: %d %v %s, want 200 with 94 remaining", a.status, a.headers, a.body)
	}
}
