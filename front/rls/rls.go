// Package rls answers Envoy's global rate-limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, and
// envoyproxy/ratelimit's POST /json, from an envoyproxy/ratelimit
// configuration (package envoyconf). It is a front of the decision engine
// (package decide), as /auth and Check are: it translates every descriptor
// of a request into the limits that apply to it and asks the engine to
// decide them all in one call, all or nothing (DecideLimits); the engine
// applies the fail modes, counts the metrics and works out the results, the
// most restrictive limit, Retry-After and the rate-limit headers. This
// package translates the engine's outcome back into one status per
// descriptor.
//
// A descriptor's status describes the limit of that descriptor that decided
// the request: a limit of 0 first, then an enforcing limit that denied, then
// the one with the fewest remaining. Every decided limit's status carries
// its current_limit and limit_remaining, however it was decided (the store,
// the guard's deny cache, which answers a request of one limit only, the
// local fallback). A descriptor with no limit, or whose limits were not
// asked, is OK without a current limit: a hits_addend of 0, or a limit of 0
// elsewhere in the request (which denies it before the store is asked).
//
// A descriptor in quota_mode (envoyconf.Limit.Quota) is decided as a
// shadow limit: its status says whether it is over, and the request is
// over the limit for the quota descriptors only when every one of them
// is, as envoyproxy/ratelimit answers. With Options.ResponseMetadata, the
// answer carries envoyproxy/ratelimit's dynamic_metadata (see
// setMetadata).
//
// No value a client controls makes an error, which Envoy's rate-limit
// filter would admit (failure_mode_deny: false): two descriptors that
// reach one limit are each counted; an override that cannot be served (not
// a unit, or past envoyconf.MaxOverrides distinct ones) and a request that
// reaches more limits than one decision holds are over the limit, nothing
// counted. Errors are left for what Envoy's configuration decides (an
// empty domain, no descriptors, more than MaxDescriptors or MaxEntries)
// and for the store (Unavailable, by the fail mode).
//
// Served on front/grpcwire (Register), ShouldRateLimit reads the fields it
// uses from the request's bytes, without decoding the rest (see
// readRequest), whenever it can tell that proto.Unmarshal would decode
// them without an error, and any other request is decoded whole: a
// request's meaning is proto.Unmarshal's either way. Its response is
// written to the wire as proto.Marshal would encode it (appendResponse).
package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/front/grpcwire"
	"github.com/authlimit/authlimit/internal/pbwire"
	"github.com/authlimit/authlimit/ruleset"
)

// Bounds on a request, beyond which it is refused with InvalidArgument
// before anything is decided.
const (
	// MaxDescriptors bounds the descriptors of one request.
	MaxDescriptors = algo.MaxRules
	// MaxEntries bounds the entries of one descriptor.
	MaxEntries = 64
)

// Options configure a Service.
type Options struct {
	// Rules holds the rule set in force, whose envoyproxy/ratelimit
	// configuration (ruleset.Set.RLS) the service answers from, read once
	// per request. Required, with a configuration.
	Rules *ruleset.Holder
	// Engine decides. Required.
	Engine *decide.Engine
	// Metrics count the requests, shared by every Service of the process
	// (see Metrics). Default: new ones, registered with Registry.
	Metrics *Metrics
	// Registry receives the metrics when Metrics is nil. Default: a new
	// registry.
	Registry prometheus.Registerer
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
	// ResponseMetadata answers with dynamic_metadata, as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does (see
	// setMetadata).
	ResponseMetadata bool
}

// Service is the rate-limit service.
type Service struct {
	pb.UnimplementedRateLimitServiceServer
	rules *ruleset.Holder
	// view is the engine limits of the last configuration a request was
	// answered from, made once per configuration (see viewOf).
	view      atomic.Pointer[configView]
	engine    *decide.Engine
	metrics   *Metrics
	rls, json *decide.Front // the fronts the metrics count gRPC's and /json's requests under
	clock     func() time.Time
	// metadata is Options.ResponseMetadata.
	metadata bool
	scratch  sync.Pool     // *scratch
	shape    *pbwire.Shape // RateLimitRequest's, for readRequest
}

// configView is a configuration as the service answers from it: its
// configured limits' engine limits, built once, and its overrides', built
// on first use (at most envoyconf.MaxOverrides: Config.Override returns
// one Limit per distinct override).
type configView struct {
	config    *envoyconf.Config
	limits    map[*envoyconf.Limit]*decide.Limit
	overrides sync.Map // *envoyconf.Limit → *decide.Limit
}

// New returns a Service.
func New(opts Options) (*Service, error) {
	if opts.Rules == nil || opts.Rules.Load().RLS() == nil || opts.Engine == nil {
		return nil, errors.New("rls: a rule set with a rate-limit configuration and an engine are required")
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	m := opts.Metrics
	if m == nil {
		if opts.Registry == nil {
			opts.Registry = prometheus.NewRegistry()
		}
		var err error
		if m, err = NewMetrics(opts.Registry); err != nil {
			return nil, err
		}
	}
	s := &Service{rules: opts.Rules, engine: opts.Engine, metrics: m, clock: opts.Clock, metadata: opts.ResponseMetadata,
		shape: pbwire.NewShape((&pb.RateLimitRequest{}).ProtoReflect().Descriptor())}
	var err error
	if s.rls, err = opts.Engine.Front("rls"); err != nil {
		return nil, err
	}
	if s.json, err = opts.Engine.Front("json"); err != nil {
		return nil, err
	}
	s.scratch.New = func() any { return &scratch{srv: s} }
	return s, nil
}

// ShouldRateLimitMethod is the full path of the method Service answers.
const ShouldRateLimitMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// Register serves the service's ShouldRateLimit on g, reading each
// request from its bytes and writing its response to the wire (see
// ShouldRateLimitWire).
func (s *Service) Register(g *grpcwire.Server) error {
	return grpcwire.UnaryRawAsync(g, ShouldRateLimitMethod, s.ShouldRateLimitWire, s.ShouldRateLimitAsync)
}

// viewOf returns the service's view of cfg, made once per configuration
// and kept until the next.
func (s *Service) viewOf(cfg *envoyconf.Config) *configView {
	if v := s.view.Load(); v != nil && v.config == cfg {
		return v
	}
	v := &configView{config: cfg, limits: map[*envoyconf.Limit]*decide.Limit{}}
	for _, l := range cfg.Limits() {
		if l.Policy != nil {
			v.limits[l] = s.engine.NewLimit(l.Label(), l.Policy)
		}
	}
	s.view.Store(v)
	return v
}

// limit returns l's engine limit. An override's is made on first use and
// counts under one metrics label; its name in the headers is its policy's.
func (s *Service) limit(v *configView, l *envoyconf.Limit) *decide.Limit {
	if d, ok := v.limits[l]; ok {
		return d
	}
	if d, ok := v.overrides.Load(l); ok {
		return d.(*decide.Limit)
	}
	d, _ := v.overrides.LoadOrStore(l, s.engine.NewLimitCountedAs(l.Policy.Name(), envoyconf.OverrideLabel, l.Policy))
	return d.(*decide.Limit)
}

// applied is one limit applied to one descriptor of a request.
type applied struct {
	desc  int
	limit *envoyconf.Limit
	req   int // index in the decision's requests; -1 when not decided
	// refused: the limit cannot be served (an override that is not a
	// unit, or one past envoyconf.MaxOverrides), or the request reaches
	// more limits than one decision holds. It denies the request, as a
	// limit of 0 does: an error would be an answer Envoy admits.
	refused bool
}

// scratch is the memory one request works in, pooled.
type scratch struct {
	srv *Service
	// An asynchronous call's: its answer, response buffer and time.
	reply *grpcwire.Reply
	resp  []byte
	now   time.Time

	req    request
	apps   []applied
	reqs   []decide.LimitRequest
	spans  []span // reqs[i].Key is keys[spans[i]]
	keys   []byte
	remap  []int  // translate's: old request index to new
	values []byte // the response headers' values, while they are copied
	detail []byte // a detailed metric's series, while it is looked up
	out    decide.Outcome
	ans    answer
}

type span struct{ from, to int }

func (sc *scratch) reset() {
	sc.apps, sc.reqs, sc.spans, sc.keys, sc.remap = sc.apps[:0], sc.reqs[:0], sc.spans[:0], sc.keys[:0], sc.remap[:0]
	sc.ans = answer{statuses: sc.ans.statuses[:0]}
}

// release pools sc without the request's strings and limits.
func (s *Service) release(sc *scratch) {
	sc.req.reset()
	clear(sc.apps[:cap(sc.apps)])
	clear(sc.reqs[:cap(sc.reqs)])
	clear(sc.ans.statuses[:cap(sc.ans.statuses)])
	sc.ans.headers, sc.ans.metadata = nil, nil
	sc.reply, sc.resp = nil, nil
	s.scratch.Put(sc)
}

// ShouldRateLimit decides a request's descriptors, all or nothing.
func (s *Service) ShouldRateLimit(ctx context.Context, r *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	return s.shouldRateLimit(ctx, r, s.rls)
}

// shouldRateLimit is ShouldRateLimit with its requests counted under
// front.
func (s *Service) shouldRateLimit(ctx context.Context, r *pb.RateLimitRequest, front *decide.Front) (*pb.RateLimitResponse, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.release(sc)
	sc.out.Front = front
	fromMessage(&sc.req, r)
	failedOpen, err := s.decide(ctx, sc)
	s.metrics.count(&sc.ans, failedOpen, err)
	if err != nil {
		return nil, err
	}
	var resp *pb.RateLimitResponse
	resp, sc.values = message(&sc.ans, sc.values[:0])
	return resp, nil
}

// ShouldRateLimitWire decides the request encoded in b and appends its
// encoded response to out, as ShouldRateLimit answers the decoded request
// and proto.Marshal encodes its response. A request readRequest cannot
// vouch for is decoded whole, as grpcwire.Unary would decode it.
func (s *Service) ShouldRateLimitWire(ctx context.Context, b, out []byte) ([]byte, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.release(sc)
	sc.out.Front = s.rls
	if !readRequest(&sc.req, b, s.shape) {
		var m pb.RateLimitRequest
		if err := proto.Unmarshal(b, &m); err != nil {
			return out, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		fromMessage(&sc.req, &m)
	}
	failedOpen, err := s.decide(ctx, sc)
	s.metrics.count(&sc.ans, failedOpen, err)
	if err != nil {
		return out, err
	}
	return appendResponse(out, &sc.ans), nil
}

// ShouldRateLimitAsync starts deciding the request encoded in b, as
// ShouldRateLimitWire decides it, and answers through r once decided (see
// Decided). It reports false, having done nothing, when the decision would
// hold its caller: ShouldRateLimitWire decides the call then.
func (s *Service) ShouldRateLimitAsync(_ context.Context, b, out []byte, r *grpcwire.Reply) bool {
	sc := s.scratch.Get().(*scratch)
	if !readRequest(&sc.req, b, s.shape) {
		s.release(sc)
		return false // decoded whole, on a worker
	}
	sc.now = s.clock()
	sc.reply, sc.resp = r, out
	sc.out.Front = s.rls
	ask, failedOpen, err := s.begin(sc, sc.now)
	if !ask {
		sc.send(failedOpen, err)
		return true
	}
	if !s.engine.DecideLimitsAsync(sc.reqs, &sc.out, sc) {
		s.release(sc)
		return false
	}
	return true
}

// Decided answers an asynchronous call once its outcome is ready.
func (sc *scratch) Decided(o *decide.Outcome) {
	failedOpen, err := sc.srv.conclude(sc, o, sc.now)
	sc.send(failedOpen, err)
}

// send counts sc's answer, encodes it, pools sc and answers its call.
func (sc *scratch) send(failedOpen bool, err error) {
	s, r, out := sc.srv, sc.reply, sc.resp
	defer func() {
		if p := recover(); p != nil {
			r.Send(nil, status.Errorf(codes.Internal, "rls: %v", p))
		}
	}()
	s.metrics.count(&sc.ans, failedOpen, err)
	if err == nil {
		out = appendResponse(out, &sc.ans)
	}
	s.release(sc)
	r.Send(out, err)
}

// decide answers sc.req into sc.ans; failedOpen reports an answer of the
// fail mode.
func (s *Service) decide(ctx context.Context, sc *scratch) (failedOpen bool, err error) {
	now := s.clock()
	ask, failedOpen, err := s.begin(sc, now)
	if !ask {
		return failedOpen, err
	}
	// The caller's deadline does not bound the decision: the store's own
	// budget does. A caller choosing a deadline too short for any store
	// would otherwise count as the store failing, and could open the
	// circuit for everyone; a caller that goes away must not abandon a
	// decision half-way. grpcwire.WithoutCancel detaches a call's context
	// without an allocation (its Done closes when the client resets the
	// call, which the decision must not see).
	out := &sc.out
	s.engine.DecideLimits(grpcwire.WithoutCancel(ctx), sc.reqs, out)
	return s.conclude(sc, out, now)
}

// begin checks sc.req and finds what to ask the engine, into sc.reqs. It
// reports ask false when the request is answered without the engine: an
// error, or sc.ans.
func (s *Service) begin(sc *scratch, now time.Time) (ask, failedOpen bool, err error) {
	r := &sc.req
	switch {
	case r.domain == "":
		return false, false, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	case r.ndesc == 0:
		return false, false, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	case r.ndesc > MaxDescriptors:
		return false, false, status.Errorf(codes.InvalidArgument, "%d descriptors; the most is %d", r.ndesc, MaxDescriptors)
	}
	sc.reset()
	if err := s.translate(r, sc, s.viewOf(s.rules.Load().RLS())); err != nil {
		return false, false, err
	}
	denyAll := false // an enforcing limit of 0 per unit, or a refused one, denies the request
	for _, a := range sc.apps {
		denyAll = denyAll || (a.refused || a.limit.DeniesAll()) && !a.limit.Shadow && !a.limit.Quota && !s.engine.Shadow()
	}
	if denyAll {
		// Denied whatever the store says: nothing is asked or counted.
		s.respond(r, sc, nil, now)
		return false, false, nil
	}
	for i, sp := range sc.spans {
		sc.reqs[i].Key = sc.keys[sp.from:sp.to]
	}
	return true, false, nil
}

// conclude answers sc.req from the engine's outcome, into sc.ans.
func (s *Service) conclude(sc *scratch, out *decide.Outcome, now time.Time) (failedOpen bool, err error) {
	r := &sc.req
	switch out.Verdict {
	case decide.Allow, decide.Deny, decide.Unmatched:
		s.respond(r, sc, out, now)
		return false, nil
	case decide.FailedOpen:
		s.openResponse(r, sc)
		return true, nil
	case decide.Unavailable:
		return false, status.Error(codes.Unavailable, "the rate-limit store could not decide; retry shortly")
	case decide.Invalid:
		return false, status.Error(codes.InvalidArgument, out.Detail)
	}
	return false, status.Error(codes.Internal, "the decision failed")
}

// translate finds the limits that apply to each descriptor of r, with
// their keys and costs, into sc: sc.apps, and sc.reqs for those the engine
// decides. A limit named in another's replaces is dropped, as in
// envoyproxy/ratelimit: not decided, not counted. Two descriptors that
// reach one limit are each counted, as envoyproxy/ratelimit counts them:
// under two keys, two requests of the limit; under one key (the same
// entries, or a share_threshold pattern), one request of their summed
// cost. Only what Envoy's configuration decides (a null descriptor, more
// entries than MaxEntries) is an error; what a client's values decide is
// an answer (see applied.refused).
func (s *Service) translate(r *request, sc *scratch, v *configView) error {
	var replaced map[string]bool // made by the first replaces
	for i := range r.descs {
		d := &r.descs[i]
		if d.null {
			return status.Errorf(codes.InvalidArgument, "descriptor %d is null", i)
		}
		if d.nentries > MaxEntries {
			return status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries; the most is %d", i, d.nentries, MaxEntries)
		}
		entries := r.entries[d.from:d.to]
		from := len(sc.keys)
		var limits []*envoyconf.Limit
		var override [1]*envoyconf.Limit
		refused := false
		if d.override && v.config.HasDomain(r.domain) {
			l, err := v.config.Override(d.rpu, envoyconf.Unit(d.unit))
			if err != nil {
				// Reported as sent, and over the limit.
				l, refused = &envoyconf.Limit{Key: "override", RequestsPerUnit: d.rpu, Unit: envoyconf.Unit(d.unit), Override: true}, true
			}
			override[0] = l
			limits = override[:]
			sc.keys = envoyconf.AppendOverrideKey(sc.keys, r.domain, entries, l)
		} else {
			limits, sc.keys = v.config.Match(r.domain, entries, sc.keys)
		}
		key := sc.keys[from:]
		cost := requestCost(r, d)
		for _, l := range limits {
			for _, name := range l.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[name] = true
			}
			a := applied{desc: i, limit: l, req: -1, refused: refused}
			if l.Policy != nil && cost > 0 && !refused {
				a.req = s.request(sc, v, l, key, from, cost)
			}
			sc.apps = append(sc.apps, a)
		}
	}
	if len(replaced) > 0 {
		s.dropReplaced(sc, replaced)
	}
	if len(sc.reqs) > algo.MaxRules {
		// More than one decision holds: over the limit, nothing counted.
		for i := range sc.apps {
			if a := &sc.apps[i]; a.limit.Policy != nil {
				a.refused, a.req = true, -1
			}
		}
		sc.reqs, sc.spans = sc.reqs[:0], sc.spans[:0]
	}
	return nil
}

// request returns the index of the request deciding l for key (at from in
// sc.keys) at cost: an earlier descriptor's of the same limit and key,
// which then counts both costs, or a new one.
func (s *Service) request(sc *scratch, v *configView, l *envoyconf.Limit, key []byte, from int, cost int64) int {
	for _, a := range sc.apps {
		if a.req >= 0 && a.limit == l {
			sp := sc.spans[a.req]
			if string(sc.keys[sp.from:sp.to]) == string(key) {
				q := &sc.reqs[a.req]
				q.Cost = min(q.Cost+cost, algo.MaxLimit)
				return a.req
			}
		}
	}
	// A quota limit does not deny alone: the engine decides it as a
	// shadow, and respond weighs the quota descriptors together.
	sc.reqs = append(sc.reqs, decide.LimitRequest{Limit: s.limit(v, l), Cost: cost, Shadow: l.Shadow || l.Quota})
	sc.spans = append(sc.spans, span{from, from + len(key)})
	return len(sc.reqs) - 1
}

// dropReplaced drops the applications of the replaced limits, and the
// requests only they used.
func (s *Service) dropReplaced(sc *scratch, replaced map[string]bool) {
	sc.remap = slices.Grow(sc.remap[:0], len(sc.reqs))[:len(sc.reqs)]
	for i := range sc.remap {
		sc.remap[i] = -1
	}
	apps, reqs, spans := sc.apps[:0], sc.reqs[:0], sc.spans[:0]
	for _, a := range sc.apps {
		if a.limit.Name != "" && replaced[a.limit.Name] {
			continue
		}
		if a.req >= 0 {
			if sc.remap[a.req] < 0 {
				// In place: a kept request moves down, never up.
				reqs = append(reqs, sc.reqs[a.req])
				spans = append(spans, sc.spans[a.req])
				sc.remap[a.req] = len(reqs) - 1
			}
			a.req = sc.remap[a.req]
		}
		apps = append(apps, a)
	}
	sc.apps, sc.reqs, sc.spans = apps, reqs, spans
}

// requestCost is what a descriptor adds: its own hits_addend, else the
// request's, else 1, as in envoyproxy/ratelimit; at most algo.MaxLimit,
// which is more than any limit admits.
func requestCost(r *request, d *descriptor) int64 {
	var n uint64 = 1
	if d.addend {
		n = d.hits
	} else if r.hits > 0 {
		n = uint64(r.hits)
	}
	return int64(min(n, algo.MaxLimit))
}

// respond answers a decision (out), or a denial by a limit of 0 (out nil),
// into sc.ans: one status per descriptor, in order, and the engine's
// rate-limit headers.
func (s *Service) respond(r *request, sc *scratch, out *decide.Outcome, now time.Time) {
	a := &sc.ans
	a.statuses = slices.Grow(a.statuses[:0], r.ndesc)[:r.ndesc]
	clear(a.statuses)
	var res []decide.Result
	if out != nil {
		res = out.Results
	}
	// best[i] is the application that describes descriptor i.
	var bestBuf [MaxDescriptors]int
	best := bestBuf[:r.ndesc]
	for i := range best {
		best[i] = -1
	}
	for i, ap := range sc.apps {
		if b := best[ap.desc]; b < 0 || s.rank(ap, res) < s.rank(sc.apps[b], res) {
			best[ap.desc] = i
		}
	}
	for i := range a.statuses {
		st := &a.statuses[i]
		b := best[i]
		if b < 0 {
			continue // no limit: OK, as envoyproxy/ratelimit answers
		}
		ap := sc.apps[b]
		l := ap.limit
		switch {
		case l.Unlimited:
			st.remaining = math.MaxUint32
			continue
		case l.DeniesAll() || ap.refused:
			st.limit = l
			st.hasReset, st.reset = l.Unit.Window() > 0, untilWindowEnd(l.Unit, now)
			st.overLimit = !l.Shadow && !s.engine.Shadow()
			continue
		case ap.req < 0 || res == nil || res[ap.req].NotDecided:
			// Not decided: see the package's documentation.
			continue
		}
		q := res[ap.req]
		st.limit = l
		st.remaining = uint32(min(q.Remaining, math.MaxUint32))
		reset := q.ResetAfter
		if !q.Allowed && q.RetryAfter > reset {
			reset = q.RetryAfter
		}
		st.hasReset, st.reset = true, reset.Round(time.Second)
		st.overLimit = !q.Allowed && !l.Shadow && !s.engine.Shadow()
	}
	// Over the limit: a descriptor that is not in quota mode, or every
	// one that is, as envoyproxy/ratelimit answers.
	var quotaBuf [MaxDescriptors]bool
	quota := quotaBuf[:r.ndesc]
	for _, ap := range sc.apps {
		quota[ap.desc] = quota[ap.desc] || ap.limit.Quota
	}
	quotas, quotasOver := 0, 0
	for i, st := range a.statuses {
		switch {
		case quota[i]:
			quotas++
			if st.overLimit {
				quotasOver++
			}
		case st.overLimit:
			a.overLimit = true
		}
	}
	if quotas > 0 && quotasOver == quotas {
		a.overLimit = true
	}
	s.setMetadata(r, sc)
	if out == nil {
		return
	}
	for _, ap := range sc.apps {
		if ap.limit.Detailed && ap.req >= 0 && ap.req < len(res) {
			d := &r.descs[ap.desc]
			sc.detail = s.metrics.countDetailed(ap.limit, r.entries[d.from:d.to], &res[ap.req], sc.detail)
		}
	}
	if !out.Verdict.Admitted() {
		// A denial has a denying enforcing limit, whose status says so.
		a.overLimit = true
	}
	a.headers = out.Headers
}

// openResponse answers when the store cannot decide and the fail mode
// admits, into sc.ans: OK for every descriptor, without counts.
func (s *Service) openResponse(r *request, sc *scratch) {
	a := &sc.ans
	a.statuses = slices.Grow(a.statuses[:0], r.ndesc)[:r.ndesc]
	clear(a.statuses)
	for _, ap := range sc.apps {
		if ap.limit.Unlimited {
			a.statuses[ap.desc].remaining = math.MaxUint32
		}
	}
	s.setMetadata(r, sc)
}

// message is a as a RateLimitResponse. The headers' values become one
// string, built by appending to buf (returned for reuse).
func message(a *answer, buf []byte) (*pb.RateLimitResponse, []byte) {
	rp := newReply(len(a.statuses))
	resp := &rp.resp
	resp.OverallCode = code(a.overLimit)
	for i, st := range resp.Statuses {
		x := &a.statuses[i]
		st.Code = code(x.overLimit)
		st.LimitRemaining = x.remaining
		if x.limit != nil {
			st.CurrentLimit = rp.currentLimit(x.limit)
		}
		if x.hasReset {
			st.DurationUntilReset = rp.duration(x.reset)
		}
	}
	resp.DynamicMetadata = a.metadata
	return resp, rp.setHeaders(a.headers, buf)
}

// reply is a response with the messages it points to, allocated as one:
// the answer to one descriptor, Envoy's usual request, costs one
// allocation for its messages, not one per message (a longer request's
// statuses take one more, and each of their current limits and durations
// its own). Its messages are never copied once in use.
type reply struct {
	resp       pb.RateLimitResponse
	statusPtr  [1]*pb.RateLimitResponse_DescriptorStatus
	status     [1]pb.RateLimitResponse_DescriptorStatus
	limit      [1]pb.RateLimitResponse_RateLimit
	reset      [1]durationpb.Duration
	headerPtrs [maxHeaders]*core.HeaderValue
	headers    [maxHeaders]core.HeaderValue
}

// maxHeaders is the most headers the engine answers with: see
// decide.Outcome.Headers.
const maxHeaders = 6

// newReply returns a response of n descriptor statuses, each OK without
// a current limit, overall OK.
func newReply(n int) *reply {
	rp := &reply{}
	rp.resp.OverallCode = pb.RateLimitResponse_OK
	statuses := rp.status[:]
	rp.resp.Statuses = rp.statusPtr[:]
	if n != 1 {
		statuses = make([]pb.RateLimitResponse_DescriptorStatus, n)
		rp.resp.Statuses = make([]*pb.RateLimitResponse_DescriptorStatus, n)
	}
	for i := range statuses {
		statuses[i].Code = pb.RateLimitResponse_OK
		rp.resp.Statuses[i] = &statuses[i]
	}
	return rp
}

// currentLimit is l as a status reports it.
func (rp *reply) currentLimit(l *envoyconf.Limit) *pb.RateLimitResponse_RateLimit {
	c := &rp.limit[0]
	if len(rp.resp.Statuses) != 1 {
		c = new(pb.RateLimitResponse_RateLimit)
	}
	c.Name, c.RequestsPerUnit, c.Unit = l.Name, l.RequestsPerUnit, pb.RateLimitResponse_RateLimit_Unit(l.Unit)
	return c
}

// duration is d as a status reports it, as durationpb.New makes it.
func (rp *reply) duration(d time.Duration) *durationpb.Duration {
	x := &rp.reset[0]
	if len(rp.resp.Statuses) != 1 {
		x = new(durationpb.Duration)
	}
	x.Seconds, x.Nanos = int64(d/time.Second), int32(d%time.Second)
	return x
}

// setHeaders sets the response's headers to hs. The values become one
// string, built by appending to buf (returned for reuse); the names the
// engine writes are constants.
func (rp *reply) setHeaders(hs []decide.Header, buf []byte) []byte {
	if len(hs) == 0 {
		return buf
	}
	ptrs, vals := rp.headerPtrs[:0], rp.headers[:0]
	if len(hs) > maxHeaders {
		ptrs, vals = make([]*core.HeaderValue, 0, len(hs)), make([]core.HeaderValue, 0, len(hs))
	}
	from := len(buf)
	for _, h := range hs {
		buf = append(buf, h.Value...)
	}
	all := string(buf[from:])
	for _, h := range hs {
		vals = append(vals, core.HeaderValue{})
		v := &vals[len(vals)-1]
		v.Key, v.Value, all = decide.HeaderName(h.Name), all[:len(h.Value)], all[len(h.Value):]
		ptrs = append(ptrs, v)
	}
	rp.resp.ResponseHeadersToAdd = ptrs
	return buf
}

// rank orders the limits of one descriptor for its status, lowest first:
// a limit of 0, then an enforcing denial, then the fewest remaining, then
// one that was not decided.
func (s *Service) rank(a applied, res []decide.Result) int64 {
	switch {
	case (a.limit.DeniesAll() || a.refused) && !a.limit.Shadow && !s.engine.Shadow():
		return -2
	case a.req < 0 || res == nil || res[a.req].NotDecided:
		return math.MaxInt64
	case !res[a.req].Allowed && !a.limit.Shadow && !s.engine.Shadow():
		return -1
	}
	return res[a.req].Remaining
}

// untilWindowEnd is the time left in the unit's current window, counted
// from the Unix epoch as envoyproxy/ratelimit counts it.
func untilWindowEnd(u envoyconf.Unit, now time.Time) time.Duration {
	w := int64(u.Window() / time.Second)
	if w == 0 {
		return 0 // not a unit
	}
	return time.Duration(w-now.Unix()%w) * time.Second
}

// setMetadata sets sc.ans's dynamic_metadata when the service answers
// with it, as envoyproxy/ratelimit writes it: the domain; each
// descriptor's entries ("key=value"), its limit override and its
// hits_addend; the request's hits_addend; and the metadata of the limits
// of every descriptor that is not over its limit (nor unlimited), merged
// in the order of the descriptors: a nested mapping merges, any other
// value is the first one's. Its strings are copies: the response outlives
// the request's bytes.
func (s *Service) setMetadata(r *request, sc *scratch) {
	if !s.metadata {
		return
	}
	a := &sc.ans
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(metadataString(r.domain))}
	descs := make([]*structpb.Value, 0, len(r.descs))
	for i := range r.descs {
		d := &r.descs[i]
		if d.null {
			continue
		}
		entries := make([]*structpb.Value, 0, d.to-d.from)
		for _, e := range r.entries[d.from:d.to] {
			entries = append(entries, structpb.NewStringValue(metadataString(e.Key+"="+e.Value)))
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if d.override {
			df["limit"] = structpb.NewStringValue(fmt.Sprintf("requests_per_unit:%d unit:%s", d.rpu, pb.RateLimitResponse_RateLimit_Unit(d.unit)))
		}
		if d.addend {
			df["hitsAddend"] = structpb.NewNumberValue(float64(d.hits))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if r.hits != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(r.hits))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i, st := range a.statuses {
		if st.overLimit || st.remaining == math.MaxUint32 && st.limit == nil {
			continue
		}
		for _, ap := range sc.apps {
			if ap.desc == i && ap.limit.Metadata != nil {
				mergeMetadata(passed, ap.limit.Metadata)
			}
		}
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	a.metadata = &structpb.Struct{Fields: fields}
}

// metadataString is s as dynamic_metadata holds it: a copy, the request's
// bytes being pooled once the call is answered, valid UTF-8 as a protobuf
// string must be (a descriptor's value is a client's header as sent).
func metadataString(s string) string {
	return strings.Clone(strings.ToValidUTF8(s, "\uFFFD"))
}

// mergeMetadata merges src into dst: a key dst lacks is added (a copy, so
// that a later merge never changes the configuration's), two mappings
// merge, and any other key keeps dst's value.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		switch {
		case !ok:
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
		case have.GetStructValue() != nil && v.GetStructValue() != nil:
			mergeMetadata(have.GetStructValue(), v.GetStructValue())
		}
	}
}
