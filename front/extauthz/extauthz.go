// Package extauthz is authlimit's front for Envoy's external authorization
// over gRPC (envoy.service.auth.v3.Authorization/Check). It reads a
// CheckRequest into the decision engine's input, the same one the HTTP
// /auth endpoint fills, and writes the engine's outcome as a CheckResponse:
//
//   - the client is attributes.source.address, or, when that is a trusted
//     proxy, the client found in its X-Forwarded-For (or X-Real-IP) header
//     by the same rule as /auth; a source that is not an IP socket address
//     (a pipe) is local, as /auth takes a Unix-socket peer;
//   - the method, path and host are attributes.request.http's method,
//     path and host, never a header's: Envoy gives the request line itself,
//     so a client's own X-Forwarded-Method, -Uri or -Host moves nothing;
//   - a rule's tier header is believed only when attributes.source.address
//     is a trusted proxy, as /auth believes it only from a trusted peer;
//   - the headers are attributes.request.http.header_map when Envoy sends
//     raw headers (encode_raw_headers: true), whose repeats are counted
//     exactly, or else attributes.request.http.headers, in which Envoy joins
//     a repeated header's values with ",": there, a key or cost header whose
//     value holds a comma counts as repeated (urn:authlimit:repeated-header),
//     since a client could otherwise add a copy of its own to get a fresh
//     quota for the value the backend reads;
//   - the request's body length is what the proxies behind /auth state as
//     X-Original-Content-Length: Envoy's content-length header when it
//     forwards it (its codec holds the body to it), else
//     attributes.request.http.size when that is above 0. A rule counting
//     by Content-Length or X-Original-Content-Length reads that length,
//     never a client's own X-Original-Content-Length, and reads it as /auth
//     reads the header: a value that is not a whole number from 0 to
//     algo.MaxLimit (a size too large for any limit) is invalid-cost, a
//     repeated content-length is repeated-header, and no length is
//     missing, which the rule's cost_missing= decides. A size of 0 or below
//     states no length: Envoy fills size with the body bytes it has
//     received when it asks, 0 unless it buffers the body
//     (with_request_body), and -1 means unknown; taking 0 as an empty body
//     would let every upload past a byte-counting rule for nothing.
//
// An admitted request is OK, with the rate-limit headers in
// ok_response.response_headers_to_add (the client's response); a request
// that is not admitted is a denied_response with the engine's status (the
// deny status, 503 with Retry-After when the store cannot decide, 500), the
// headers and the problem JSON body. A CheckRequest without
// attributes.request.http has nothing to decide: it gets the gRPC status
// InvalidArgument.
//
// The store's budget (AUTHLIMIT_REDIS_TIMEOUT), not the call's deadline,
// bounds a decision: a caller with a short deadline, or one that gives up,
// must not count as the store failing. Envoy's ext_authz timeout should
// exceed that budget. A shaped request is held until its delay passes or
// the call ends.
package extauthz

import (
	"context"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/front/grpcwire"
	"github.com/authlimit/authlimit/rules"
)

// Options configure a Server.
type Options struct {
	// Engine decides. Required.
	Engine *decide.Engine
	// Proxies finds the client behind trusted proxies.
	Proxies rules.Proxies
	// Sleep holds a shaped request for d, or until ctx ends. Default: a
	// timer.
	Sleep func(ctx context.Context, d time.Duration)
}

// Server answers Check. Build it with New.
type Server struct {
	authv3.UnimplementedAuthorizationServer
	engine  *decide.Engine
	proxies rules.Proxies
	sleep   func(context.Context, time.Duration)
	scratch sync.Pool // *scratch
}

// New validates opts and returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Engine == nil {
		return nil, errors.New("extauthz: no engine")
	}
	if opts.Sleep == nil {
		opts.Sleep = sleep
	}
	s := &Server{engine: opts.Engine, proxies: opts.Proxies, sleep: opts.Sleep}
	s.scratch.New = func() any { return new(scratch) }
	return s, nil
}

// CheckMethod is the full path of the method Server answers.
const CheckMethod = "/envoy.service.auth.v3.Authorization/Check"

// Register serves the server's Check on g.
func (s *Server) Register(g *grpcwire.Server) error { return grpcwire.Unary(g, CheckMethod, s.Check) }

type scratch struct {
	in   decide.Input
	out  decide.Outcome
	hdrs headers
	xff  [][]byte
	size []byte // attributes.request.http.size, in decimal
	// values is where a response's header values are built.
	values []byte
}

// Check decides one request.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	h := req.GetAttributes().GetRequest().GetHttp()
	if h == nil {
		return nil, status.Error(codes.InvalidArgument, "extauthz: the CheckRequest has no attributes.request.http")
	}
	sc := s.scratch.Get().(*scratch)
	defer s.release(sc)
	sc.hdrs = headers{joined: h.GetHeaders()}
	sc.hdrs.lower = lowerKeys(sc.hdrs.joined)
	if m := h.GetHeaderMap(); m != nil {
		sc.hdrs = headers{raw: m.GetHeaders()}
	}
	sc.hdrs.length, sc.hdrs.lengths, sc.size = bodyLength(&sc.hdrs, h.GetSize(), sc.size[:0])
	sc.xff = sc.hdrs.all(sc.xff[:0], "x-forwarded-for")
	realIP, _ := sc.hdrs.Lookup("x-real-ip")
	src := peer(req.GetAttributes().GetSource().GetAddress())
	ip := s.proxies.ClientIP(sc.xff, realIP, src)
	s.engine.Read(&sc.in, ip, view(h.GetMethod()), view(h.GetPath()), view(h.GetHost()), &sc.hdrs)
	// Only a trusted proxy's tier header is believed, as for /auth.
	sc.in.TrustedPeer = s.proxies.Trusts(src.Unmap())

	// The caller's deadline and cancellation do not reach the decision:
	// the guard counts an abandoned decision as a store failure, so a
	// caller in a hurry (or one that gives up) would open the circuit for
	// everyone, and a decision sent to the store may consume there
	// whatever the caller does. The store's budget bounds it.
	s.engine.Decide(context.WithoutCancel(ctx), &sc.in, &sc.out)
	out := &sc.out
	if out.Delay > 0 {
		s.sleep(ctx, out.Delay)
	}
	var resp *authv3.CheckResponse
	resp, sc.values = response(out, sc.values[:0])
	return resp, nil
}

// release pools sc without the request's headers, which it would
// otherwise keep alive until its next use.
func (s *Server) release(sc *scratch) {
	sc.hdrs = headers{}
	clear(sc.xff)
	sc.in.Request.Header = nil
	s.scratch.Put(sc)
}

// response writes the outcome as a CheckResponse. An admitted request's
// response, its messages and its headers are one allocation and its
// headers' values one string (built by appending to buf, returned for
// reuse); a denial's messages are allocated each.
func response(out *decide.Outcome, buf []byte) (*authv3.CheckResponse, []byte) {
	rp := &reply{}
	hs, buf := rp.headers(out.Headers, buf)
	if out.Verdict.Admitted() {
		rp.ok.OkResponse = &rp.okResp
		rp.okResp.ResponseHeadersToAdd = hs
		rp.resp.Status = &rp.status
		rp.resp.HttpResponse = &rp.ok
		return &rp.resp, buf
	}
	ct := &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: "Content-Type", Value: "application/problem+json"},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
	rp.status.Code, rp.status.Message = int32(code(out.Verdict)), out.Kind
	rp.resp.Status = &rp.status
	rp.resp.HttpResponse = &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(out.Status)},
		Headers: append(hs, ct),
		Body:    string(out.Body),
	}}
	return &rp.resp, buf
}

// reply is a CheckResponse with the messages an OK answer points to,
// allocated as one. Its messages are never copied once in use.
type reply struct {
	resp    authv3.CheckResponse
	status  rpcstatus.Status
	ok      authv3.CheckResponse_OkResponse
	okResp  authv3.OkHttpResponse
	optPtrs [maxHeaders + 1]*corev3.HeaderValueOption // one more for a denial's Content-Type
	opts    [maxHeaders]corev3.HeaderValueOption
	values  [maxHeaders]corev3.HeaderValue
}

// maxHeaders is the most headers the engine answers with: see
// decide.Outcome.Headers.
const maxHeaders = 6

// headers returns hs as header options, each overwriting a header of the
// same name. The values become one string, built by appending to buf
// (returned for reuse); the names the engine writes are constants. More
// headers than a reply holds are allocated apart.
func (rp *reply) headers(hs []decide.Header, buf []byte) ([]*corev3.HeaderValueOption, []byte) {
	ptrs, opts, vals := rp.optPtrs[:0], rp.opts[:0], rp.values[:0]
	if len(hs) > maxHeaders {
		ptrs = make([]*corev3.HeaderValueOption, 0, len(hs)+1)
		opts, vals = make([]corev3.HeaderValueOption, 0, len(hs)), make([]corev3.HeaderValue, 0, len(hs))
	}
	if len(hs) == 0 {
		return ptrs, buf
	}
	from := len(buf)
	for _, h := range hs {
		buf = append(buf, h.Value...)
	}
	all := string(buf[from:])
	for _, h := range hs {
		vals = append(vals, corev3.HeaderValue{})
		v := &vals[len(vals)-1]
		v.Key, v.Value, all = headerName(h.Name), all[:len(h.Value)], all[len(h.Value):]
		opts = append(opts, corev3.HeaderValueOption{})
		o := &opts[len(opts)-1]
		o.Header, o.AppendAction = v, corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		ptrs = append(ptrs, o)
	}
	return ptrs, buf
}

// headerName is a header name as a string: the engine's names without an
// allocation.
func headerName(b []byte) string {
	switch string(b) {
	case "RateLimit-Policy":
		return "RateLimit-Policy"
	case "RateLimit":
		return "RateLimit"
	case "X-RateLimit-Limit":
		return "X-RateLimit-Limit"
	case "X-RateLimit-Remaining":
		return "X-RateLimit-Remaining"
	case "X-RateLimit-Reset":
		return "X-RateLimit-Reset"
	case "Retry-After":
		return "Retry-After"
	}
	return string(b)
}

// code is the gRPC status of a CheckResponse that is not OK. Envoy answers
// the client with the denied response's HTTP status whatever it is; the
// code tells Envoy's logs and stats why.
func code(v decide.Verdict) codes.Code {
	switch v {
	case decide.Deny:
		return codes.ResourceExhausted
	case decide.Invalid:
		return codes.InvalidArgument
	case decide.Unavailable:
		return codes.Unavailable
	case decide.Failed:
		return codes.Internal
	}
	return codes.PermissionDenied
}

// peer returns the source's IP address; a source that is not an IP socket
// address (a pipe, an internal address, none) is local, as /auth takes a
// Unix-socket peer.
func peer(a *corev3.Address) netip.Addr {
	if sa := a.GetSocketAddress(); sa != nil {
		if ip, ok := rules.ParseIP(view(sa.GetAddress())); ok {
			return ip
		}
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// bodyLength returns the request's body length as the rules read it (see
// the package's documentation) and how many there are: 0 for none, more
// than 1 for a repeated content-length. A size is appended to buf, which
// it returns.
func bodyLength(h *headers, size int64, buf []byte) ([]byte, int, []byte) {
	if v, n := h.lookup("content-length"); n > 0 {
		return v, n, buf
	}
	if size <= 0 {
		return nil, 0, buf
	}
	buf = strconv.AppendInt(buf, size, 10)
	return buf, 1, buf
}

// lengthHeaders are the headers that mean the request's body length to
// the rules: Content-Length, and X-Original-Content-Length, which the
// proxies behind /auth set to it.
var lengthHeaders = []string{"Content-Length", "X-Original-Content-Length"}

// headers gives rules a CheckRequest's headers: raw, one entry per header
// line, or joined, one value per name with repeats joined by ",".
type headers struct {
	raw    []*corev3.HeaderValue
	joined map[string]string
	// lower is whether every joined name is ASCII without an upper-case
	// letter, as Envoy sends them: then a name matches, in any case, only
	// the key that is its lower case.
	lower bool
	// length is the request's body length, lengths how many (see
	// bodyLength): what a body-length header reads.
	length  []byte
	lengths int
}

// Lookup implements rules.Headers. In joined headers, a value with a comma
// may be several lines joined: it counts as two. A body-length header
// (lengthHeaders) reads the request's body length.
func (h *headers) Lookup(name string) ([]byte, int) {
	for _, l := range lengthHeaders {
		if sameHeader(name, l) {
			return h.length, h.lengths
		}
	}
	return h.lookup(name)
}

// sameHeader reports whether a and b name one header, as rules compares
// names: ASCII case and '-' and '_' alike.
func sameHeader(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if foldHeaderByte(a[i]) != foldHeaderByte(b[i]) {
			return false
		}
	}
	return true
}

func foldHeaderByte(c byte) byte {
	switch {
	case 'A' <= c && c <= 'Z':
		return c + 'a' - 'A'
	case c == '_':
		return '-'
	}
	return c
}

// lookup looks name up in the headers as Envoy sent them.
func (h *headers) lookup(name string) ([]byte, int) {
	if h.joined != nil {
		v, ok := h.joined[name]
		if !ok && h.lower {
			v, ok = h.lowerLookup(name)
		} else if !ok {
			v, ok = h.foldLookup(name)
		}
		switch {
		case !ok:
			return nil, 0
		case strings.IndexByte(v, ',') >= 0:
			return nil, 2
		}
		return view(v), 1
	}
	var val []byte
	n := 0
	for _, x := range h.raw {
		if strings.EqualFold(x.GetKey(), name) {
			if n++; n == 1 {
				val = rawValue(x)
			}
		}
	}
	if n != 1 {
		return nil, n
	}
	return val, 1
}

// all appends every value of the named header, for X-Forwarded-For, whose
// joined values are one list anyway.
func (h *headers) all(dst [][]byte, name string) [][]byte {
	if h.joined != nil {
		if h.lower {
			if v, ok := h.lowerLookup(name); ok {
				dst = append(dst, view(v))
			}
			return dst
		}
		for k, v := range h.joined {
			if strings.EqualFold(k, name) {
				dst = append(dst, view(v))
			}
		}
		return dst
	}
	for _, x := range h.raw {
		if strings.EqualFold(x.GetKey(), name) {
			dst = append(dst, rawValue(x))
		}
	}
	return dst
}

// lowerLookup looks name up in lower-case joined headers (h.lower): the
// key, if any, that strings.EqualFold finds equal to name. A name longer
// than a header name can be, or not ASCII, is looked for key by key.
func (h *headers) lowerLookup(name string) (string, bool) {
	var buf [64]byte
	if len(name) > len(buf) {
		return h.foldLookup(name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 0x80:
			return h.foldLookup(name)
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	v, ok := h.joined[string(buf[:len(name)])]
	return v, ok
}

// foldLookup looks name up key by key.
func (h *headers) foldLookup(name string) (string, bool) {
	for k, v := range h.joined {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

// lowerKeys reports whether every key of m is ASCII without an upper-case
// letter.
func lowerKeys(m map[string]string) bool {
	for k := range m {
		for i := 0; i < len(k); i++ {
			if c := k[i]; c >= 0x80 || 'A' <= c && c <= 'Z' {
				return false
			}
		}
	}
	return true
}

// view is s as bytes, without a copy: for reading only, as rules reads a
// request (it copies what it keeps).
func view(s string) []byte {
	if s == "" {
		return []byte{} // empty, as []byte(s), not nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

func rawValue(x *corev3.HeaderValue) []byte {
	if len(x.GetRawValue()) > 0 {
		return x.GetRawValue()
	}
	return view(x.GetValue())
}

// sleep holds for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
