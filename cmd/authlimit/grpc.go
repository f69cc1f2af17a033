package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/authlimit/authlimit/front/grpcwire"
	"github.com/authlimit/authlimit/front/rls"
	"github.com/authlimit/authlimit/internal/conncap"
	"github.com/authlimit/authlimit/internal/httpconn"
	"github.com/authlimit/authlimit/internal/membudget"
)

// grpcSettings reads AUTHLIMIT_GRPC_LISTEN and AUTHLIMIT_RLS_CONFIG: the
// gRPC address, and the envoyproxy/ratelimit configuration that
// ShouldRateLimit and POST /json answer from. Every mistake in the
// configuration is reported, each naming its file, domain, descriptor and
// field.
func grpcSettings(s *settings, _ map[string]string, p *problems) {
	c, problem := &s.config, p.add
	if c.GRPCListen != "" {
		if err := checkHostPort(c.GRPCListen); err != nil {
			problem("GRPC_LISTEN", fmt.Errorf("%q is not host:port (such as :8081 or 127.0.0.1:8081): %w", c.GRPCListen, err))
		}
	}
	if c.RLSConfig == "" {
		return
	}
	if c.GRPCListen == "" {
		s.warnings = append(s.warnings, envPrefix+"RLS_CONFIG is set, AUTHLIMIT_GRPC_LISTEN is not: Envoy's ShouldRateLimit (gRPC) is not served; only POST /json answers from the configuration")
	}
	cfg, hash, err := loadRLSStable(c.RLSConfig)
	if err != nil {
		for _, e := range unjoin(err) {
			problem("RLS_CONFIG", e)
		}
		return
	}
	s.rls, s.rlsHash = cfg, hash
}

// describeRLS adds the gRPC settings to -check's output.
func (s *settings) describeRLS(w func(k, v string)) {
	if s.GRPCListen == "" {
		w("grpc", "off (AUTHLIMIT_GRPC_LISTEN unset)")
	} else {
		w("grpc", s.GRPCListen+" (health"+map[bool]string{true: ", ShouldRateLimit", false: ""}[s.rls != nil]+")")
	}
	if s.rls == nil {
		return
	}
	w("rls config", fmt.Sprintf("%s: %d domains (%s), %d limits (reloaded when it changes or on SIGHUP; hash %s)", s.RLSConfig, len(s.rls.Domains()), strings.Join(s.rls.Domains(), ", "), len(s.rls.Limits()), s.rlsHash))
	w("rls metadata", fmt.Sprint(s.RLSResponseMetadata))
}

// grpcFront is the gRPC server: the rate-limit service, the health service
// and whatever else registerServices puts on it.
type grpcFront struct {
	server   *grpcwire.Server
	health   *grpcwire.Health
	listener net.Listener
	// stopWatch ends watchReadiness; watched is closed when it has.
	stopWatch, watched chan struct{}
	watching           bool
	stopOnce           sync.Once
}

// stopWatching ends watchReadiness, if it runs, and waits for it.
func (f *grpcFront) stopWatching() {
	f.stopOnce.Do(func() {
		close(f.stopWatch)
		if f.watching {
			<-f.watched
		}
	})
}

// readinessInterval is how often the gRPC health service asks the guard
// whether decisions come from the store.
const readinessInterval = time.Second

// newFronts builds what answers besides /auth: the rate-limit service (when
// AUTHLIMIT_RLS_CONFIG is set), for POST /json and ShouldRateLimit, and the
// gRPC server (when AUTHLIMIT_GRPC_LISTEN is set), listening at once so
// that a port in use stops authlimit at start.
func (a *app) newFronts(s *settings) error {
	if s.rls != nil {
		svc, err := rls.New(rls.Options{Rules: a.sets, Engine: a.engine, Registry: a.reg, ResponseMetadata: s.RLSResponseMetadata})
		if err != nil {
			return err
		}
		a.rls = svc
	}
	if s.GRPCListen == "" {
		return nil
	}
	l, err := net.Listen("tcp", s.GRPCListen)
	if err != nil {
		return fmt.Errorf("listen on AUTHLIMIT_GRPC_LISTEN %s: %w", s.GRPCListen, err)
	}
	var tlsCfg *tls.Config
	if s.grpcTLS != nil {
		g := newGRPCTLS(tlsFiles{s.GRPCTLSCert, s.GRPCTLSKey, s.GRPCTLSClientCA}, s.grpcTLS, a.reg, a.log)
		stop := make(chan struct{})
		go g.poll(stop, tlsPollInterval)
		a.closers = append(a.closers, func() error { close(stop); return nil })
		tlsCfg = g.config()
	}
	f := &grpcFront{server: newGRPCServer(s, tlsCfg, a.connCap, a.budget, a.conns.grpcAccepted, newRefusedPeers(a.reg, a.log), a.log), health: grpcwire.NewHealth(), listener: l,
		stopWatch: make(chan struct{}), watched: make(chan struct{})}
	if err := a.registerServices(f.server, f.health, s); err != nil {
		_ = l.Close()
		return err
	}
	a.grpc = f
	// Stop closes only the listeners Serve was given: close this one too,
	// should authlimit stop before serving.
	a.closers = append(a.closers, func() error { f.stopWatching(); f.server.Stop(); _ = l.Close(); return nil })
	return nil
}

// newGRPCServer is authlimit's gRPC server: h2c, or TLS with tlsCfg if
// set (AUTHLIMIT_GRPC_TLS_*, see grpcTLS), the peers it serves,
// the connection cap and the memory budget it shares with the decision
// listener, the count of its connections, and its timeouts (a Check held
// by a shaping rule is answered within the write timeout; a request
// arrives whole within the read timeout, as an HTTP request's headers
// must).
func newGRPCServer(s *settings, tlsCfg *tls.Config, conns *conncap.Cap, budget *membudget.Budget, accepted prometheus.Counter, refused *refusedPeers, log *slog.Logger) *grpcwire.Server {
	return grpcwire.NewServer(grpcwire.Options{
		TLS:            tlsCfg,
		Peers:          s.grpcPeers,
		Refused:        refused.refused,
		Conns:          conns,
		Budget:         budget,
		Accepted:       accepted.Inc,
		IdleTimeout:    serverTimeouts.Idle,
		WriteTimeout:   streamWriteTimeout,
		RequestTimeout: serverTimeouts.Read,
		Log:            log,
	})
}

// watchReadiness keeps the health service's overall status ("") in step
// with /readyz: NOT_SERVING while the guard could answer nothing but
// Unavailable (fail mode closed, every circuit open), SERVING otherwise.
func (a *app) watchReadiness(f *grpcFront, ready func() (bool, string)) {
	defer close(f.watched)
	t := time.NewTicker(readinessInterval)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_SERVING
		if ok, _ := ready(); !ok {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		f.health.SetServingStatus("", st)
		select {
		case <-f.stopWatch:
			return
		case <-t.C:
		}
	}
}

// registerServices is the one place where services are put on the gRPC
// server: every service registers here (a registration that fails stops
// authlimit at start), and the health service reports each as serving.
func (a *app) registerServices(g *grpcwire.Server, h *grpcwire.Health, s *settings) error {
	if err := h.Register(g); err != nil {
		return err
	}
	if a.rls != nil {
		if err := a.rls.Register(g); err != nil {
			return err
		}
	}
	if err := registerExtAuthz(g, a, s); err != nil {
		return err
	}
	// Register further services above: each one registered is reported
	// serving here.
	for _, name := range g.Services() {
		h.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	return nil
}

// httpRoutes adds POST /json, envoyproxy/ratelimit's HTTP form of
// ShouldRateLimit, in front of the handler's routes when the rate-limit
// service is configured.
func (a *app) httpRoutes(next fasthttp.RequestHandler) fasthttp.RequestHandler {
	if a.rls == nil {
		return next
	}
	return func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/json" {
			httpconn.Whole(ctx.Conn())
			a.rls.ServeJSON(ctx)
			return
		}
		next(ctx)
	}
}

// serveGRPC serves gRPC in the background; the channel gets Serve's
// error. Without a gRPC server it is nil, and never ready.
func (a *app) serveGRPC() <-chan error {
	if a.grpc == nil {
		return nil
	}
	a.log.Info("grpc serving", "listen", a.grpc.listener.Addr().String(), "rate_limit_service", a.rls != nil)
	a.grpc.watching = true
	go a.watchReadiness(a.grpc, a.guard.Ready)
	served := make(chan error, 1)
	go func() { served <- a.grpc.server.Serve(a.grpc.listener) }()
	return served
}

// stopGRPC stops the gRPC server gracefully: health says NOT_SERVING, no
// new call is taken, and the calls in flight finish until ctx ends, when
// the rest are cut. The channel closes once the server has stopped.
func (a *app) stopGRPC(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	if a.grpc == nil {
		close(done)
		return done
	}
	a.grpc.stopWatching() // so that Shutdown's NOT_SERVING is the last word
	a.grpc.health.Shutdown()
	graceful := make(chan struct{})
	go func() { a.grpc.server.GracefulStop(); close(graceful) }()
	go func() {
		defer close(done)
		select {
		case <-graceful:
		case <-ctx.Done():
			a.grpc.server.Stop()
			<-graceful
		}
	}()
	return done
}

// grpcServeError wraps an error of the gRPC server's Serve; a server
// stopped on purpose is none.
func grpcServeError(err error) error {
	if err == nil || errors.Is(err, grpcwire.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("serve grpc: %w", err)
}
