package spoa

import (
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

// epoch is the tests' clock: every decision happens at this instant, so
// that two stacks answer alike to the second.
var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// newEngine returns an engine deciding src's rules with a fresh memory
// store through a guard, as authlimit does without Redis, on the tests'
// clock.
func newEngine(t testing.TB, src string) *decide.Engine {
	t.Helper()
	return newEngineIn(t, src, nil)
}

// newEngineIn is newEngine with its metrics registered in reg (nil: a
// registry of its own).
func newEngineIn(t testing.TB, src string, reg prometheus.Registerer) *decide.Engine {
	t.Helper()
	rs, err := rules.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return epoch }
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1, Clock: clock})
	t.Cleanup(func() { _ = m.Close() })
	h := rulesettest.Holder(t, rs)
	g, err := guard.New(guard.Options{Store: m, Rules: h, DenyCacheSize: 1000, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	e, err := decide.New(decide.Options{Rules: h, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429, Clock: clock, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// agentPeer serves an Agent of e and returns HAProxy's end of a
// connection to it, past the handshake.
func agentPeer(t testing.TB, e *decide.Engine, maxFrame uint64, opts ...func(*AgentOptions)) *peer {
	t.Helper()
	o := AgentOptions{Engine: e}
	for _, f := range opts {
		f(&o)
	}
	a, err := NewAgent(o)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startServer(t, a, nil)
	p := dial(t, addr)
	p.hello(maxFrame)
	return p
}

// clientRequest is a request as a client sends it to HAProxy.
type clientRequest struct {
	src     string // the client's address
	method  string
	target  string // the request line's target
	https   bool
	headers []string // name, value pairs, as sent, Host included
}

// get is a GET of path from src with the headers, Host localhost first.
func get(src, path string, headers ...string) clientRequest {
	return clientRequest{src: src, method: "GET", target: path, headers: append([]string{"Host", "localhost"}, headers...)}
}

// pathq is HAProxy's pathq of the target: the path and query, nothing
// for a target without a path.
func (c clientRequest) pathq() (string, bool) {
	t := c.target
	if strings.HasPrefix(t, "/") {
		return t, true
	}
	if _, rest, ok := strings.Cut(t, "://"); ok {
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			return rest[i:], true
		}
	}
	return "", false
}

// host is HAProxy's req.hdr(host): the last Host line's value.
func (c clientRequest) host() (string, bool) {
	v, ok := "", false
	for i := 0; i+1 < len(c.headers); i += 2 {
		if strings.EqualFold(c.headers[i], "host") {
			v, ok = c.headers[i+1], true
		}
	}
	return v, ok
}

// spoeMessage is the authlimit message haproxy/spoe-authlimit.conf has
// HAProxy send for the request.
func (c clientRequest) spoeMessage() []byte {
	src := netip.MustParseAddr(c.src)
	var args []arg
	if src.Is4() {
		a := src.As4()
		args = append(args, arg{argSrc, append([]byte{dataIPv4}, a[:]...)})
	} else {
		a := src.As16()
		args = append(args, arg{argSrc, append([]byte{dataIPv6}, a[:]...)})
	}
	args = append(args, str(argMethod, c.method))
	args = append(args, str(argURL, c.target))
	if h, ok := c.host(); ok {
		args = append(args, str(argHost, h))
	} else {
		args = append(args, arg{argHost, []byte{dataNull}})
	}
	https := byte(dataBool)
	if c.https {
		https |= dataTrue
	}
	args = append(args, arg{argHTTPS, []byte{https}})
	var block []byte
	for i := 0; i+1 < len(c.headers); i += 2 {
		block = appendString(block, strings.ToLower(c.headers[i]))
		block = appendString(block, c.headers[i+1])
	}
	block = append(block, 0, 0)
	args = append(args, arg{argHeaders, appendString([]byte{dataBinary}, string(block))})
	return encodeMessage(MessageName, args...)
}

// answer is what HAProxy makes of an ACK with haproxy/haproxy.cfg.
type answer struct {
	status  int // 200 when admitted
	headers map[string]string
	body    string
}

func (a answer) String() string {
	return fmt.Sprintf("%d %v %q", a.status, a.headers, a.body)
}

// ask sends the request's NOTIFY and reads its ACK.
func (p *peer) ask(c clientRequest, sid uint64) (answer, map[string]value) {
	p.t.Helper()
	p.write(frameNotify, flagFin, sid, 1, c.spoeMessage())
	gotSid, _, vars := p.ack()
	if gotSid != sid {
		p.t.Fatalf("ACK of stream %d, want %d", gotSid, sid)
	}
	return answerOf(p.t, vars), vars
}

// answerOf is what haproxy/haproxy.cfg answers with the variables.
func answerOf(t testing.TB, vars map[string]value) answer {
	a := answer{status: 200, headers: map[string]string{}}
	for name, v := range vars {
		switch name {
		case "verdict", "reason":
		case "status":
			a.status = int(v.n)
		case "body":
			a.body = string(v.b)
		default:
			h := responseHeader(name)
			if h == "" {
				t.Errorf("an unknown variable %s", name)
			}
			a.headers[h] = string(v.b)
		}
	}
	if v := string(vars["verdict"].b); v == "" {
		t.Error("no verdict")
	}
	return a
}

// responseHeader is the header haproxy/haproxy.cfg writes a variable to.
func responseHeader(v string) string {
	for _, h := range []string{"RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "Retry-After"} {
		if varName([]byte(h)) == v {
			return h
		}
	}
	return ""
}

// TestAgentAnswers: the variables of each verdict.
func TestAgentAnswers(t *testing.T) {
	e := newEngine(t, "name=per-ip key=ip limit=2/1m; name=api key=header:X-Api-Key limit=5/1m path=/api")
	p := agentPeer(t, e, 16380)

	for i, want := range []string{"1", "0"} {
		a, vars := p.ask(get("203.0.113.7", "/"), uint64(i+1))
		if got := string(vars["verdict"].b); got != "allow" || a.status != 200 || a.body != "" {
			t.Errorf("request %d: verdict %q, %s; want allow", i+1, got, a)
		}
		if _, ok := vars["reason"]; ok {
			t.Errorf("request %d: an admitted request with a reason", i+1)
		}
		wantHeaders := map[string]string{"RateLimit-Policy": `"per-ip";q=2;w=60`, "X-RateLimit-Limit": "2", "X-RateLimit-Remaining": want}
		for h, v := range wantHeaders {
			if a.headers[h] != v {
				t.Errorf("request %d: %s = %q, want %q", i+1, h, a.headers[h], v)
			}
		}
		reset, err := strconv.ParseInt(a.headers["X-RateLimit-Reset"], 10, 64)
		if err != nil || reset <= epoch.Unix() || reset > epoch.Add(2*time.Minute).Unix() || !strings.HasPrefix(a.headers["RateLimit"], `"per-ip";r=`+want+";t=") {
			t.Errorf("request %d: X-RateLimit-Reset %q, RateLimit %q", i+1, a.headers["X-RateLimit-Reset"], a.headers["RateLimit"])
		}
	}
	a, vars := p.ask(get("203.0.113.7", "/"), 3)
	if got := string(vars["verdict"].b); got != "deny" || a.status != 429 || string(vars["reason"].b) != "rate-limited" || a.headers["Retry-After"] == "" {
		t.Errorf("third request: verdict %q, reason %q, %s; want deny, rate-limited, 429 with Retry-After", got, vars["reason"].b, a)
	}
	if !strings.Contains(a.body, `"type":"urn:authlimit:rate-limited"`) || !strings.Contains(a.body, `"violated-policies":["per-ip"]`) {
		t.Errorf("denial body %q", a.body)
	}

	// No rule applies: unmatched, no headers.
	e2 := newEngine(t, "name=api key=ip limit=1/1m path=/api")
	p2 := agentPeer(t, e2, 16380)
	if a, vars := p2.ask(get("203.0.113.7", "/elsewhere"), 1); string(vars["verdict"].b) != "unmatched" || len(vars) != 1 {
		t.Errorf("no rule: %v (%s), want the verdict unmatched alone", vars, a)
	}
	// A repeated key header: refused, nothing counted.
	a, vars = p.ask(get("203.0.113.8", "/api", "X-Api-Key", "k1", "X_Api_Key", "k2"), 4)
	if string(vars["verdict"].b) != "invalid" || a.status != 429 || string(vars["reason"].b) != "repeated-header" || a.headers["Retry-After"] != "" {
		t.Errorf("X-Api-Key twice: %v", vars)
	}
}

// TestAgentCountsUnderItsFront: the engine's metrics count the agent's
// requests under the front "spoa", by result, each observed once in the
// front's duration histogram.
func TestAgentCountsUnderItsFront(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := agentPeer(t, newEngineIn(t, "name=per-ip key=ip limit=1/1m", reg), 16380)
	p.ask(get("203.0.113.7", "/"), 1)
	p.ask(get("203.0.113.7", "/"), 2)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := []string{}
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := f.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for k, want := range map[string]float64{
		"authlimit_requests_total{front=spoa,result=allowed}": 1,
		"authlimit_requests_total{front=spoa,result=denied}":  1,
		"authlimit_request_duration_seconds{front=spoa}":      2,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
}

// TestAgentInvalidMessages: a NOTIFY frame whose authlimit message is
// missing, or lacks or mistypes an argument, is refused as
// invalid-message for the client it names (or the peer), never admitted
// and never counted against anyone's quota.
func TestAgentInvalidMessages(t *testing.T) {
	e := newEngine(t, "name=per-ip key=ip limit=1/1m")
	p := agentPeer(t, e, 16380)
	good := get("203.0.113.9", "/")
	full := good.spoeMessage()
	tests := []struct {
		name string
		msgs []byte
	}{
		{"another message only", encodeMessage("other", str("method", "GET"))},
		{"no headers", encodeMessage(MessageName, str(argMethod, "GET"), str(argURL, "/"))},
		{"no method", encodeMessage(MessageName, str(argURL, "/"), arg{argHeaders, []byte{dataBinary, 2, 0, 0}})},
		{"no url", encodeMessage(MessageName, str(argMethod, "GET"), arg{argHeaders, []byte{dataBinary, 2, 0, 0}})},
		{"src a string", append(encodeMessage(MessageName, str(argSrc, "198.51.100.1")), full...)},
		{"headers not a block", encodeMessage(MessageName, str(argMethod, "GET"), str(argURL, "/"), arg{argHeaders, []byte{dataBinary, 1, 5}})},
		{"headers past their end", encodeMessage(MessageName, str(argMethod, "GET"), str(argURL, "/"), arg{argHeaders, []byte{dataBinary, 3, 0, 0, 0}})},
		{"method an integer", encodeMessage(MessageName, arg{argMethod, []byte{dataUint32, 3}}, str(argURL, "/"), arg{argHeaders, []byte{dataBinary, 2, 0, 0}})},
		{"malformed messages", full[:len(full)-1]},
	}
	for i, tt := range tests {
		p.write(frameNotify, flagFin, uint64(i), 1, tt.msgs)
		_, _, vars := p.ack()
		if string(vars["verdict"].b) != "invalid" || vars["status"].n != 429 || string(vars["reason"].b) != "invalid-message" {
			t.Errorf("%s: %v, want invalid-message", tt.name, vars)
		}
	}
	// The good request still has its quota: nothing was counted.
	if _, vars := p.ask(good, 99); string(vars["verdict"].b) != "allow" {
		t.Errorf("after the invalid frames: %v, want allow", vars)
	}
	// The first message of the name counts; a second is skipped.
	twice := append(good.spoeMessage(), get("203.0.113.10", "/").spoeMessage()...)
	p.write(frameNotify, flagFin, 100, 1, twice)
	if _, _, vars := p.ack(); string(vars["verdict"].b) != "deny" {
		t.Errorf("the message twice: %v, want deny (the first names 203.0.113.9, over its limit)", vars)
	}
}

// TestAgentShedsToFit: with HAProxy's least frame size (256 bytes), an
// answer leaves out the body, then headers, and keeps the verdict, status
// and reason.
func TestAgentShedsToFit(t *testing.T) {
	e := newEngine(t, "name=a-rule-with-a-rather-long-name-to-fill-the-frame key=ip limit=1/1m; name=another-rule-with-a-long-name key=ip limit=1/1m")
	p := agentPeer(t, e, 256)
	p.ask(get("203.0.113.7", "/"), 1)
	_, vars := p.ask(get("203.0.113.7", "/"), 2)
	if string(vars["verdict"].b) != "deny" || vars["status"].n != 429 || string(vars["reason"].b) != "rate-limited" {
		t.Errorf("denial in 256 bytes: %v", vars)
	}
	if _, ok := vars["body"]; ok {
		t.Errorf("the body fit in 256 bytes with everything else: %q", vars["body"].b)
	}
	p2 := agentPeer(t, e, 16380)
	if _, vars := p2.ask(get("203.0.113.7", "/"), 1); len(vars["body"].b) == 0 || len(vars) != 10 {
		t.Errorf("denial in 16380 bytes: %d variables, body %q; want all 10", len(vars), vars["body"].b)
	}
}

// TestAgentShaping: a request a shaping rule delays is answered once its
// delay has passed, or at once when Stopping closes.
func TestAgentShaping(t *testing.T) {
	e := newEngine(t, "name=shape key=ip limit=1/1s algorithm=leaky_bucket delay=5s")
	stopping := make(chan struct{})
	p := agentPeer(t, e, 16380, func(o *AgentOptions) { o.Stopping = stopping })
	p.ask(get("203.0.113.7", "/"), 1)
	p.write(frameNotify, flagFin, 2, 1, get("203.0.113.7", "/").spoeMessage())
	answered := make(chan map[string]value, 1)
	go func() { _, _, vars := p.ack(); answered <- vars }()
	select {
	case vars := <-answered:
		t.Fatalf("a delayed request answered at once: %v", vars)
	case <-time.After(300 * time.Millisecond):
	}
	close(stopping)
	select {
	case vars := <-answered:
		if string(vars["verdict"].b) != "allow" {
			t.Errorf("delayed request: %v, want allow", vars)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the delayed request was not answered when Stopping closed")
	}
}

// TestHeadersLookup: what the rules see of a request behind the agent.
func TestHeadersLookup(t *testing.T) {
	c := clientRequest{src: "2001:db8::7", method: "POST", target: "/x?y=1", https: true, headers: []string{
		"Host", "api.example.com", "X-Forwarded-For", "198.51.100.1", "X_Forwarded_Proto", "gopher",
		"X-Original-URI", "/public", "X-Real-IP", "198.51.100.2", "Forwarded", "for=198.51.100.3",
		"X-Api-Key", "k1", "x_api_key", "k2", "User-Agent", "curl", "Content-Length", "42",
		"Connection", "keep-alive", "Cookie", "a=1", "cookie", "b=2",
	}}
	var r request
	if kind, detail := readRequest(c.spoeMessage(), &r); kind != "" {
		t.Fatalf("readRequest: %s %s", kind, detail)
	}
	h := headers{req: &r, xff: []byte("2001:db8::7"), proto: protoHTTPS}
	tests := []struct {
		name string
		val  string
		n    int
	}{
		{"X-Forwarded-For", "2001:db8::7", 1},
		{"x_forwarded_for", "2001:db8::7", 1},
		{"X-Forwarded-Method", "POST", 1},
		{"X-Forwarded-Uri", "/x?y=1", 1},
		{"X-Forwarded-Host", "api.example.com", 1},
		{"X-Forwarded-Proto", "https", 1},
		{"X-Forwarded-Port", "", 0},
		{"X-Original-URI", "", 0},
		{"X-Real-IP", "", 0},
		{"Forwarded", "", 0},
		{"Connection", "", 0},
		{"X-Api-Key", "", 2},
		{"User-Agent", "curl", 1},
		{"user_agent", "curl", 1},
		{"Content-Length", "42", 1},
		{"X-Original-Content-Length", "42", 1},
		{"Cookie", "", 2},
		{"Host", "api.example.com", 1},
		{"Accept", "", 0},
	}
	for _, tt := range tests {
		v, n := h.Lookup(tt.name)
		if n != tt.n || string(v) != tt.val {
			t.Errorf("Lookup(%q) = %q, %d; want %q, %d", tt.name, v, n, tt.val, tt.n)
		}
	}
	if !bytes.Equal(r.uri, []byte("/x?y=1")) || r.src != netip.MustParseAddr("2001:db8::7") {
		t.Errorf("request %+v", r)
	}
}

// TestPathq: the path and query of each form of target, as HAProxy's
// pathq finds them, or the target itself when it has none, as
// haproxy/authlimit.lua falls back to it.
func TestPathq(t *testing.T) {
	for target, want := range map[string]string{
		"/a?b":               "/a?b",
		"/":                  "/",
		"http://h/a?b":       "/a?b",
		"https://h:8443/a/b": "/a/b",
		"http://h":           "http://h",
		"*":                  "*",
		"h/x://y":            "h/x://y",
		"/x?u=http://h/y":    "/x?u=http://h/y",
		"http://user@h/a":    "/a",
		"":                   "",
	} {
		if got := string(pathq([]byte(target))); got != want {
			t.Errorf("pathq(%q) = %q, want %q", target, got, want)
		}
	}
}
