// Command authlimit is a rate limiter for a proxy's auth subrequests (nginx
// auth_request, OpenResty, Traefik forwardAuth, Caddy forward_auth). It is
// configured by AUTHLIMIT_* environment variables; see README.md.
//
//	authlimit              serve
//	authlimit -check       validate the environment and print the configuration
//	authlimit -healthcheck ask a running authlimit's /healthz (for container health checks)
//	authlimit -version     print the version
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	goredis "github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/denials"
	"github.com/authlimit/authlimit/front/rls"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/handler"
	"github.com/authlimit/authlimit/internal/conncap"
	"github.com/authlimit/authlimit/internal/httpconn"
	"github.com/authlimit/authlimit/internal/membudget"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/store/redis"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a mistake in the command line or the environment: exit 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// run is the whole program: it returns when ctx ends (after a graceful
// shutdown) or when serving fails.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("authlimit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	check := fs.Bool("check", false, "validate the environment, print the effective configuration and exit")
	showVersion := fs.Bool("version", false, "print the version and exit")
	health := fs.Bool("healthcheck", false, "ask the authlimit serving on AUTHLIMIT_LISTEN for /healthz; exit 0 if it answers 200")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *showVersion {
		fmt.Fprintln(stdout, "authlimit", version)
		return nil
	}
	s, err := loadConfig(envMap(environ))
	if err != nil {
		return usageError{fmt.Errorf("configuration:\n%s", indent(err.Error()))}
	}
	fdLimit, fdErr := raiseFDLimit()
	s.limitConns(fdLimit)
	if *check {
		fmt.Fprint(stdout, s.describe())
		return nil
	}
	if *health {
		return healthcheck(s)
	}

	log := newLogger(s, stderr)
	setRuntimeLimit(envMap(environ), log)
	if fdErr != nil {
		log.Warn("could not raise the open file limit", "err", fdErr, "limit", fdLimit)
	}
	if s.MaxConns > 0 && fdLimit > 0 && uint64(s.MaxConns) > fdLimit {
		log.Warn("AUTHLIMIT_MAX_CONNS is above the open file limit: beyond the limit, accepts fail and wait instead of closing new connections at once", "max_conns", s.MaxConns, "open_file_limit", fdLimit)
	}
	a, err := newApp(ctx, s, log)
	if err != nil {
		return err
	}
	defer a.close()
	if err := a.reload.watch(ctx); err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				a.reload.reload("SIGHUP")
			}
		}
	}()

	var l net.Listener
	if s.listenNetwork == "unix" {
		_ = os.Remove(s.listenAddress) // a socket left by a previous run
	}
	l, err = net.Listen(s.listenNetwork, s.listenAddress)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.Listen, err)
	}
	log.Info("authlimit serving", "version", version, "listen", l.Addr().String(), "store", s.redisDisplay, "rules", len(s.rules), "max_conns", s.maxConns, "open_file_limit", fdLimit)
	if s.PprofListen != "" {
		stopPprof, err := servePprof(s.PprofListen, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}

	return a.serve(ctx, a.listener(l, s), s.ShutdownTimeout)
}

// listener wraps the decision listener l with the settings' limits.
func (a *app) listener(l net.Listener, s *settings) *httpconn.Listener {
	return httpconn.New(l, httpconn.Config{
		MaxHeader: s.MaxHeaderBytes,
		Conns:     a.connCap,
		Timeouts:  serverTimeouts,
		Metrics:   httpconn.Metrics{Accepted: a.conns.accepted, AcceptErrors: a.conns.acceptErrors},
		Log:       a.log,
	})
}

// serverTimeouts bound how long a client holds a connection to the
// decision listener, and the gRPC one's write and idle times. The write
// timeout covers a request held by a shaping rule; the idle one is longer
// than the proxies' upstream keep-alive, so that authlimit never closes a
// connection a proxy is about to reuse.
var serverTimeouts = httpconn.Timeouts{Read: 10 * time.Second, Write: 10*time.Second + algo.MaxDelay, Idle: 2 * time.Minute}

// connMetrics count what the decision and gRPC listeners do with
// connections.
type connMetrics struct {
	accepted     prometheus.Counter // accepted and served by the decision listener
	grpcAccepted prometheus.Counter // accepted and served by the gRPC listener
	rejected     prometheus.Counter // closed at once: the cap was reached (counted by the cap, on either listener)
	acceptErrors prometheus.Counter // failed accepts, each followed by a wait
}

// app is a configured authlimit: the engine, the fronts, their servers and
// the stores.
type app struct {
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
	// connCap is AUTHLIMIT_MAX_CONNS over the decision listener and the
	// gRPC listener together.
	connCap *conncap.Cap
	// budget is AUTHLIMIT_MAX_BUFFERED_BYTES over every port's
	// unfinished requests.
	budget *membudget.Budget
	// stopping is closed when shutdown begins: it ends the holds of shaped
	// requests (see hold).
	stopping chan struct{}
	// union gives the guard the policies of the rules and of
	// AUTHLIMIT_RLS_CONFIG together.
	union *policyUnion
	// rls answers ShouldRateLimit and POST /json; nil without
	// AUTHLIMIT_RLS_CONFIG. grpc serves gRPC; nil without
	// AUTHLIMIT_GRPC_LISTEN.
	rls  *rlsSwitch
	grpc *grpcFront
	// rlsMetrics count the rate-limit service's answers, for every
	// service a reload builds (see newRLS).
	rlsMetrics *rls.Metrics
	// rlsMetadata is AUTHLIMIT_RLS_RESPONSE_METADATA.
	rlsMetadata bool
	// admin serves the admin API; nil without AUTHLIMIT_ADMIN_LISTEN.
	admin *adminFront
	// spoa is the HAProxy SPOE agent; nil without AUTHLIMIT_SPOA_LISTEN.
	spoa *spoaFront
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

// serve answers on l until ctx ends, then shuts down: it stops accepting,
// closes at once every connection that has no request on it, and waits up
// to timeout for the requests in flight, whose answers say
// "Connection: close".
func (a *app) serve(ctx context.Context, l *httpconn.Listener, timeout time.Duration) error {
	served := make(chan error, 1)
	go func() { served <- a.server.Serve(l) }()
	grpcServed := a.serveGRPC()
	adminServed := a.serveAdmin()
	spoaServed := a.serveSPOA()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case err := <-grpcServed:
		return grpcServeError(err)
	case err := <-adminServed:
		return fmt.Errorf("serve the admin api: %w", err)
	case err := <-spoaServed:
		return err
	case <-ctx.Done():
	}
	a.log.Info("shutting down", "timeout", timeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// Shaped requests are admitted now (see hold), their answers saying
	// Connection: close (see serveHTTP).
	close(a.stopping)
	// fasthttp closes the connections idle between two requests itself,
	// but counts a new one as busy from its accept: one that never sends
	// a byte would hold the shutdown until its read timeout.
	l.CloseSilent()
	grpcStopped := a.stopGRPC(sctx)
	spoaStopped := a.stopSPOA(sctx)
	a.stopAdmin(sctx)
	err := a.server.ShutdownWithContext(sctx)
	<-grpcStopped
	<-spoaStopped
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// newApp builds the stores, the guard, the engine, the handler and the
// server from settings, and gets a Redis store ready: scripts loaded,
// connections open.
// A Redis that does not answer leaves authlimit deciding with the fail mode
// until it does; one that refuses authlimit's credentials or certificate
// is a configuration mistake.
func newApp(ctx context.Context, s *settings, log *slog.Logger) (*app, error) {
	a := &app{log: log, stopping: make(chan struct{})}
	// go-redis logs through a process-wide logger; send it to ours.
	goredis.SetLogger(redisLogger{log})
	if s.defaultRules {
		log.Warn("AUTHLIMIT_RULES is not set: using the default rule", "rule", rules.Default)
	}
	for _, w := range s.warnings {
		log.Warn("configuration warning", "detail", w)
	}
	if s.redisOptions == nil {
		log.Warn("AUTHLIMIT_REDIS_URL is not set: limits are kept in this instance's memory; replicas do not share them")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// A proxy that keeps its connections to authlimit alive opens a few and
	// reuses them: a count that grows with the requests means it does not
	// (nginx auth_request without proxy_method HEAD, on every denial).
	a.conns = connMetrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "authlimit_connections_accepted_total",
			Help: "Connections the decision listener accepted. Behind a proxy that keeps connections alive it grows far slower than authlimit_requests_total.",
		}),
		grpcAccepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "authlimit_grpc_connections_accepted_total",
			Help: "Connections the gRPC listener (AUTHLIMIT_GRPC_LISTEN) accepted. Envoy keeps a few per worker thread alive: a count that grows with the calls means something in between does not.",
		}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "authlimit_connections_rejected_total",
			Help: "Connections closed at once because AUTHLIMIT_MAX_CONNS connections were open, on the decision and the gRPC listener together.",
		}),
		acceptErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "authlimit_accept_errors_total",
			Help: "Failed accepts (such as no file descriptor free), each followed by a wait of 5 ms to 1 s before accepting again.",
		}),
	}
	reg.MustRegister(a.conns.accepted, a.conns.grpcAccepted, a.conns.rejected, a.conns.acceptErrors)
	a.connCap = conncap.New(s.maxConns, a.conns.rejected.Inc)
	stopReleaser := make(chan struct{})
	a.closers = append(a.closers, func() error { close(stopReleaser); return nil })
	a.budget = newBudget(s, reg, func() int64 { return int64(a.connCap.Open()) }, stopReleaser)
	var policies []*algo.Policy
	for _, r := range s.rules {
		policies = append(policies, r.Policies()...)
	}
	policies = append(policies, s.rlsPolicies()...)
	gopts := guard.Options{
		FailMode:          s.failMode,
		Policies:          policies,
		LocalDivisor:      s.LocalDivisor,
		BreakerFailures:   s.BreakerFailures,
		BreakerBackoff:    s.BreakerBackoff,
		BreakerMaxBackoff: s.BreakerMaxBackoff,
		ProbeTimeout:      max(s.RedisTimeout, time.Second),
		DenyCacheSize:     s.DenyCacheSize,
		Registry:          reg,
		Logger:            log,
	}
	var client goredis.UniversalClient
	if s.redisOptions == nil {
		m := algo.NewMemory(algo.MemoryOptions{MaxKeys: s.MemoryMaxKeys})
		a.closers = append(a.closers, m.Close)
		registerMemory(reg, m, "primary")
		gopts.Store = m
	} else {
		if s.redisPlain != nil {
			client = goredis.NewClient(s.redisPlain)
		} else {
			client = goredis.NewUniversalClient(s.redisOptions)
		}
		a.closers = append(a.closers, client.Close)
		lost := prometheus.NewCounter(prometheus.CounterOpts{
			Name: "authlimit_refunds_lost_total",
			Help: "Rules of Redis Cluster requests denied by one slot whose consumption in another slot could not be refunded, or whose refund was sent but not answered (it may have run).",
		})
		reg.MustRegister(lost)
		rs := redis.New(client, redis.Options{
			Prefix:  s.KeyPrefix,
			Timeout: s.RedisTimeout,
			Conns:   s.RedisPoolSize,
			OnRefundLost: func(n int, err error) {
				lost.Add(float64(n))
				log.Warn("refund lost: a denied request still counts in some rules", "rules", n, "err", redact(fmt.Sprint(err), s.RedisURL))
			},
		})
		a.closers = append(a.closers, rs.Close)
		gopts.Store, gopts.Remote = rs, true
		if s.failMode == guard.FailLocal {
			m := algo.NewMemory(algo.MemoryOptions{MaxKeys: s.MemoryMaxKeys})
			a.closers = append(a.closers, m.Close)
			registerMemory(reg, m, "local")
			gopts.Local = m
		}
	}
	g, err := guard.New(gopts)
	if err != nil {
		a.close()
		return nil, err
	}
	a.guard = g
	a.closers = append(a.closers, func() error { g.Close(); return nil })
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = g.Start(sctx)
	if rs, ok := gopts.Store.(*redis.Store); ok && err == nil {
		if missing, _ := rs.RefusedCommands(sctx); len(missing) > 0 {
			log.Warn("the redis user may not run "+strings.Join(missing, " or ")+": decisions stay exact, but decide.lua falls back to slower commands (SET ... KEEPTTL for SETRANGE, a GET per key for MGET, in a Redis Cluster a call per slot for EXISTS), which cost Redis more and add entries to ACL LOG; grant them (docs/security.md: Least-privilege Redis user)", "redis", s.redisDisplay)
		}
	}
	cancel()
	if err != nil {
		msg := redact(err.Error(), s.RedisURL)
		if refused(err) {
			a.close()
			return nil, usageError{fmt.Errorf("redis refuses authlimit (%s): %s", s.redisDisplay, msg)}
		}
		if strings.HasPrefix(s.RedisURL, "redis://") && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			msg += " (a server that expects TLS closes plain connections: is the URL rediss://?)"
		}
		log.Warn("redis not ready at start; deciding with the fail mode until it answers", "err", msg, "fail_mode", s.failMode.String())
	}
	a.union = &policyUnion{Guard: g, rls: s.rlsPolicies()}
	for _, r := range s.rules {
		a.union.rules = append(a.union.rules, r.Policy)
	}
	a.denials, err = newDenials(s, reg, log, client)
	if err != nil {
		a.close()
		return nil, err
	}
	a.runDenials()
	e, err := decide.New(decide.Options{
		Observer:   a.denials,
		Rules:      s.rules,
		Decider:    a.union,
		AllowCIDRs: s.allow,
		BlockCIDRs: s.block,
		IPv4Prefix: s.IPv4Prefix,
		IPv6Prefix: s.IPv6Prefix,
		DenyStatus: s.DenyStatus,
		Shadow:     s.Shadow,
		Registry:   reg,
		Logger:     log,
	})
	if err != nil {
		a.close()
		return nil, err
	}
	a.engine = e
	h, err := handler.New(handler.Options{
		Engine:       e,
		Ready:        g,
		Proxies:      rules.Proxies{Trusted: s.trusted},
		MethodHeader: s.MethodHeader,
		URIHeader:    s.URIHeader,
		HostHeader:   s.HostHeader,
		URLHeader:    s.URLHeader,
		Registry:     reg,
		Logger:       log,
		Sleep:        a.hold,
	})
	if err != nil {
		a.close()
		return nil, err
	}
	a.handler = h
	if err := a.newFronts(s, reg); err != nil {
		a.close()
		return nil, err
	}
	if err := a.newSPOA(s, reg); err != nil {
		a.close()
		return nil, err
	}
	var rr *rlsReloader
	if a.rls != nil {
		if rr, err = a.newRLSReloader(s, reg); err != nil {
			a.close()
			return nil, err
		}
	}
	if a.reload, err = newReloader(s, e, rr, reg, log, time.Now); err != nil {
		a.close()
		return nil, err
	}
	if err := a.newAdmin(s); err != nil {
		a.close()
		return nil, err
	}
	a.server = &fasthttp.Server{
		Handler:               a.httpRoutes(a.serveHTTP),
		Name:                  "authlimit",
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		// The read buffer bounds the header block, so it is
		// AUTHLIMIT_MAX_HEADER_BYTES. ReduceMemoryUsage takes buffers
		// from a pool when a request's first byte comes and gives them
		// back once it is answered: a waiting connection holds none.
		// With a 32 KiB read buffer each held about 41 KB before.
		ReadBufferSize:    s.MaxHeaderBytes,
		ReduceMemoryUsage: true,
		// A connection's serving goroutine waits this long for another
		// connection before it ends and frees its stack (default 10s).
		MaxIdleWorkerDuration: 2 * time.Second,
		MaxRequestBodySize:    64 << 10,
		// No ReadTimeout, WriteTimeout or IdleTimeout: the listener's
		// conns keep serverTimeouts.
		CloseOnShutdown: true,
		ErrorHandler:    errorHandler,
		Logger:          fasthttpLogger{log},
	}
	return a, nil
}

// serveHTTP serves a request with the handler; once shutdown has begun,
// the answer closes its connection.
func (a *app) serveHTTP(ctx *fasthttp.RequestCtx) {
	a.handler.Serve(ctx)
	select {
	case <-a.stopping:
		ctx.SetConnectionClose()
	default:
	}
}

// registerMemory exports how full a memory store is and what its bound
// gives up; store is primary (the embedded store) or local (the fallback).
func registerMemory(reg prometheus.Registerer, m *algo.Memory, store string) {
	labels := prometheus.Labels{"store": store}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "authlimit_memory_keys",
			Help:        "States the in-memory store holds; at most AUTHLIMIT_MEMORY_MAX_KEYS.",
			ConstLabels: labels,
		}, func() float64 { return float64(m.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "authlimit_memory_refused_total",
			Help:        "Requests denied because the in-memory store was full and no state in it was back to full quota: their new key could not be kept.",
			ConstLabels: labels,
		}, func() float64 { return float64(m.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "authlimit_memory_evicted_total",
			Help:        "States back to full quota that a full in-memory store removed to keep a new key.",
			ConstLabels: labels,
		}, func() float64 { return float64(m.Evicted()) }),
	)
}

// refused reports whether Redis answered, but refused authlimit: wrong
// credentials, missing permissions, or a certificate authlimit does not
// trust. Waiting does not cure these.
func refused(err error) bool {
	var cert *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	if errors.As(err, &cert) || errors.As(err, &unknown) || errors.As(err, &hostname) {
		return true
	}
	msg := err.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "can't access", "invalid password", "invalid username-password", "tls: "} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func (a *app) close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		_ = a.closers[i]()
	}
}

// errorHandler answers requests fasthttp could not read: headers larger
// than AUTHLIMIT_MAX_HEADER_BYTES get 431, a body over 64 KiB 413, a
// request that stalls 408, anything else malformed (bare line feeds
// included, see httpconn) 400.
func errorHandler(ctx *fasthttp.RequestCtx, err error) {
	var status int
	var sizeErr *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &sizeErr):
		status = fasthttp.StatusRequestHeaderFieldsTooLarge
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status = fasthttp.StatusRequestEntityTooLarge
	case httpconn.IsTimeout(err):
		status = fasthttp.StatusRequestTimeout
	default:
		status = fasthttp.StatusBadRequest
	}
	ctx.Error(fasthttp.StatusMessage(status)+"\n", status)
}

// healthcheck asks the local authlimit's /healthz, over the address it
// listens on, with the loopback address for an unspecified host.
func healthcheck(s *settings) error {
	network, addr := s.listenNetwork, s.listenAddress
	if network == "tcp" {
		host, port, _ := net.SplitHostPort(addr)
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		addr = net.JoinHostPort(host, port)
	}
	c := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return net.DialTimeout(network, addr, 2*time.Second) }}
	status, body, err := c.GetTimeout(nil, "http://authlimit/healthz", 2*time.Second)
	if err != nil {
		return fmt.Errorf("healthcheck %s: %w", addr, err)
	}
	if status != fasthttp.StatusOK {
		return fmt.Errorf("healthcheck %s: %d %s", addr, status, body)
	}
	return nil
}

// fasthttpLogger sends fasthttp's own messages to slog at debug level: they
// are about single connections (a client that went away, say).
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}

// redisLogger sends go-redis's messages (reconnects, failovers) to slog at
// debug level: the circuit breaker and metrics report store trouble.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, args ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, args...), "component", "go-redis")
}

func newLogger(s *settings, w io.Writer) *slog.Logger {
	o := &slog.HandlerOptions{Level: s.logLevel}
	if s.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, o))
	}
	return slog.New(slog.NewJSONHandler(w, o))
}

// envMap turns KEY=value pairs into a map.
func envMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}
