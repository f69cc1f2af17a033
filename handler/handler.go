// Package handler is authlimit's HTTP endpoint: it reads a proxy's auth
// subrequest into a rules.Request, finds the rules that apply, their keys
// and costs, asks a Decider for one atomic decision, and answers 200 or a
// denial with rate-limit headers. It never knows which store decides; on the
// request path it allocates nothing.
package handler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
)

// Decider decides the policies of one request atomically: a guard.Guard, or
// a store. guard.ErrFailedOpen and guard.ErrUnavailable are answers too.
type Decider interface {
	Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error)
}

// Readier says whether decisions come from the store (see guard.Guard.Ready).
type Readier interface {
	Ready() (ready bool, detail string)
}

// Options configure a Handler. The caller gives every value; the defaults
// live with the configuration that reads them.
type Options struct {
	// Rules are the rules, in order. Required.
	Rules []*rules.Rule
	// Decider decides. Required.
	Decider Decider
	// Ready tells /readyz whether decisions come from the store; nil
	// means always.
	Ready Readier
	// Proxies finds the client behind trusted proxies.
	Proxies rules.Proxies
	// AllowCIDRs are never limited; BlockCIDRs are always denied.
	AllowCIDRs, BlockCIDRs []netip.Prefix
	// IPv4Prefix and IPv6Prefix group addresses for the ip key part.
	IPv4Prefix, IPv6Prefix int
	// DenyStatus is the status of a denial, 400 to 599.
	DenyStatus int
	// Shadow makes every rule a shadow rule: nothing is denied.
	Shadow bool
	// MethodHeader, URIHeader and HostHeader name the headers that carry
	// the original request's method, URI and host.
	MethodHeader, URIHeader, HostHeader string
	// URLHeader, when set, names a header with the original request's
	// absolute URL (ingress-nginx's X-Original-URL): the host and the URI
	// are read from it, never from HostHeader and URIHeader. A request
	// without it, with it more than once, or with one that is not an
	// absolute URL with a host is refused (urn:authlimit:invalid-url).
	URLHeader string
	// Registry receives the metrics and serves /metrics. Default: a new
	// registry.
	Registry *prometheus.Registry
	// Logger logs failed decisions. Default: discard.
	Logger *slog.Logger
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
	// Sleep holds a shaped request. Default: time.Sleep.
	Sleep func(time.Duration)
}

// Handler answers auth subrequests, health and readiness checks and metric
// scrapes. Build it with New.
type Handler struct {
	rules        []*rules.Rule
	policy       [][]byte // rules[i]'s RateLimit-Policy item
	names        [][]byte // rules[i]'s name, quoted for RateLimit
	decider      Decider
	ready        Readier
	proxies      rules.Proxies
	allow, block []netip.Prefix
	v4, v6       int
	denyStatus   int
	shadow       bool
	methodHeader []byte // the header names, in the form fasthttp keeps
	uriHeader    []byte // a parsed request's header names: looked up
	hostHeader   []byte // without normalizing them again per request
	urlHeader    string
	metrics      *metrics
	serveMetrics fasthttp.RequestHandler
	log          *slog.Logger
	clock        func() time.Time
	sleep        func(time.Duration)
	scratch      sync.Pool
}

// New validates opts and returns a Handler.
func New(opts Options) (*Handler, error) {
	var errs []error
	if opts.Decider == nil {
		errs = append(errs, errors.New("handler: no decider"))
	}
	if len(opts.Rules) == 0 || len(opts.Rules) > algo.MaxRules {
		errs = append(errs, fmt.Errorf("handler: %d rules; want 1 to %d", len(opts.Rules), algo.MaxRules))
	}
	if opts.DenyStatus < 400 || opts.DenyStatus > 599 {
		errs = append(errs, fmt.Errorf("handler: deny status %d is not 4xx or 5xx", opts.DenyStatus))
	}
	if opts.IPv4Prefix < 1 || opts.IPv4Prefix > 32 || opts.IPv6Prefix < 1 || opts.IPv6Prefix > 128 {
		errs = append(errs, fmt.Errorf("handler: IP prefixes /%d and /%d are out of range", opts.IPv4Prefix, opts.IPv6Prefix))
	}
	if opts.MethodHeader == "" || opts.URIHeader == "" || opts.HostHeader == "" {
		errs = append(errs, errors.New("handler: the method, URI and host headers need names"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Sleep == nil {
		opts.Sleep = time.Sleep
	}
	m, err := newMetrics(opts.Registry, opts.Rules)
	if err != nil {
		return nil, err
	}
	h := &Handler{
		rules:        opts.Rules,
		decider:      opts.Decider,
		ready:        opts.Ready,
		proxies:      opts.Proxies,
		allow:        opts.AllowCIDRs,
		block:        opts.BlockCIDRs,
		v4:           opts.IPv4Prefix,
		v6:           opts.IPv6Prefix,
		denyStatus:   opts.DenyStatus,
		shadow:       opts.Shadow,
		methodHeader: canonicalHeader(opts.MethodHeader),
		uriHeader:    canonicalHeader(opts.URIHeader),
		hostHeader:   canonicalHeader(opts.HostHeader),
		urlHeader:    opts.URLHeader,
		metrics:      m,
		serveMetrics: fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{})),
		log:          opts.Logger,
		clock:        opts.Clock,
		sleep:        opts.Sleep,
	}
	for _, r := range opts.Rules {
		s := r.Policy.Spec()
		h.policy = append(h.policy, []byte(fmt.Sprintf(`"%s";q=%d;w=%d`, r.Name, s.Limit, ceilSeconds(s.Window, 1))))
		h.names = append(h.names, []byte(`"`+r.Name+`"`))
	}
	n := len(opts.Rules)
	h.scratch.New = func() any {
		return &scratch{
			reqs:  make([]algo.Request, 0, n),
			res:   make([]algo.Result, n),
			rules: make([]int, 0, n),
			spans: make([]span, 0, n),
			buf:   make([]byte, 0, 1024),
			keys:  make([]byte, 0, 512),
			tags:  make([]byte, 0, 512),
			out:   make([]byte, 0, 512),
		}
	}
	return h, nil
}

// scratch is one request's working memory, pooled, so that a decision
// allocates nothing.
type scratch struct {
	q     rules.Request
	hdrs  headers
	reqs  []algo.Request
	res   []algo.Result
	rules []int  // reqs[i] is for h.rules[rules[i]]
	spans []span // reqs[i].Key is tags[spans[i]]
	buf   []byte // the normalized method, path, host and client key
	keys  []byte // the rules' keys, one at a time
	tags  []byte // the keys' tags
	out   []byte // header values and bodies being written
}

type span struct{ from, to int }

// Serve routes: /auth and every path under /auth/ decide, /healthz says
// alive, /readyz says whether decisions come from the store, /metrics
// serves Prometheus metrics.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
	if _, ok := underAuth(ctx); ok {
		h.auth(ctx)
		return
	}
	switch string(ctx.Path()) {
	case "/auth":
		h.auth(ctx)
	case "/healthz":
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ok\n")
	case "/readyz":
		h.readyz(ctx)
	case "/metrics":
		h.serveMetrics(ctx)
	default:
		ctx.Error("not found: authlimit serves /auth, /auth/*, /healthz, /readyz and /metrics\n", fasthttp.StatusNotFound)
	}
}

// authPrefix is what Envoy's HTTP ext_authz puts before the original path
// (its path_prefix).
var authPrefix = []byte("/auth/")

// underAuth returns the original path of a request under /auth/: the
// request line's path with /auth removed, as sent, before any decoding or
// normalization. It reads the path as sent, not as fasthttp normalizes it:
// /auth/../healthz is under /auth/ (the original path /../healthz), never
// the health check, so a client cannot turn its decision into a 200.
func underAuth(ctx *fasthttp.RequestCtx) ([]byte, bool) {
	p := ctx.Request.URI().PathOriginal()
	if !bytes.HasPrefix(p, authPrefix) {
		return nil, false
	}
	return p[len(authPrefix)-1:], true
}

// readyz answers 200 while decisions come from the store, and also when
// they do not but the fail mode still decides (open or local): then the
// body says so. Only when the fail mode could answer nothing but 503 is
// authlimit not ready.
func (h *Handler) readyz(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; charset=utf-8")
	if h.ready == nil {
		ctx.SetBodyString("ready\n")
		return
	}
	ready, detail := h.ready.Ready()
	if !ready {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	ctx.SetBodyString(detail + "\n")
}

// auth decides one subrequest.
func (h *Handler) auth(ctx *fasthttp.RequestCtx) {
	sc := h.scratch.Get().(*scratch)
	defer h.scratch.Put(sc)
	hdr := &ctx.Request.Header
	now := h.clock()
	// Write header names as documented (X-RateLimit-Limit, not
	// X-Ratelimit-Limit); HTTP does not care, people reading them do.
	ctx.Response.Header.DisableNormalizing()

	ip := h.proxies.ClientIP(hdr.PeekAll(fasthttp.HeaderXForwardedFor), hdr.PeekCanonical(xRealIP), peer(ctx))
	if contains(h.block, ip) {
		h.metrics.blocked.Inc()
		h.problem(ctx, sc, h.denyStatus, "blocked", "The client address is blocked.", nil)
		return
	}
	if contains(h.allow, ip) {
		h.metrics.allowlisted.Inc()
		return
	}
	if !h.read(ctx, sc, ip) {
		h.metrics.invalid.Inc()
		h.problem(ctx, sc, h.denyStatus, "invalid-url", "The "+h.urlHeader+" header is missing, repeated, or not an absolute URL with a host.", nil)
		return
	}

	sc.reqs, sc.rules, sc.spans, sc.tags = sc.reqs[:0], sc.rules[:0], sc.spans[:0], sc.tags[:0]
	for i, r := range h.rules {
		if !r.Match(&sc.q) {
			continue
		}
		var status rules.KeyStatus
		var header string
		sc.keys, status, header = r.AppendKey(sc.keys[:0], &sc.q)
		switch status {
		case rules.KeyMissing:
			if r.DenyOnMissing {
				h.metrics.invalid.Inc()
				h.problem(ctx, sc, h.denyStatus, "missing-key", fmt.Sprintf("Rule %q needs the %s header.", r.Name, header), nil)
				return
			}
			continue
		case rules.KeyRepeated:
			h.metrics.invalid.Inc()
			h.problem(ctx, sc, h.denyStatus, "repeated-header", fmt.Sprintf("Rule %q counts by the %s header, which the request has more than once.", r.Name, header), nil)
			return
		}
		cost, cs := r.Cost(&sc.q)
		switch cs {
		case rules.CostMissing:
			h.metrics.invalid.Inc()
			h.problem(ctx, sc, h.denyStatus, "missing-cost", fmt.Sprintf("Rule %q needs the %s header.", r.Name, r.CostHeader), nil)
			return
		case rules.CostRepeated:
			h.metrics.invalid.Inc()
			h.problem(ctx, sc, h.denyStatus, "repeated-header", fmt.Sprintf("Rule %q reads its cost from the %s header, which the request has more than once.", r.Name, r.CostHeader), nil)
			return
		case rules.CostInvalid:
			h.metrics.invalid.Inc()
			h.problem(ctx, sc, h.denyStatus, "invalid-cost", fmt.Sprintf("Rule %q: the %s header is not a whole number from 0 to %d.", r.Name, r.CostHeader, int64(algo.MaxLimit)), nil)
			return
		}
		if cost == 0 && r.CostHeader != "" {
			continue // an empty body counts nothing
		}
		from := len(sc.tags)
		sc.tags = algo.AppendTag(sc.tags, sc.keys)
		sc.spans = append(sc.spans, span{from, len(sc.tags)})
		sc.reqs = append(sc.reqs, algo.Request{Policy: r.Policy, Cost: cost, Shadow: r.Shadow || h.shadow})
		sc.rules = append(sc.rules, i)
	}
	if len(sc.reqs) == 0 {
		h.metrics.unmatched.Inc()
		return
	}
	for i, s := range sc.spans {
		sc.reqs[i].Key = sc.tags[s.from:s.to]
	}
	res := sc.res[:len(sc.reqs)]
	admitted, err := h.decider.Decide(context.Background(), sc.reqs, res)
	switch {
	case errors.Is(err, guard.ErrUnavailable):
		h.metrics.unavailable.Inc()
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		h.problem(ctx, sc, fasthttp.StatusServiceUnavailable, "unavailable", "The rate-limit store could not decide; retry shortly.", nil)
		return
	case errors.Is(err, guard.ErrFailedOpen):
		h.metrics.allowed.Inc()
		return
	case err != nil:
		h.log.Error("decide", "err", err)
		h.metrics.errors.Inc()
		h.problem(ctx, sc, fasthttp.StatusInternalServerError, "error", "The decision failed.", nil)
		return
	}
	h.respond(ctx, sc, res, admitted, now)
}

// read fills sc.q from the request: the original method, path and host,
// each normalized, and the client's key. Without a URI header, the path
// of a request under /auth/ is the rest of its path (Envoy's HTTP
// ext_authz sends the original path behind /auth). With a URL header, the host and
// the path come from it alone: it reports false if that header is absent,
// repeated or not an absolute URL with a host.
func (h *Handler) read(ctx *fasthttp.RequestCtx, sc *scratch, ip netip.Addr) bool {
	hdr := &ctx.Request.Header
	sc.hdrs.h = hdr
	buf := sc.buf[:0]
	method := hdr.PeekCanonical(h.methodHeader)
	if len(method) == 0 {
		method = ctx.Method()
	}
	var uri, host []byte
	if h.urlHeader != "" {
		u, n := sc.hdrs.Lookup(h.urlHeader)
		ok := false
		if n == 1 {
			host, uri, ok = rules.SplitURL(u)
		}
		if !ok {
			return false
		}
	} else {
		if uri = hdr.PeekCanonical(h.uriHeader); len(uri) == 0 {
			var ok bool
			if uri, ok = underAuth(ctx); !ok {
				uri = ctx.Path()
			}
		}
		if host = hdr.PeekCanonical(h.hostHeader); len(host) == 0 {
			host = hdr.Host()
		}
	}
	var at [4]int
	buf = rules.AppendMethod(buf, method)
	at[0] = len(buf)
	buf = rules.AppendPath(buf, uri)
	at[1] = len(buf)
	buf = rules.AppendHost(buf, host)
	at[2] = len(buf)
	buf = rules.AppendClientKey(buf, ip, h.v4, h.v6)
	at[3] = len(buf)
	sc.buf = buf
	sc.q = rules.Request{
		Method:    buf[:at[0]],
		Path:      buf[at[0]:at[1]],
		Host:      buf[at[1]:at[2]],
		ClientKey: buf[at[2]:at[3]],
		Header:    &sc.hdrs,
	}
	return true
}

// headers gives rules a request's headers. fasthttp keeps one value of the
// headers it parses itself (User-Agent, Content-Type, Host, ...), so how
// many times a header occurs is counted in the raw header block, which a
// request read from a connection has.
type headers struct{ h *fasthttp.RequestHeader }

// Lookup implements rules.Headers.
func (x *headers) Lookup(name string) ([]byte, int) {
	vals := x.h.PeekAll(name)
	n := len(vals)
	if raw := x.h.RawHeaders(); len(raw) > 0 {
		n = max(n, rules.CountHeader(raw, name))
	}
	if len(vals) == 0 {
		return nil, n
	}
	return vals[0], n
}

// respond writes the answer: metrics, headers and status.
func (h *Handler) respond(ctx *fasthttp.RequestCtx, sc *scratch, res []algo.Result, admitted bool, now time.Time) {
	var retry, delay time.Duration
	costTooHigh, violated := false, 0
	for i, r := range res {
		d := h.metrics.decisions[sc.rules[i]]
		switch {
		case r.Allowed:
			d.allowed.Inc()
			delay = max(delay, r.Delay)
		case sc.reqs[i].Shadow:
			d.shadowDenied.Inc()
		default:
			d.denied.Inc()
			violated++
			retry = max(retry, r.RetryAfter)
			costTooHigh = costTooHigh || r.Reason == algo.ReasonCostTooHigh
		}
	}
	h.setHeaders(ctx, sc, res, admitted, now)
	if admitted {
		h.metrics.allowed.Inc()
		if delay > 0 {
			h.metrics.delay.Observe(delay.Seconds())
			h.sleep(delay)
		}
		return
	}
	h.metrics.denied.Inc()
	if costTooHigh && retry == 0 {
		h.problem(ctx, sc, h.denyStatus, "cost-too-high", "The request costs more than the limit ever admits.", res)
		return
	}
	sc.out = strconv.AppendInt(sc.out[:0], ceilSeconds(retry, 1), 10)
	ctx.Response.Header.SetCanonical(retryAfter, sc.out)
	h.problem(ctx, sc, h.denyStatus, "rate-limited", "Too many requests.", res)
}

// setHeaders writes X-RateLimit-* and RateLimit for the most restrictive
// enforcing rule, and RateLimit-Policy for every enforcing rule applied.
// Shadow rules stay out of the headers: they do not limit the client.
func (h *Handler) setHeaders(ctx *fasthttp.RequestCtx, sc *scratch, res []algo.Result, admitted bool, now time.Time) {
	most := -1
	out := sc.out[:0]
	for i, r := range res {
		if sc.reqs[i].Shadow {
			continue
		}
		if len(out) > 0 {
			out = append(out, ", "...)
		}
		out = append(out, h.policy[sc.rules[i]]...)
		if most < 0 || moreRestrictive(r, res[most], admitted) {
			most = i
		}
	}
	if most < 0 {
		return
	}
	rh := &ctx.Response.Header
	rh.SetCanonical(rateLimitPolicy, out)
	r := res[most]
	out = strconv.AppendInt(out[:0], r.Limit, 10)
	rh.SetCanonical(xRateLimitLimit, out)
	out = strconv.AppendInt(out[:0], r.Remaining, 10)
	rh.SetCanonical(xRateLimitRemaining, out)
	out = strconv.AppendInt(out[:0], ceilSeconds(time.Duration(now.UnixNano())+r.ResetAfter, 0), 10)
	rh.SetCanonical(xRateLimitReset, out)
	out = append(out[:0], h.names[sc.rules[most]]...)
	out = append(out, ";r="...)
	out = strconv.AppendInt(out, r.Remaining, 10)
	out = append(out, ";t="...)
	out = strconv.AppendInt(out, ceilSeconds(r.ResetAfter, 0), 10)
	rh.SetCanonical(rateLimit, out)
	sc.out = out
}

// moreRestrictive orders rules for the headers: on a denial, a denying rule
// over an allowing one, then the longer wait; otherwise fewer remaining,
// then the later reset.
func moreRestrictive(a, b algo.Result, admitted bool) bool {
	if !admitted && a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if !admitted && !a.Allowed && a.RetryAfter != b.RetryAfter {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}

// The response headers' names as written: the response's names are not
// normalized (see auth), so SetCanonical writes them as they are.
var (
	rateLimitPolicy     = []byte("RateLimit-Policy")
	rateLimit           = []byte("RateLimit")
	xRateLimitLimit     = []byte("X-RateLimit-Limit")
	xRateLimitRemaining = []byte("X-RateLimit-Remaining")
	xRateLimitReset     = []byte("X-RateLimit-Reset")
	retryAfter          = []byte(fasthttp.HeaderRetryAfter)
)

// xRealIP is the X-Real-IP request header's name as fasthttp keeps it.
var xRealIP = canonicalHeader("X-Real-IP")

// canonicalHeader returns name as fasthttp keeps it in a parsed request's
// headers, for RequestHeader.PeekCanonical.
func canonicalHeader(name string) []byte {
	var rh fasthttp.RequestHeader
	rh.Set(name, "-")
	for k := range rh.All() {
		return bytes.Clone(k)
	}
	return []byte(name)
}

// ceilSeconds rounds d up to whole seconds, at least floor.
func ceilSeconds(d time.Duration, floor int64) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, floor)
}

// problem writes an application/problem+json denial (RFC 9457) naming the
// violated rules: those of res that denied and are not shadows.
func (h *Handler) problem(ctx *fasthttp.RequestCtx, sc *scratch, status int, kind, detail string, res []algo.Result) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/problem+json")
	b := sc.out[:0]
	b = append(b, `{"type":"urn:authlimit:`...)
	b = append(b, kind...)
	b = append(b, `","title":"`...)
	b = append(b, fasthttp.StatusMessage(status)...)
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, detail)
	if res != nil {
		b = append(b, `,"violated-policies":[`...)
		first := true
		for i, r := range res {
			if r.Allowed || sc.reqs[i].Shadow {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = append(b, h.names[sc.rules[i]]...)
		}
		b = append(b, ']')
	}
	b = append(b, "}\n"...)
	ctx.SetBody(b)
	sc.out = b
}

// appendJSONString quotes s for JSON; rule and header names are ASCII
// tokens, but detail may carry anything.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c >= 0x7f:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peer returns the TCP peer's address; an in-memory or Unix-socket peer is
// local.
func peer(ctx *fasthttp.RequestCtx) netip.Addr {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip
		}
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}
