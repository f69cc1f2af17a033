// Package handler is authlimit's HTTP endpoint: it turns a proxy's auth
// subrequest into the rules that apply, their keys and costs, asks a store
// for one atomic decision, and answers 200 or a denial with rate-limit
// headers. It never knows which store it talks to.
package handler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/authlimit/authlimit/algo"
)

// Decider decides the rules of one request atomically (algo.Redis and
// algo.Memory are two).
type Decider interface {
	Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error)
}

// Pinger reports whether a store answers.
type Pinger interface {
	Ping(ctx context.Context) error
}

// FailMode is what happens when the store fails or times out.
type FailMode uint8

// The fail modes.
const (
	FailLocal  FailMode = iota // decide with the local in-memory store
	FailOpen                   // allow
	FailClosed                 // deny with 503
)

func (m FailMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return "local"
}

// ParseFailMode reads open, closed or local.
func ParseFailMode(s string) (FailMode, error) {
	for _, m := range []FailMode{FailOpen, FailClosed, FailLocal} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown fail mode %q (want open, closed or local)", s)
}

// Options configure a Handler.
type Options struct {
	// Rules are the rules, in order.
	Rules []*Rule
	// Store decides. Required.
	Store Decider
	// Ping tells readiness whether Store answers; nil means always.
	Ping Pinger
	// Remote marks Store as a network store (Redis): decisions get the
	// Timeout budget, the circuit breaker and the fail mode.
	Remote bool
	// FailMode applies when a remote store fails. FailLocal needs Local.
	FailMode FailMode
	// Local is the fallback store for FailLocal, usually algo.Memory.
	Local Decider
	// LocalDivisor divides every limit and burst for the fallback: the
	// expected number of replicas deciding locally at once. Default 1.
	LocalDivisor int
	// Timeout is the budget of one remote decision. Default 50ms.
	Timeout time.Duration
	// BreakerFailures consecutive failures open the circuit for
	// BreakerBackoff, doubling per failed probe up to BreakerMaxBackoff.
	// Defaults 5, 1s, 30s.
	BreakerFailures   int
	BreakerBackoff    time.Duration
	BreakerMaxBackoff time.Duration
	// DenyCacheSize bounds the local deny cache; negative disables it.
	// Default 100,000.
	DenyCacheSize int
	// TrustedProxies are passed over when finding the client in
	// X-Forwarded-For; the X-Real-IP of a trusted peer is believed.
	TrustedProxies []netip.Prefix
	// AllowCIDRs are never limited; BlockCIDRs are always denied.
	AllowCIDRs, BlockCIDRs []netip.Prefix
	// IPv4Prefix and IPv6Prefix group addresses for the ip key part.
	// Defaults 32 and 64.
	IPv4Prefix, IPv6Prefix int
	// DenyStatus is the status of a denial. Default 429.
	DenyStatus int
	// Shadow makes every rule a shadow rule: nothing is denied.
	Shadow bool
	// MethodHeader, URIHeader and HostHeader name the headers that carry
	// the original request's method, URI and host. Defaults
	// X-Forwarded-Method, X-Forwarded-Uri, X-Forwarded-Host.
	MethodHeader, URIHeader, HostHeader string
	// Registry receives the metrics and serves /metrics. Default: a new
	// registry.
	Registry *prometheus.Registry
	// Logger logs state changes. Default: discard.
	Logger *slog.Logger
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
	// Sleep holds a shaped request. Default: time.Sleep.
	Sleep func(time.Duration)
}

// Handler answers auth subrequests, health and readiness checks and metric
// scrapes. Build it with New.
type Handler struct {
	rules        []*Rule
	policy       []string     // rules[i]'s RateLimit-Policy item
	local        []*algo.Rule // rules[i]'s limit divided for the fallback
	store        Decider
	ping         Pinger
	remote       bool
	failMode     FailMode
	fallback     Decider
	timeout      time.Duration
	breaker      *breaker
	denies       *denyCache
	ips          ipResolver
	allow, block []netip.Prefix
	v4, v6       int
	denyStatus   int
	shadow       bool
	methodHeader string
	uriHeader    string
	hostHeader   string
	metrics      *metrics
	serveMetrics fasthttp.RequestHandler
	log          *slog.Logger
	clock        func() time.Time
	sleep        func(time.Duration)
	scratch      sync.Pool
}

// New validates opts and returns a Handler.
func New(opts Options) (*Handler, error) {
	if opts.Store == nil {
		return nil, errors.New("handler: no store")
	}
	if opts.Remote && opts.FailMode == FailLocal && opts.Local == nil {
		return nil, errors.New("handler: fail mode local needs a local store")
	}
	if len(opts.Rules) == 0 {
		return nil, errors.New("handler: no rules")
	}
	setDefault(&opts.LocalDivisor, 1)
	setDefault(&opts.Timeout, 50*time.Millisecond)
	setDefault(&opts.BreakerFailures, 5)
	setDefault(&opts.BreakerBackoff, time.Second)
	setDefault(&opts.BreakerMaxBackoff, 30*time.Second)
	setDefault(&opts.DenyCacheSize, 100_000)
	setDefault(&opts.IPv4Prefix, 32)
	setDefault(&opts.IPv6Prefix, 64)
	setDefault(&opts.DenyStatus, fasthttp.StatusTooManyRequests)
	setDefault(&opts.MethodHeader, "X-Forwarded-Method")
	setDefault(&opts.URIHeader, "X-Forwarded-Uri")
	setDefault(&opts.HostHeader, "X-Forwarded-Host")
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
	h := &Handler{
		rules:        opts.Rules,
		store:        opts.Store,
		ping:         opts.Ping,
		remote:       opts.Remote,
		failMode:     opts.FailMode,
		fallback:     opts.Local,
		timeout:      opts.Timeout,
		ips:          ipResolver{trusted: opts.TrustedProxies},
		allow:        opts.AllowCIDRs,
		block:        opts.BlockCIDRs,
		v4:           opts.IPv4Prefix,
		v6:           opts.IPv6Prefix,
		denyStatus:   opts.DenyStatus,
		shadow:       opts.Shadow,
		methodHeader: opts.MethodHeader,
		uriHeader:    opts.URIHeader,
		hostHeader:   opts.HostHeader,
		metrics:      newMetrics(opts.Registry),
		serveMetrics: fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{})),
		log:          opts.Logger,
		clock:        opts.Clock,
		sleep:        opts.Sleep,
	}
	for _, r := range opts.Rules {
		s := r.Limit.Spec()
		h.policy = append(h.policy, fmt.Sprintf(`"%s";q=%d;w=%d`, r.Name, s.Limit, ceilSeconds(s.Window, 1)))
	}
	if opts.DenyCacheSize > 0 {
		h.denies = newDenyCache(opts.DenyCacheSize)
	}
	h.breaker = newBreaker(opts.BreakerFailures, opts.BreakerBackoff, opts.BreakerMaxBackoff, opts.Clock, h.circuitChanged)
	if opts.Remote && opts.FailMode == FailLocal {
		for _, r := range opts.Rules {
			lr, err := divided(r.Limit, opts.LocalDivisor)
			if err != nil {
				return nil, fmt.Errorf("handler: rule %q divided by %d: %w", r.Name, opts.LocalDivisor, err)
			}
			h.local = append(h.local, lr)
		}
	}
	n := len(opts.Rules)
	h.scratch.New = func() any {
		return &scratch{reqs: make([]algo.Request, 0, n), res: make([]algo.Result, n), rules: make([]int, 0, n), keys: make([]string, 0, n)}
	}
	return h, nil
}

func setDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// divided returns r with its limit and burst divided by n, at least 1.
func divided(r *algo.Rule, n int) (*algo.Rule, error) {
	s := r.Spec()
	s.Limit = max(s.Limit/int64(n), 1)
	s.Burst = max(s.Burst/int64(n), 1)
	if s.Algorithm != algo.TokenBucket && s.Algorithm != algo.LeakyBucket && s.Algorithm != algo.GCRA {
		s.Burst = 0 // Spec fills it in; NewRule refuses it for the others
	}
	return algo.NewRule(s)
}

func (h *Handler) circuitChanged(from, to int32) {
	h.metrics.circuitState.Set(float64(to))
	h.metrics.circuitChanges.WithLabelValues(circuitName(to)).Inc()
	level := slog.LevelWarn
	if to == circuitClosed {
		level = slog.LevelInfo
	}
	h.log.Log(context.Background(), level, "store circuit "+circuitName(to), "from", circuitName(from), "fail_mode", h.failMode.String())
}

// scratch is one request's working memory, pooled.
type scratch struct {
	reqs  []algo.Request
	res   []algo.Result
	rules []int    // reqs[i] is for h.rules[rules[i]]
	keys  []string // deny-cache keys, per request
}

// Serve routes: /auth decides, /healthz says alive, /readyz says whether the
// store answers, /metrics serves Prometheus metrics.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/auth":
		h.auth(ctx)
	case "/healthz":
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ok\n")
	case "/readyz":
		h.ready(ctx)
	case "/metrics":
		h.serveMetrics(ctx)
	default:
		ctx.Error("not found: authlimit serves /auth, /healthz, /readyz and /metrics\n", fasthttp.StatusNotFound)
	}
}

// ready answers 200 when the store answers, and also when it does not but
// the fail mode still decides (open or local): then the body says so and
// authlimit keeps serving. Only with fail mode closed does an unreachable
// store make authlimit unready, since it could only answer 503.
func (h *Handler) ready(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; charset=utf-8")
	if h.ping == nil {
		ctx.SetBodyString("ready\n")
		return
	}
	c, cancel := context.WithTimeout(context.Background(), max(h.timeout, 250*time.Millisecond))
	defer cancel()
	err := h.ping.Ping(c)
	switch {
	case err == nil:
		ctx.SetBodyString("ready\n")
	case h.remote && h.failMode != FailClosed:
		ctx.SetBodyString(fmt.Sprintf("degraded: store unreachable (%v); deciding with fail mode %s\n", err, h.failMode))
	default:
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(fmt.Sprintf("not ready: store unreachable (%v)\n", err))
	}
}

// auth decides one subrequest.
func (h *Handler) auth(ctx *fasthttp.RequestCtx) {
	hdr := &ctx.Request.Header
	now := h.clock()
	// Write header names as documented (X-RateLimit-Limit, not
	// X-Ratelimit-Limit); HTTP does not care, people reading them do.
	ctx.Response.Header.DisableNormalizing()

	peer, _ := netip.AddrFromSlice(remoteIP(ctx))
	ip := h.ips.clientIP(hdr.PeekAll(fasthttp.HeaderXForwardedFor), hdr.Peek("X-Real-IP"), peer)
	if contains(h.block, ip) {
		h.metrics.requests.WithLabelValues("blocked").Inc()
		h.problem(ctx, h.denyStatus, "blocked", "The client address is blocked.", nil)
		return
	}
	if contains(h.allow, ip) {
		h.metrics.requests.WithLabelValues("allowlisted").Inc()
		return
	}

	method := upperASCII(hdr.Peek(h.methodHeader))
	if method == "" {
		method = string(ctx.Method())
	}
	uri := hdr.Peek(h.uriHeader)
	if len(uri) == 0 {
		uri = ctx.Path()
	}
	path := normalizePath(uri)
	hostRaw := hdr.Peek(h.hostHeader)
	if len(hostRaw) == 0 {
		hostRaw = hdr.Host()
	}
	host := normalizeHost(hostRaw)

	sc := h.scratch.Get().(*scratch)
	defer h.scratch.Put(sc)
	sc.reqs, sc.rules, sc.keys = sc.reqs[:0], sc.rules[:0], sc.keys[:0]
	var ipStr string
	for i, r := range h.rules {
		if !r.matches(method, path, host) {
			continue
		}
		key, missing := h.key(r, hdr, ip, &ipStr, method, path, host)
		if missing != "" {
			if r.DenyOnMissing {
				h.metrics.requests.WithLabelValues("invalid").Inc()
				h.problem(ctx, h.denyStatus, "missing-key", fmt.Sprintf("Rule %q needs the %s header.", r.Name, missing), nil)
				return
			}
			continue
		}
		var cost int64
		if r.CostHeader != "" {
			c, err := parseCost(hdr.Peek(r.CostHeader))
			if err != nil {
				h.metrics.requests.WithLabelValues("invalid").Inc()
				h.problem(ctx, h.denyStatus, "invalid-cost", fmt.Sprintf("Rule %q: the %s header %v.", r.Name, r.CostHeader, err), nil)
				return
			}
			cost = c
		}
		sc.reqs = append(sc.reqs, algo.Request{Rule: r.Limit, Key: key, Cost: cost, Shadow: r.Shadow || h.shadow})
		sc.rules = append(sc.rules, i)
	}
	if len(sc.reqs) == 0 {
		h.metrics.requests.WithLabelValues("unmatched").Inc()
		return
	}
	res := sc.res[:len(sc.reqs)]

	if h.denies != nil && h.fromDenyCache(ctx, sc, res, now) {
		return
	}

	admitted, err := h.decide(sc, res)
	switch {
	case errors.Is(err, errUnavailable):
		h.metrics.requests.WithLabelValues("unavailable").Inc()
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		h.problem(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "The rate-limit store is unavailable.", nil)
		return
	case errors.Is(err, errFailedOpen):
		h.metrics.requests.WithLabelValues("allowed").Inc()
		return
	case err != nil:
		h.log.Error("decide", "err", err)
		h.metrics.requests.WithLabelValues("error").Inc()
		h.problem(ctx, fasthttp.StatusInternalServerError, "error", "The decision failed.", nil)
		return
	}
	h.respond(ctx, sc, res, admitted, now)
}

// errUnavailable and errFailedOpen carry the fail mode's verdict.
var (
	errUnavailable = errors.New("store unavailable")
	errFailedOpen  = errors.New("store unavailable: failing open")
)

// decide asks the store, within the budget and through the circuit breaker
// when it is remote, and falls back to the fail mode when it cannot answer.
func (h *Handler) decide(sc *scratch, res []algo.Result) (bool, error) {
	reqs := sc.reqs
	if !h.remote {
		start := time.Now()
		ok, err := h.store.Decide(context.Background(), reqs, res)
		h.metrics.storeLatency.WithLabelValues("primary").Observe(time.Since(start).Seconds())
		return ok, err
	}
	if h.breaker.allow() {
		ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
		start := time.Now()
		ok, err := h.store.Decide(ctx, reqs, res)
		cancel()
		h.metrics.storeLatency.WithLabelValues("primary").Observe(time.Since(start).Seconds())
		if err == nil {
			h.breaker.success()
			return ok, nil
		}
		if errors.Is(err, algo.ErrInvalid) {
			return false, err
		}
		h.breaker.failure()
		kind := "error"
		if errors.Is(err, context.DeadlineExceeded) {
			kind = "timeout"
		}
		h.metrics.storeErrors.WithLabelValues(kind).Inc()
		h.log.Debug("store failed", "kind", kind, "err", err)
	}
	h.metrics.failMode.WithLabelValues(h.failMode.String()).Inc()
	switch h.failMode {
	case FailOpen:
		return true, errFailedOpen
	case FailClosed:
		return false, errUnavailable
	}
	local := make([]algo.Request, len(reqs))
	for i, q := range reqs {
		local[i] = q
		local[i].Rule = h.local[sc.rules[i]]
	}
	start := time.Now()
	ok, err := h.fallback.Decide(context.Background(), local, res)
	h.metrics.storeLatency.WithLabelValues("local").Observe(time.Since(start).Seconds())
	return ok, err
}

// fromDenyCache answers from the deny cache when an enforcing rule's key
// was denied moments ago and cannot pass yet.
func (h *Handler) fromDenyCache(ctx *fasthttp.RequestCtx, sc *scratch, res []algo.Result, now time.Time) bool {
	hit := -1
	for i, q := range sc.reqs {
		key := q.Rule.StorageKey("", q.Key)
		sc.keys = append(sc.keys, key)
		if q.Shadow || hit >= 0 {
			continue
		}
		if r, ok := h.denies.get(key, q.EffectiveCost(), now); ok {
			res[i], hit = r, i
		}
	}
	if hit < 0 {
		return false
	}
	h.metrics.denyCacheHits.Inc()
	// Only the cached rule's answer is known; the others consumed nothing
	// and are reported as allowing.
	for i, q := range sc.reqs {
		if i != hit {
			res[i] = algo.Result{Allowed: true, Limit: q.Rule.Capacity(), Remaining: q.Rule.Capacity()}
		}
	}
	h.respond(ctx, sc, res[:len(sc.reqs)], false, now)
	return true
}

// respond writes the answer: metrics, deny cache, headers and status.
func (h *Handler) respond(ctx *fasthttp.RequestCtx, sc *scratch, res []algo.Result, admitted bool, now time.Time) {
	var violated []string
	var retry, delay time.Duration
	costTooHigh := false
	for i, r := range res {
		q := sc.reqs[i]
		name := h.rules[sc.rules[i]].Name
		switch {
		case r.Allowed:
			h.metrics.decisions.WithLabelValues(name, "allowed").Inc()
			delay = max(delay, r.Delay)
		case q.Shadow:
			h.metrics.decisions.WithLabelValues(name, "shadow_denied").Inc()
		default:
			h.metrics.decisions.WithLabelValues(name, "denied").Inc()
			violated = append(violated, name)
			retry = max(retry, r.RetryAfter)
			costTooHigh = costTooHigh || r.Reason == algo.ReasonCostTooHigh
			if h.denies != nil {
				h.denies.put(sc.keys[i], q.EffectiveCost(), r, now)
			}
		}
	}
	h.setHeaders(ctx, sc, res, admitted, now)
	if admitted {
		h.metrics.requests.WithLabelValues("allowed").Inc()
		if delay > 0 {
			h.metrics.delay.Observe(delay.Seconds())
			h.sleep(delay)
		}
		return
	}
	h.metrics.requests.WithLabelValues("denied").Inc()
	if costTooHigh && retry == 0 {
		h.problem(ctx, h.denyStatus, "cost-too-high", "The request costs more than the limit ever admits.", violated)
		return
	}
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.FormatInt(ceilSeconds(retry, 1), 10))
	h.problem(ctx, h.denyStatus, "rate-limited", "Too many requests.", violated)
}

// setHeaders writes X-RateLimit-* and RateLimit for the most restrictive
// enforcing rule, and RateLimit-Policy for every enforcing rule applied.
// Shadow rules stay out of the headers: they do not limit the client.
func (h *Handler) setHeaders(ctx *fasthttp.RequestCtx, sc *scratch, res []algo.Result, admitted bool, now time.Time) {
	most := -1
	var policy []byte
	for i, r := range res {
		if sc.reqs[i].Shadow {
			continue
		}
		if len(policy) > 0 {
			policy = append(policy, ", "...)
		}
		policy = append(policy, h.policy[sc.rules[i]]...)
		if most < 0 || moreRestrictive(r, res[most], admitted) {
			most = i
		}
	}
	if most < 0 {
		return
	}
	r := res[most]
	rh := &ctx.Response.Header
	rh.Set("X-RateLimit-Limit", strconv.FormatInt(r.Limit, 10))
	rh.Set("X-RateLimit-Remaining", strconv.FormatInt(r.Remaining, 10))
	rh.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(time.Duration(now.UnixNano())+r.ResetAfter, 0), 10))
	rh.SetBytesV("RateLimit-Policy", policy)
	rh.Set("RateLimit", `"`+h.rules[sc.rules[most]].Name+`";r=`+strconv.FormatInt(r.Remaining, 10)+";t="+strconv.FormatInt(ceilSeconds(r.ResetAfter, 0), 10))
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

// ceilSeconds rounds d up to whole seconds, at least floor.
func ceilSeconds(d time.Duration, floor int64) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, floor)
}

// problem writes an application/problem+json denial (RFC 9457) naming the
// violated rules.
func (h *Handler) problem(ctx *fasthttp.RequestCtx, status int, kind, detail string, violated []string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/problem+json")
	b := make([]byte, 0, 256)
	b = append(b, `{"type":"urn:authlimit:`...)
	b = append(b, kind...)
	b = append(b, `","title":`...)
	b = strconv.AppendQuote(b, fasthttp.StatusMessage(status))
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, detail)
	if violated != nil {
		b = append(b, `,"violated-policies":[`...)
		for i, v := range violated {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, v)
		}
		b = append(b, ']')
	}
	b = append(b, "}\n"...)
	ctx.SetBody(b)
}

// appendJSONString quotes s for JSON; rule and header names are ASCII
// tokens, but detail may carry anything.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for _, c := range []byte(s) {
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c >= 0x7f:
			b = append(b, fmt.Sprintf(`\u%04x`, c)...)
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// matches reports whether the rule applies to a request.
func (r *Rule) matches(method, path, host string) bool {
	if len(r.Methods) > 0 {
		found := false
		for _, m := range r.Methods {
			if m == method {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if r.Host != "" {
		if sub, ok := strings.CutPrefix(r.Host, "*."); ok {
			if !strings.HasSuffix(host, "."+sub) {
				return false
			}
		} else if host != r.Host {
			return false
		}
	}
	if r.PathPrefix != "" && !pathHasPrefix(path, r.PathPrefix) {
		return false
	}
	if r.PathRegexp != nil && !r.PathRegexp.MatchString(path) {
		return false
	}
	return true
}

// pathHasPrefix matches whole segments: "/login" covers "/login" and
// "/login/x" but not "/logins"; a prefix ending in "/" is a plain prefix.
func pathHasPrefix(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || strings.HasSuffix(prefix, "/") || path[len(prefix)] == '/'
}

// key builds the rule's key from the request. A single part is its value
// as it is; several are each prefixed with their length, so no two
// different requests share a key. It returns the name of a header that a
// key part needs and the request lacks.
func (h *Handler) key(r *Rule, hdr *fasthttp.RequestHeader, ip netip.Addr, ipStr *string, method, path, host string) (string, string) {
	var b strings.Builder
	for _, p := range r.Key {
		var v string
		switch p.Kind {
		case PartIP:
			if *ipStr == "" {
				*ipStr = ipKey(ip, h.v4, h.v6)
			}
			v = *ipStr
		case PartHeader:
			vals := hdr.PeekAll(p.Header)
			if len(vals) == 0 || len(vals) == 1 && len(vals[0]) == 0 {
				return "", p.Header
			}
			// Every value counts, so that a client sending a header
			// twice gets a key of its own, not someone else's.
			parts := make([]string, len(vals))
			for i, val := range vals {
				parts[i] = string(val)
			}
			v = strings.Join(parts, ", ")
		case PartHost:
			v = host
		case PartMethod:
			v = method
		case PartPath:
			v = path
		case PartGlobal:
			v = "*"
		}
		if len(r.Key) == 1 {
			return v, ""
		}
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		b.WriteString(v)
		b.WriteByte('|')
	}
	return b.String(), ""
}

// parseCost reads a cost header: absent or empty means the rule's own cost
// (returned as 0); otherwise a whole number from 1 to algo.MaxLimit.
func parseCost(v []byte) (int64, error) {
	if len(v) == 0 {
		return 0, nil
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("is not a whole number")
	case n < 1:
		return 0, fmt.Errorf("is not positive")
	case n > algo.MaxLimit:
		return 0, fmt.Errorf("is above %d", int64(algo.MaxLimit))
	}
	return n, nil
}

func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func upperASCII(b []byte) string {
	if len(b) > 32 {
		b = b[:32] // no method is longer; keep a huge header cheap
	}
	return strings.ToUpper(string(b))
}

func remoteIP(ctx *fasthttp.RequestCtx) net.IP {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP
	}
	return net.IPv4(127, 0, 0, 1) // an in-memory or Unix-socket peer is local
}
