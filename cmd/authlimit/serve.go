package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/internal/httpconn"
)

// listener wraps the decision listener l with the settings' limits.
func (a *app) listener(l net.Listener, s *settings) *httpconn.Listener {
	return httpconn.New(l, httpconn.Config{
		MaxHeader: s.MaxHeaderBytes,
		Conns:     a.connCap,
		Budget:    a.budget,
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

// streamWriteTimeout bounds the writes of the gRPC port and the SPOE
// agent, and how long their answers may wait unread. They hold a shaped
// request before its answer is written, not while writing it, so unlike
// the decision listener's it leaves no room for a shaping delay: a client
// that does not read is cut off 10 s after its answers stopped moving.
const streamWriteTimeout = 10 * time.Second

// connMetrics count what the decision and gRPC listeners do with
// connections.
type connMetrics struct {
	accepted     prometheus.Counter // accepted and served by the decision listener
	grpcAccepted prometheus.Counter // accepted and served by the gRPC listener
	rejected     prometheus.Counter // closed at once: the cap was reached (counted by the cap, on either listener)
	acceptErrors prometheus.Counter // failed accepts, each followed by a wait
}

// newConnMetrics registers the listeners' connection counts. A proxy that
// keeps its connections to authlimit alive opens a few and reuses them: a
// count that grows with the requests means it does not (nginx auth_request
// without proxy_method HEAD, on every denial).
func newConnMetrics(reg prometheus.Registerer) connMetrics {
	m := connMetrics{
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
	reg.MustRegister(m.accepted, m.grpcAccepted, m.rejected, m.acceptErrors)
	return m
}

// newServer is the HTTP server of the decision listener: the handler's
// routes and POST /json.
func (a *app) newServer(s *settings) *fasthttp.Server {
	return &fasthttp.Server{
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
		Logger:          fasthttpLogger{a.log},
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

// serveHTTP serves a request with the handler; once shutdown has begun,
// the answer closes its connection. The request, read whole, holds
// nothing in the memory budget meanwhile.
func (a *app) serveHTTP(ctx *fasthttp.RequestCtx) {
	httpconn.Whole(ctx.Conn())
	a.handler.Serve(ctx)
	select {
	case <-a.stopping:
		ctx.SetConnectionClose()
	default:
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

// fasthttpLogger sends fasthttp's own messages to slog at debug level: they
// are about single connections (a client that went away, say).
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}
