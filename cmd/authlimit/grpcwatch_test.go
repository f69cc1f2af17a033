package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/valyala/fasthttp/fasthttputil"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestGRPCHealthWatchAtShutdown: a health Watch sees SERVING, then
// NOT_SERVING once shutdown begins, then its stream ends, and the
// shutdown does not wait for it.
func TestGRPCHealthWatchAtShutdown(t *testing.T) {
	s, err := loadConfig(map[string]string{"AUTHLIMIT_GRPC_LISTEN": "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := newApp(context.Background(), s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("newApp: %v", err)
	}
	defer a.close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- a.serve(ctx, a.listener(fasthttputil.NewInmemoryListener(), s), 20*time.Second)
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer wcancel()
	w, err := healthpb.NewHealthClient(grpcClient(t, a.grpc.listener.Addr().String())).Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch: %v, %v; want SERVING", r, err)
	}
	start := time.Now()
	cancel()
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch at shutdown: %v, %v; want NOT_SERVING", r, err)
	}
	if r, err := w.Recv(); err == nil {
		t.Fatalf("Watch after shutdown: %v, want the stream's end", r)
	}
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("shutdown took %v with a Watch open, want it not to wait for the timeout", d)
	}
}
