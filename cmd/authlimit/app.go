package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	goredis "github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/denials"
	"github.com/authlimit/authlimit/front/rls"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/handler"
	"github.com/authlimit/authlimit/internal/conncap"
	"github.com/authlimit/authlimit/internal/membudget"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset"
	"github.com/authlimit/authlimit/store/redis"
)

// app is a configured authlimit: the engine, the fronts, their servers and
// the stores.
type app struct {
	reg     *prometheus.Registry
	engine  *decide.Engine
	handler *handler.Handler
	guard   *guard.Guard
	server  *fasthttp.Server
	log     *slog.Logger
	closers []func() error
	// reload reloads AUTHLIMIT_RULES_FILE.
	reload *reloader
	// conns count what the listeners do with connections.
	conns connMetrics
	// connCap is AUTHLIMIT_MAX_CONNS over the decision listener, the
	// gRPC listener and the admin API's together.
	connCap *conncap.Cap
	// budget is AUTHLIMIT_MAX_BUFFERED_BYTES over every port's
	// unfinished requests.
	budget *membudget.Budget
	// stopping is closed when shutdown begins: it ends the holds of shaped
	// requests (see hold).
	stopping chan struct{}
	// sets holds the rule set in force: the rules and AUTHLIMIT_RLS_CONFIG,
	// swapped by reload.
	sets *ruleset.Holder
	// rls answers ShouldRateLimit and POST /json; nil without
	// AUTHLIMIT_RLS_CONFIG. grpc serves gRPC; nil without
	// AUTHLIMIT_GRPC_LISTEN.
	rls  *rls.Service
	grpc *grpcFront
	// admin serves the admin API; nil without AUTHLIMIT_ADMIN_LISTEN.
	admin *adminFront
	// spoa is the HAProxy SPOE agent; nil without AUTHLIMIT_SPOA_LISTEN.
	spoa *spoaFront
	// store decides, and remote says it is Redis; local is fail mode
	// local's store, nil otherwise.
	store, local guard.Store
	remote       bool
	// client is the Redis store's client; nil with the embedded store.
	client goredis.UniversalClient
	// denials keeps the top limited clients, the denial log and the
	// rules' rates.
	denials *denials.Recorder
}

// hold holds a shaped request for d, or until shutdown begins. A shaped
// request has already spent its quota, so a shutdown admits it at once
// rather than drop it at AUTHLIMIT_SHUTDOWN_TIMEOUT: the backend sees it
// a little early, the client is not refused what it was granted.
func (a *app) hold(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-a.stopping:
	}
}

// newApp builds authlimit from settings in steps: the stores, the guard
// over them, the recorder of denials, the engine, the HTTP handler, the other fronts (the
// rate-limit service and the gRPC server), the reloader, the admin API and
// the HTTP server. Each step builds on the ones before it, and a failure
// among the first five ends the build; the fronts and the admin API listen
// on ports of their own, and their problems go on one list, so that a
// start reports them all at once (a gRPC port and an admin port in use,
// say). A Redis that does not answer leaves authlimit deciding with the
// fail mode until it does; one that refuses authlimit's credentials or
// certificate is a configuration mistake.
func newApp(ctx context.Context, s *settings, log *slog.Logger) (*app, error) {
	a := &app{log: log, stopping: make(chan struct{}), reg: prometheus.NewRegistry()}
	a.warn(s)
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo(version))
	a.conns = newConnMetrics(a.reg)
	a.connCap = conncap.New(s.maxConns, a.conns.rejected.Inc)
	stopReleaser := make(chan struct{})
	a.closers = append(a.closers, func() error { close(stopReleaser); return nil })
	a.budget = newBudget(s, a.reg, func() int64 { return int64(a.connCap.Open()) }, stopReleaser)
	set, err := ruleset.New(s.rules, s.rls)
	if err != nil {
		a.close()
		return nil, err
	}
	a.sets = ruleset.NewHolder(set)
	for _, step := range []func(context.Context, *settings) error{a.newStores, a.newGuard, a.newRecorder, a.newEngine, a.newHandler} {
		if err := step(ctx, s); err != nil {
			a.close()
			return nil, err
		}
	}
	var problems []error
	for _, step := range []func(*settings) error{a.newFronts, a.newSPOA, a.newReloader, a.newAdmin} {
		problems = append(problems, step(s))
	}
	if err := errors.Join(problems...); err != nil {
		a.close()
		return nil, err
	}
	a.server = a.newServer(s)
	return a, nil
}

// warn logs what the settings leave to chance: the default rule, the
// configuration's warnings, the embedded store.
func (a *app) warn(s *settings) {
	if s.defaultRules {
		a.log.Warn("AUTHLIMIT_RULES is not set: using the default rule", "rule", rules.Default)
	}
	for _, w := range s.warnings {
		a.log.Warn("configuration warning", "detail", w)
	}
	if s.redisOptions == nil {
		a.log.Warn("AUTHLIMIT_REDIS_URL is not set: limits are kept in this instance's memory; replicas do not share them")
	}
}

// newGuard builds the guard over the stores and gets a Redis store ready:
// scripts loaded, connections open.
func (a *app) newGuard(ctx context.Context, s *settings) error {
	g, err := guard.New(guard.Options{
		Store:             a.store,
		Remote:            a.remote,
		Local:             a.local,
		FailMode:          s.failMode,
		Rules:             a.sets,
		LocalDivisor:      s.LocalDivisor,
		BreakerFailures:   s.BreakerFailures,
		BreakerBackoff:    s.BreakerBackoff,
		BreakerMaxBackoff: s.BreakerMaxBackoff,
		ProbeTimeout:      max(s.RedisTimeout, time.Second),
		DenyCacheSize:     s.DenyCacheSize,
		Registry:          a.reg,
		Logger:            a.log,
	})
	if err != nil {
		return err
	}
	a.guard = g
	a.closers = append(a.closers, func() error { g.Close(); return nil })
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = g.Start(sctx)
	if rs, ok := a.store.(*redis.Store); ok && err == nil {
		if missing, _ := rs.RefusedCommands(sctx); len(missing) > 0 {
			a.log.Warn("the redis user may not run "+strings.Join(missing, " or ")+": decisions stay exact, but decide.lua falls back to slower commands (SET ... KEEPTTL for SETRANGE, a GET per key for MGET, in a Redis Cluster a call per slot for EXISTS), which cost Redis more and add entries to ACL LOG; grant them (docs/security.md: Least-privilege Redis user)", "redis", s.redisDisplay)
		}
	}
	if err == nil {
		return nil
	}
	msg := redact(err.Error(), s.RedisURL)
	if refused(err) {
		return usageError{fmt.Errorf("redis refuses authlimit (%s): %s", s.redisDisplay, msg)}
	}
	if strings.HasPrefix(s.RedisURL, "redis://") && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		msg += " (a server that expects TLS closes plain connections: is the URL rediss://?)"
	}
	a.log.Warn("redis not ready at start; deciding with the fail mode until it answers", "err", msg, "fail_mode", s.failMode.String())
	return nil
}

// newRecorder builds the recorder of denials (the top limited clients,
// the denial log, the rules' rates) and runs it until the app closes.
func (a *app) newRecorder(_ context.Context, s *settings) error {
	d, err := newDenials(s, a.reg, a.log, a.client)
	if err != nil {
		return err
	}
	a.denials = d
	a.runDenials()
	return nil
}

// newEngine builds the decision engine every front asks.
func (a *app) newEngine(_ context.Context, s *settings) error {
	e, err := decide.New(decide.Options{
		Observer:   a.denials,
		Rules:      a.sets,
		Decider:    a.guard,
		AllowCIDRs: s.allow,
		BlockCIDRs: s.block,
		IPv4Prefix: s.IPv4Prefix,
		IPv6Prefix: s.IPv6Prefix,
		DenyStatus: s.DenyStatus,
		Shadow:     s.Shadow,
		Registry:   a.reg,
		Logger:     a.log,
	})
	a.engine = e
	return err
}

// newHandler builds the HTTP front: /auth, health, readiness, metrics.
func (a *app) newHandler(_ context.Context, s *settings) error {
	h, err := handler.New(handler.Options{
		Engine:       a.engine,
		Ready:        a.guard,
		Proxies:      rules.Proxies{Trusted: s.trusted},
		MethodHeader: s.MethodHeader,
		URIHeader:    s.URIHeader,
		HostHeader:   s.HostHeader,
		URLHeader:    s.URLHeader,
		Registry:     a.reg,
		Sleep:        a.hold,
	})
	a.handler = h
	return err
}

// newReloader builds what reloads the rule set.
func (a *app) newReloader(s *settings) error {
	r, err := newReloader(s, a.sets, a.reg, a.log, time.Now)
	a.reload = r
	return err
}

func (a *app) close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		_ = a.closers[i]()
	}
}
