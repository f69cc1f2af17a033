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
//     quota for the value the backend reads; either way names compare as
//     /auth compares them (rules.SameHeader: case, '-' and '_' alike), so
//     x_api_key is X-Api-Key, and the two together are a repeated header;
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
//
// Served on front/grpcwire, Check reads those fields from the request's
// bytes, without decoding the rest (see readRequest), whenever it can tell
// that proto.Unmarshal would decode them without an error; any other
// request is decoded whole: a request's meaning is proto.Unmarshal's
// either way. Its response, admitted or denied, is written to the wire as
// proto.Marshal would encode it (appendOK, appendDenied).
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
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/front/grpcwire"
	"github.com/authlimit/authlimit/internal/pbwire"
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
	scratch sync.Pool     // *scratch
	shape   *pbwire.Shape // CheckRequest's, for readRequest
}

// New validates opts and returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Engine == nil {
		return nil, errors.New("extauthz: no engine")
	}
	if opts.Sleep == nil {
		opts.Sleep = sleep
	}
	front, err := opts.Engine.Front("extauthz")
	if err != nil {
		return nil, err
	}
	s := &Server{engine: opts.Engine, proxies: opts.Proxies, sleep: opts.Sleep,
		shape: pbwire.NewShape((&authv3.CheckRequest{}).ProtoReflect().Descriptor())}
	s.scratch.New = func() any { return &scratch{srv: s, out: decide.Outcome{Front: front}} }
	return s, nil
}

// CheckMethod is the full path of the method Server answers.
const CheckMethod = "/envoy.service.auth.v3.Authorization/Check"

// Register serves the server's Check on g, reading each request's bytes
// as they came (see readRequest). A call is decided as it comes, on the
// connection's reader, and answered by whoever completes its decision
// (see decide.Engine.DecideAsync); a decision that would hold the reader
// (a Redis Cluster) runs on a worker of g's.
func (s *Server) Register(g *grpcwire.Server) error {
	return grpcwire.UnaryRawAsync(g, CheckMethod, s.checkWire, s.checkAsync)
}

type scratch struct {
	srv *Server
	// An asynchronous call's: its context, answer and response buffer.
	ctx   context.Context
	reply *grpcwire.Reply
	resp  []byte

	req  request
	in   decide.Input
	out  decide.Outcome
	xff  [][]byte
	size []byte // attributes.request.http.size, in decimal
	// values is where a response's header values are built.
	values []byte
}

// request is what Check reads of a CheckRequest: see the package's
// documentation.
type request struct {
	http               bool   // attributes.request.http is present
	socket             bool   // attributes.source.address is a socket_address
	source             string // its address
	method, path, host string
	size               int64
	hdrs               headers // joinedList's or rawList's
	// joinedList and rawList are attributes.request.http's headers and
	// header_map, with their capacity kept for the next request.
	joinedList, rawList []field
}

// reset empties r, keeping its lists' capacity.
func (r *request) reset() {
	j, raw := r.joinedList, r.rawList
	clear(j)
	clear(raw)
	*r = request{joinedList: j[:0], rawList: raw[:0]}
	r.hdrs.joined = true
}

// Check decides one request.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.release(sc)
	fromMessage(&sc.req, req)
	out, err := s.check(ctx, sc)
	if err != nil {
		return nil, err
	}
	var resp *authv3.CheckResponse
	resp, sc.values = response(out, sc.values[:0])
	return resp, nil
}

// checkWire decides the request encoded in b and appends its encoded
// response to out. A request readRequest cannot vouch for is decoded
// whole, as Check's caller decodes it.
func (s *Server) checkWire(ctx context.Context, b, out []byte) ([]byte, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.release(sc)
	if !readRequest(&sc.req, b, s.shape) {
		var m authv3.CheckRequest
		if err := proto.Unmarshal(b, &m); err != nil {
			return out, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		fromMessage(&sc.req, &m)
	}
	o, err := s.check(ctx, sc)
	if err != nil {
		return out, err
	}
	if o.Verdict.Admitted() {
		return appendOK(out, o.Headers), nil
	}
	return appendDenied(out, o), nil
}

// checkAsync starts deciding the request encoded in b, as checkWire
// decides it, and answers through r once decided (see Decided). It
// reports false, having done nothing, when the decision would hold its
// caller: checkWire decides the call then.
func (s *Server) checkAsync(ctx context.Context, b, out []byte, r *grpcwire.Reply) bool {
	sc := s.scratch.Get().(*scratch)
	if !readRequest(&sc.req, b, s.shape) {
		s.release(sc)
		return false // decoded whole, on a worker
	}
	if !sc.req.http {
		s.release(sc)
		r.Send(out, status.Error(codes.InvalidArgument, "extauthz: the CheckRequest has no attributes.request.http"))
		return true
	}
	s.read(sc)
	sc.ctx, sc.reply, sc.resp = ctx, r, out
	if !s.engine.DecideAsync(&sc.in, &sc.out, sc) {
		s.release(sc)
		return false
	}
	return true
}

// Decided answers an asynchronous call once its outcome is ready. A
// shaped request is held, as check holds it, on a goroutine of its own.
func (sc *scratch) Decided(o *decide.Outcome) {
	if o.Delay > 0 {
		go func() {
			sc.srv.sleep(sc.ctx, o.Delay)
			sc.send(o)
		}()
		return
	}
	sc.send(o)
}

// send encodes sc's outcome, pools sc and answers its call.
func (sc *scratch) send(o *decide.Outcome) {
	r, out := sc.reply, sc.resp
	defer func() {
		if p := recover(); p != nil {
			r.Send(nil, status.Errorf(codes.Internal, "extauthz: %v", p))
		}
	}()
	if o.Verdict.Admitted() {
		out = appendOK(out, o.Headers)
	} else {
		out = appendDenied(out, o)
	}
	sc.srv.release(sc)
	r.Send(out, nil)
}

// fromMessage reads m into r.
func fromMessage(r *request, m *authv3.CheckRequest) {
	h := m.GetAttributes().GetRequest().GetHttp()
	sa := m.GetAttributes().GetSource().GetAddress().GetSocketAddress()
	r.reset()
	r.http, r.socket, r.source = h != nil, sa != nil, sa.GetAddress()
	r.method, r.path, r.host, r.size = h.GetMethod(), h.GetPath(), h.GetHost(), h.GetSize()
	for k, v := range h.GetHeaders() {
		r.joinedList = append(r.joinedList, field{key: k, value: v})
	}
	r.hdrs.list = r.joinedList
	if hm := h.GetHeaderMap(); hm != nil {
		for _, x := range hm.GetHeaders() {
			r.rawList = append(r.rawList, field{key: x.GetKey(), value: x.GetValue(), raw: x.GetRawValue()})
		}
		r.hdrs.joined, r.hdrs.list = false, r.rawList
	}
}

// check decides sc.req.
func (s *Server) check(ctx context.Context, sc *scratch) (*decide.Outcome, error) {
	r := &sc.req
	if !r.http {
		return nil, status.Error(codes.InvalidArgument, "extauthz: the CheckRequest has no attributes.request.http")
	}
	s.read(sc)

	// The caller's deadline and cancellation do not reach the decision:
	// the guard counts an abandoned decision as a store failure, so a
	// caller in a hurry (or one that gives up) would open the circuit for
	// everyone, and a decision sent to the store may consume there
	// whatever the caller does. The store's budget bounds it. A call's
	// context ends when its client resets it (the shaping hold below
	// watches that), so it is detached, without an allocation
	// (grpcwire.WithoutCancel).
	s.engine.Decide(grpcwire.WithoutCancel(ctx), &sc.in, &sc.out)
	out := &sc.out
	if out.Delay > 0 {
		s.sleep(ctx, out.Delay)
	}
	return out, nil
}

// read reads sc.req, which has attributes.request.http, into sc.in.
func (s *Server) read(sc *scratch) {
	r := &sc.req
	r.hdrs.length, r.hdrs.lengths, sc.size = bodyLength(&r.hdrs, r.size, sc.size[:0])
	sc.xff = r.hdrs.all(sc.xff[:0], "x-forwarded-for")
	realIP := r.hdrs.first("x-real-ip")
	src := peer(r.socket, r.source)
	ip := s.proxies.ClientIP(sc.xff, realIP, src)
	s.engine.Read(&sc.in, ip, view(r.method), view(r.path), view(r.host), &r.hdrs)
	// Only a trusted proxy's tier header is believed, as for /auth.
	sc.in.TrustedPeer = s.proxies.Trusts(src.Unmap())
}

// release pools sc without the request's headers, which it would
// otherwise keep alive until its next use.
func (s *Server) release(sc *scratch) {
	sc.req.reset()
	clear(sc.xff)
	sc.in.Request.Header = nil
	sc.ctx, sc.reply, sc.resp = nil, nil, nil
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
		v.Key, v.Value, all = decide.HeaderName(h.Name), all[:len(h.Value)], all[len(h.Value):]
		opts = append(opts, corev3.HeaderValueOption{})
		o := &opts[len(opts)-1]
		o.Header, o.AppendAction = v, corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		ptrs = append(ptrs, o)
	}
	return ptrs, buf
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
func peer(socket bool, address string) netip.Addr {
	if socket {
		if ip, ok := rules.ParseIP(view(address)); ok {
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
	list   []field
	joined bool
	// length is the request's body length, lengths how many (see
	// bodyLength): what a body-length header reads.
	length  []byte
	lengths int
}

// field is a header: a joined one's name and value, or a raw one's name,
// value and raw value.
type field struct {
	key, value string
	raw        []byte
}

// Lookup implements rules.Headers. In joined headers, a value with a comma
// may be several lines joined: it counts as two. A body-length header
// (lengthHeaders) reads the request's body length.
func (h *headers) Lookup(name string) ([]byte, int) {
	for _, l := range lengthHeaders {
		if rules.SameHeader(view(name), l) {
			return h.length, h.lengths
		}
	}
	return h.lookup(name)
}

// lookup looks name up in the headers as Envoy sent them, names compared
// as /auth compares them (rules.SameHeader: case, '-' and '_' alike), every
// entry that gives the header counted: X_Api_Key is X-Api-Key, and the two
// together are a repeated header, whether Envoy joined them or not.
func (h *headers) lookup(name string) ([]byte, int) {
	var val []byte
	n := 0
	for i := range h.list {
		f := &h.list[i]
		if !rules.SameHeader(view(f.key), name) {
			continue
		}
		if h.joined {
			v, m := joinedValue(f.value)
			val, n = v, n+m
		} else {
			val, n = rawValue(f), n+1
		}
	}
	if n != 1 {
		return nil, n
	}
	return val, 1
}

// joinedValue is a joined header's value: one with a comma may be several
// lines joined, and counts as two.
func joinedValue(v string) ([]byte, int) {
	if strings.IndexByte(v, ',') >= 0 {
		return nil, 2
	}
	return view(v), 1
}

// all appends every value of the named header, for X-Forwarded-For, whose
// joined values are one list anyway. Names compare in any case but with
// '-' and '_' apart, as /auth's server keeps them: a client's own
// X_Forwarded_For line is no hop.
func (h *headers) all(dst [][]byte, name string) [][]byte {
	for i := range h.list {
		f := &h.list[i]
		if len(f.key) == len(name) && strings.EqualFold(f.key, name) {
			dst = append(dst, rawValue(f))
		}
	}
	return dst
}

// first returns the named header's first value, names compared as all
// compares them: X-Real-IP, as /auth's server reads it.
func (h *headers) first(name string) []byte {
	for i := range h.list {
		f := &h.list[i]
		if len(f.key) == len(name) && strings.EqualFold(f.key, name) {
			return rawValue(f)
		}
	}
	return nil
}

// view is s as bytes, without a copy: for reading only, as rules reads a
// request (it copies what it keeps).
func view(s string) []byte {
	if s == "" {
		return []byte{} // empty, as []byte(s), not nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// rawValue is a header's value: a raw header's raw value when it has one.
func rawValue(f *field) []byte {
	if len(f.raw) > 0 {
		return f.raw
	}
	return view(f.value)
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
