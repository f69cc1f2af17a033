// Package rls answers Envoy's global rate-limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, and
// envoyproxy/ratelimit's POST /json, from an envoyproxy/ratelimit
// configuration (package envoyconf). It translates every descriptor of a
// request into algo.Requests and decides them all in one call, all or
// nothing, through the same Decider as /auth: the stores, fail modes and
// deny cache are shared.
package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/guard"
)

// Decider decides the policies of one request atomically: a guard.Guard.
// guard.ErrFailedOpen and guard.ErrUnavailable are answers too.
type Decider interface {
	Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error)
}

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
	// Config is the envoyproxy/ratelimit configuration. Required.
	Config *envoyconf.Config
	// Decider decides. Required.
	Decider Decider
	// Registry receives the metrics.
	Registry prometheus.Registerer
	// Logger logs failed decisions.
	Logger *slog.Logger
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
}

// Service is the rate-limit service.
type Service struct {
	pb.UnimplementedRateLimitServiceServer
	config  *envoyconf.Config
	decider Decider
	metrics *metrics
	log     *slog.Logger
	clock   func() time.Time
}

// New returns a Service.
func New(opts Options) (*Service, error) {
	if opts.Config == nil || opts.Decider == nil {
		return nil, errors.New("rls: a configuration and a decider are required")
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
	m, err := newMetrics(opts.Registry, opts.Config)
	if err != nil {
		return nil, err
	}
	return &Service{config: opts.Config, decider: opts.Decider, metrics: m, log: opts.Logger, clock: opts.Clock}, nil
}

// Register serves the service on s.
func (s *Service) Register(g *grpc.Server) { pb.RegisterRateLimitServiceServer(g, s) }

// applied is one limit applied to one descriptor of a request.
type applied struct {
	desc  int
	limit *envoyconf.Limit
	req   int // index in the decision's requests; -1 when not decided
}

// ShouldRateLimit decides a request's descriptors, all or nothing.
func (s *Service) ShouldRateLimit(ctx context.Context, r *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	resp, err := s.decide(ctx, r)
	if err != nil {
		s.metrics.count(err)
	}
	return resp, err
}

func (s *Service) decide(ctx context.Context, r *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	switch {
	case r.GetDomain() == "":
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	case len(r.GetDescriptors()) == 0:
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	case len(r.GetDescriptors()) > MaxDescriptors:
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors; the most is %d", len(r.GetDescriptors()), MaxDescriptors)
	}
	now := s.clock()
	var (
		apps    []applied
		reqs    []algo.Request
		keys    []byte
		spans   [][2]int
		entries []envoyconf.Entry
		denyAll = -1 // an enforcing limit of 0 per unit: the request is denied
	)
	var replaced map[string]bool // made by the first replaces
	for i, d := range r.GetDescriptors() {
		if d == nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d is null", i)
		}
		if len(d.GetEntries()) > MaxEntries {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries; the most is %d", i, len(d.GetEntries()), MaxEntries)
		}
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, envoyconf.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		var limits []*envoyconf.Limit
		var key []byte
		if o := d.GetLimit(); o != nil && s.config.HasDomain(r.GetDomain()) {
			l, err := s.config.Override(o.GetRequestsPerUnit(), envoyconf.Unit(o.GetUnit()))
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
			}
			limits = []*envoyconf.Limit{l}
			key = envoyconf.AppendOverrideKey(nil, r.GetDomain(), entries, l)
		} else {
			limits, key = s.config.Match(r.GetDomain(), entries, nil)
		}
		if len(limits) == 0 {
			continue
		}
		from := len(keys)
		keys = algo.AppendTag(keys, key)
		cost := requestCost(r, d)
		for _, l := range limits {
			for _, name := range l.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[name] = true
			}
			a := applied{desc: i, limit: l, req: -1}
			if l.Policy != nil && cost > 0 {
				a.req = len(reqs)
				reqs = append(reqs, algo.Request{Policy: l.Policy, Cost: cost, Shadow: l.Shadow})
				spans = append(spans, [2]int{from, len(keys)})
			}
			apps = append(apps, a)
		}
	}
	// A limit named in another's replaces is dropped, as in
	// envoyproxy/ratelimit: not decided, not counted.
	if len(replaced) > 0 {
		kept, kreqs, kspans := apps[:0], reqs[:0:0], spans[:0:0]
		for _, a := range apps {
			if a.limit.Name != "" && replaced[a.limit.Name] {
				continue
			}
			if a.req >= 0 {
				kreqs = append(kreqs, reqs[a.req])
				kspans = append(kspans, spans[a.req])
				a.req = len(kreqs) - 1
			}
			kept = append(kept, a)
		}
		apps, reqs, spans = kept, kreqs, kspans
	}
	for i, a := range apps {
		if a.limit.DeniesAll() && !a.limit.Shadow && denyAll < 0 {
			denyAll = i
		}
	}
	if len(reqs) > algo.MaxRules {
		return nil, status.Errorf(codes.InvalidArgument, "%d limits apply to the request; the most is %d", len(reqs), algo.MaxRules)
	}
	for i, sp := range spans {
		reqs[i].Key = keys[sp[0]:sp[1]]
	}

	res := make([]algo.Result, len(reqs))
	admitted, decided := true, false
	switch {
	case denyAll >= 0:
		// Denied whatever the store says: nothing is counted.
		admitted = false
	case len(reqs) > 0:
		// The caller's deadline does not bound the decision: the store's
		// own budget does. A caller choosing a deadline too short for any
		// store would otherwise count as the store failing, and could open
		// the circuit for everyone.
		ok, err := s.decider.Decide(context.WithoutCancel(ctx), reqs, res)
		switch {
		case errors.Is(err, guard.ErrFailedOpen):
			s.metrics.failedOpen.Inc()
			return s.failedOpen(r, apps), nil
		case errors.Is(err, guard.ErrUnavailable):
			return nil, status.Error(codes.Unavailable, "the rate-limit store could not decide; retry shortly")
		case errors.Is(err, algo.ErrInvalid):
			return nil, status.Errorf(codes.InvalidArgument, "%v", err)
		case err != nil:
			s.log.Error("rls decide", "err", err)
			return nil, status.Error(codes.Internal, "the decision failed")
		}
		admitted, decided = ok, true
	}
	resp := s.respond(r, apps, reqs, res, admitted, decided, now)
	s.metrics.record(apps, reqs, res, decided)
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		s.metrics.overLimit.Inc()
	} else {
		s.metrics.ok.Inc()
	}
	return resp, nil
}

// requestCost is what a descriptor adds: its own hits_addend, else the
// request's, else 1, as in envoyproxy/ratelimit; at most algo.MaxLimit,
// which is more than any limit admits.
func requestCost(r *pb.RateLimitRequest, d *rlpb.RateLimitDescriptor) int64 {
	var n uint64 = 1
	if h := d.GetHitsAddend(); h != nil {
		n = h.GetValue()
	} else if r.GetHitsAddend() > 0 {
		n = uint64(r.GetHitsAddend())
	}
	return int64(min(n, algo.MaxLimit))
}

// respond answers a decision: one status per descriptor, in order, and the
// rate-limit headers.
func (s *Service) respond(r *pb.RateLimitRequest, apps []applied, reqs []algo.Request, res []algo.Result, admitted, decided bool, now time.Time) *pb.RateLimitResponse {
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(r.GetDescriptors()))}
	// best[i] is the application that describes descriptor i.
	best := make([]int, len(resp.Statuses))
	for i := range best {
		best[i] = -1
	}
	for i, a := range apps {
		if b := best[a.desc]; b < 0 || describesBetter(a, apps[b], reqs, res) {
			best[a.desc] = i
		}
	}
	for i := range resp.Statuses {
		st := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
		resp.Statuses[i] = st
		b := best[i]
		if b < 0 {
			continue // no limit: OK, as envoyproxy/ratelimit answers
		}
		a := apps[b]
		l := a.limit
		switch {
		case l.Unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		case l.DeniesAll():
			st.CurrentLimit = currentLimit(l)
			st.DurationUntilReset = durationpb.New(untilWindowEnd(l.Unit, now))
			if !l.Shadow {
				st.Code = pb.RateLimitResponse_OVER_LIMIT
			}
			continue
		case a.req < 0 || !decided:
			// Not decided: a hits_addend of 0, or another limit denied
			// every request of this kind before the store was asked.
			continue
		}
		q := res[a.req]
		st.CurrentLimit = currentLimit(l)
		st.LimitRemaining = uint32(min(q.Remaining, math.MaxUint32))
		reset := q.ResetAfter
		if !q.Allowed && q.RetryAfter > reset {
			reset = q.RetryAfter
		}
		st.DurationUntilReset = durationpb.New(reset.Round(time.Second))
		if !q.Allowed && !l.Shadow {
			st.Code = pb.RateLimitResponse_OVER_LIMIT
		}
	}
	for _, st := range resp.Statuses {
		if st.Code == pb.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		}
	}
	if !admitted && resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		// Cannot happen: a denial has a denying enforcing limit.
		resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
	}
	if decided {
		resp.ResponseHeadersToAdd = headers(apps, reqs, res, admitted, now)
	}
	return resp
}

// describesBetter orders the limits of one descriptor for its status: a
// limit of 0 first, then an enforcing denial, then the fewest remaining.
func describesBetter(a, b applied, reqs []algo.Request, res []algo.Result) bool {
	rank := func(x applied) (int, int64) {
		switch {
		case x.limit.DeniesAll() && !x.limit.Shadow:
			return 0, 0
		case x.req >= 0 && !res[x.req].Allowed && !x.limit.Shadow:
			return 1, 0
		case x.req >= 0:
			return 2, res[x.req].Remaining
		}
		return 3, 0
	}
	ra, qa := rank(a)
	rb, qb := rank(b)
	return ra < rb || ra == rb && qa < qb
}

func currentLimit(l *envoyconf.Limit) *pb.RateLimitResponse_RateLimit {
	return &pb.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(l.Unit)}
}

// untilWindowEnd is the time left in the unit's current window, counted
// from the Unix epoch as envoyproxy/ratelimit counts it.
func untilWindowEnd(u envoyconf.Unit, now time.Time) time.Duration {
	w := int64(u.Window() / time.Second)
	return time.Duration(w-now.Unix()%w) * time.Second
}

// failedOpen answers when the store cannot decide and the fail mode
// admits: OK for every descriptor, without counts.
func (s *Service) failedOpen(r *pb.RateLimitRequest, apps []applied) *pb.RateLimitResponse {
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(r.GetDescriptors()))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	}
	for _, a := range apps {
		if a.limit.Unlimited {
			resp.Statuses[a.desc].LimitRemaining = math.MaxUint32
		}
	}
	return resp
}

// headers are the rate-limit headers /auth answers with, for the enforcing
// limits decided: RateLimit-Policy for each, X-RateLimit-Limit, -Remaining,
// -Reset and RateLimit for the most restrictive, and Retry-After on a
// denial.
func headers(apps []applied, reqs []algo.Request, res []algo.Result, admitted bool, now time.Time) []*core.HeaderValue {
	most := -1
	var policy []byte
	for _, a := range apps {
		if a.req < 0 || a.limit.Shadow {
			continue
		}
		p := a.limit.Policy
		if len(policy) > 0 {
			policy = append(policy, ", "...)
		}
		policy = fmt.Appendf(policy, `"%s";q=%d;w=%d`, p.Name(), p.Spec().Limit, ceilSeconds(p.Spec().Window, 1))
		if most < 0 || moreRestrictive(res[a.req], res[most], admitted) {
			most = a.req
		}
	}
	if most < 0 {
		return nil
	}
	r := res[most]
	hs := []*core.HeaderValue{
		{Key: "RateLimit-Policy", Value: string(policy)},
		{Key: "X-RateLimit-Limit", Value: strconv.FormatInt(r.Limit, 10)},
		{Key: "X-RateLimit-Remaining", Value: strconv.FormatInt(r.Remaining, 10)},
		{Key: "X-RateLimit-Reset", Value: strconv.FormatInt(ceilSeconds(time.Duration(now.UnixNano())+r.ResetAfter, 0), 10)},
		{Key: "RateLimit", Value: fmt.Sprintf(`"%s";r=%d;t=%d`, reqs[most].Policy.Name(), r.Remaining, ceilSeconds(r.ResetAfter, 0))},
	}
	if !admitted {
		var retry time.Duration
		for i, q := range res {
			if !q.Allowed && !reqs[i].Shadow {
				retry = max(retry, q.RetryAfter)
			}
		}
		if retry > 0 {
			hs = append(hs, &core.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(ceilSeconds(retry, 1), 10)})
		}
	}
	return hs
}

// moreRestrictive orders limits for the headers as /auth orders rules: on
// a denial, a denying limit over an allowing one, then the longer wait;
// otherwise fewer remaining, then the later reset.
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
	return max(int64((d+time.Second-1)/time.Second), floor)
}
