// Package handler is authlimit's HTTP endpoint: it reads a proxy's auth
// subrequest (the client behind the trusted proxies, the original method,
// URI and host, the headers) into a decide.Input, asks the decision engine,
// and writes its outcome: 200 or a denial, with the rate-limit headers and a
// problem body. It also answers health and readiness checks and metric
// scrapes. On the request path it allocates nothing.
package handler

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/rules"
)

// Readier says whether decisions come from the store (see guard.Guard.Ready).
type Readier interface {
	Ready() (ready bool, detail string)
}

// Options configure a Handler. The caller gives every value; the defaults
// live with the configuration that reads them.
type Options struct {
	// Engine decides: the rules, the allow and block lists, the address
	// grouping and the deny status are its (decide.Options). Required.
	Engine *decide.Engine
	// Ready tells /readyz whether decisions come from the store; nil
	// means always.
	Ready Readier
	// Proxies finds the client behind trusted proxies.
	Proxies rules.Proxies
	// MethodHeader, URIHeader and HostHeader name the headers that carry
	// the original request's method, URI and host.
	MethodHeader, URIHeader, HostHeader string
	// URLHeader, when set, names a header with the original request's
	// absolute URL (ingress-nginx's X-Original-URL): the host and the URI
	// are read from it, never from HostHeader and URIHeader. A request
	// without it, with it more than once, or with one that is not an
	// absolute URL with a host is refused (urn:authlimit:invalid-url).
	URLHeader string
	// Registry serves /metrics. Default: a new registry.
	Registry *prometheus.Registry
	// Sleep holds a shaped request. Default: time.Sleep.
	Sleep func(time.Duration)
}

// Handler answers auth subrequests, health and readiness checks and metric
// scrapes. Build it with New.
type Handler struct {
	engine       *decide.Engine
	ready        Readier
	proxies      rules.Proxies
	methodHeader []byte // the header names, in the form fasthttp keeps
	uriHeader    []byte // a parsed request's header names: looked up
	hostHeader   []byte // without normalizing them again per request
	urlHeader    string
	serveMetrics fasthttp.RequestHandler
	sleep        func(time.Duration)
	scratch      sync.Pool
}

// New validates opts and returns a Handler.
func New(opts Options) (*Handler, error) {
	if opts.MethodHeader == "" || opts.URIHeader == "" || opts.HostHeader == "" {
		return nil, errors.New("handler: the method, URI and host headers need names")
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Sleep == nil {
		opts.Sleep = time.Sleep
	}
	if opts.Engine == nil {
		return nil, errors.New("handler: an engine is required")
	}
	front, err := opts.Engine.Front("http")
	if err != nil {
		return nil, err
	}
	h := &Handler{
		engine:       opts.Engine,
		ready:        opts.Ready,
		proxies:      opts.Proxies,
		methodHeader: canonicalHeader(opts.MethodHeader),
		uriHeader:    canonicalHeader(opts.URIHeader),
		hostHeader:   canonicalHeader(opts.HostHeader),
		urlHeader:    opts.URLHeader,
		serveMetrics: fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{})),
		sleep:        opts.Sleep,
	}
	h.scratch.New = func() any { return &scratch{out: decide.Outcome{Front: front}} }
	return h, nil
}

// Engine returns the engine the handler decides with, for other fronts to
// share.
func (h *Handler) Engine() *decide.Engine { return h.engine }

// scratch is one request's working memory, pooled, so that a decision
// allocates nothing.
type scratch struct {
	in   decide.Input
	out  decide.Outcome
	hdrs headers
}

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

// auth decides one subrequest: it reads the request into the engine's
// input, asks the engine, and writes the outcome. The decision runs under
// context.Background: fasthttp gives a request no deadline of its own, a
// per-request timer would allocate, and the store's budget bounds the
// wait.
func (h *Handler) auth(ctx *fasthttp.RequestCtx) {
	sc := h.scratch.Get().(*scratch)
	defer h.scratch.Put(sc)
	hdr := &ctx.Request.Header
	p := peer(ctx)
	ip := h.proxies.ClientIP(hdr.PeekAll(fasthttp.HeaderXForwardedFor), hdr.PeekCanonical(xRealIP), p)
	if h.read(ctx, sc, ip) {
		// Only a trusted proxy's tier header is believed.
		sc.in.TrustedPeer = h.proxies.Trusts(p.Unmap())
	} else {
		sc.in.Refuse(ip, "invalid-url", "The "+h.urlHeader+" header is missing, repeated, or not an absolute URL with a host.")
	}
	out := &sc.out
	h.engine.Decide(context.Background(), &sc.in, out)
	h.write(ctx, out)
	if out.Delay > 0 {
		h.sleep(out.Delay)
	}
}

// write answers with the outcome: its headers, as documented (X-RateLimit-
// Limit, not X-Ratelimit-Limit; HTTP does not care, people reading them
// do), and, when the request is not admitted, its status and problem.
func (h *Handler) write(ctx *fasthttp.RequestCtx, out *decide.Outcome) {
	rh := &ctx.Response.Header
	rh.DisableNormalizing()
	for _, x := range out.Headers {
		rh.SetCanonical(x.Name, x.Value)
	}
	if out.Verdict.Admitted() {
		return
	}
	ctx.SetStatusCode(out.Status)
	ctx.SetContentType("application/problem+json")
	ctx.SetBody(out.Body)
}

// read fills sc.in from the request: the original method, path and host,
// each normalized, and the client's key. Without a URI header, the path
// of a request under /auth/ is the rest of its path (Envoy's HTTP
// ext_authz sends the original path behind /auth). With a URL header, the
// host and
// the path come from it alone: it reports false if that header is absent,
// repeated or not an absolute URL with a host.
func (h *Handler) read(ctx *fasthttp.RequestCtx, sc *scratch, ip netip.Addr) bool {
	hdr := &ctx.Request.Header
	sc.hdrs.h = hdr
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
	h.engine.Read(&sc.in, ip, method, uri, host, &sc.hdrs)
	return true
}

// headers gives rules a request's headers. fasthttp keeps one value of the
// headers it parses itself (User-Agent, Content-Type, Host, ...), and
// keeps X_Api_Key apart from X-Api-Key, so how many times a header occurs
// is counted in the raw header block, which a request read from a
// connection has (see rules.LookupHeader).
type headers struct{ h *fasthttp.RequestHeader }

// Lookup implements rules.Headers.
func (x *headers) Lookup(name string) ([]byte, int) {
	return rules.LookupHeader(x.h.RawHeaders(), name, x.h.PeekAll(name))
}

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

// ReadInput reads ctx into in as /auth reads a subrequest, for a front
// that asks the engine about a request without deciding it (the admin
// API): the same method, URI, host and URL headers, and the client found
// in X-Forwarded-For and X-Real-IP behind the trusted proxies and ctx's
// peer, which the caller vouches for as a proxy; a tier header is
// believed, as a trusted proxy's is. in refers to ctx's headers: it is
// valid while ctx is.
func (h *Handler) ReadInput(ctx *fasthttp.RequestCtx, in *decide.Input) {
	hdr := &ctx.Request.Header
	p := peer(ctx)
	proxies := rules.Proxies{Trusted: append(slices.Clip(h.proxies.Trusted), netip.PrefixFrom(p, p.BitLen()))}
	ip := proxies.ClientIP(hdr.PeekAll(fasthttp.HeaderXForwardedFor), hdr.PeekCanonical(xRealIP), p)
	sc := &scratch{}
	if h.read(ctx, sc, ip) {
		// The caller stands in for the proxy: its tier header is
		// believed, as a trusted proxy's is.
		sc.in.TrustedPeer = true
	} else {
		sc.in.Refuse(ip, "invalid-url", "The "+h.urlHeader+" header is missing, repeated, or not an absolute URL with a host.")
	}
	*in = sc.in
}
