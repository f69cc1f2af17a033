package grpcwire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const echoPath = "/test.Echo/Echo"

// echo answers its request, or, for a few commands, something else.
type echo struct {
	started chan string   // gets "hold" when a held call starts
	ended   chan error    // gets a held call's context error
	release chan struct{} // ends the held calls
}

func (e *echo) Echo(ctx context.Context, r *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	switch string(r.GetValue()) {
	case "hold":
		e.started <- "hold"
		select {
		case <-ctx.Done():
			e.ended <- ctx.Err()
			return nil, ctx.Err()
		case <-e.release:
			return &wrapperspb.BytesValue{Value: []byte("released")}, nil
		}
	case "status":
		st, _ := status.New(codes.PermissionDenied, "denied: 100% ünicode\n").WithDetails(&errdetails.ErrorInfo{Reason: "TEST"})
		return nil, st.Err()
	case "plain":
		return nil, errors.New("plain failure")
	case "panic":
		panic("handler bug")
	case "deadline":
		<-ctx.Done()
		return &wrapperspb.BytesValue{}, nil
	}
	return r, nil
}

// testServer serves echo and health on loopback with opts.
func testServer(t *testing.T, opts Options) (*Server, *echo, *Health, string) {
	t.Helper()
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	s := NewServer(opts)
	e := &echo{started: make(chan string, 100), ended: make(chan error, 100), release: make(chan struct{})}
	if err := Unary(s, echoPath, e.Echo); err != nil {
		t.Fatal(err)
	}
	h := NewHealth()
	if err := h.Register(s); err != nil {
		t.Fatal(err)
	}
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus("test.Echo", healthpb.HealthCheckResponse_SERVING)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-served; !errors.Is(err, ErrServerStopped) {
			t.Errorf("Serve = %v, want ErrServerStopped", err)
		}
	})
	return s, e, h, l.Addr().String()
}

// tWriter logs to the test.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func call(ctx context.Context, c *grpc.ClientConn, v []byte, opts ...grpc.CallOption) ([]byte, error) {
	resp := &wrapperspb.BytesValue{}
	err := c.Invoke(ctx, echoPath, &wrapperspb.BytesValue{Value: v}, resp, opts...)
	return resp.GetValue(), err
}

func TestGRPCGoClient(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	c := dial(t, addr, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Sizes around the limit: a BytesValue of n bytes is n+1+varint(n).
	for _, tc := range []struct {
		name string
		size int
		code codes.Code
	}{
		{"empty", 0, codes.OK},
		{"small", 100, codes.OK},
		{"one frame", 16384 - 5 - 3, codes.OK},
		{"two frames", 16384, codes.OK},
		{"past the stream window", 70000, codes.OK},
		{"past the connection window", 2 << 20, codes.OK},
		{"at the limit", DefaultMaxRecvMsgSize - 5, codes.OK},
		{"over the limit", DefaultMaxRecvMsgSize, codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := []byte(strings.Repeat("x", tc.size))
			got, err := call(ctx, c, v)
			if status.Code(err) != tc.code {
				t.Fatalf("Echo(%d bytes) = %v, want %v", tc.size, err, tc.code)
			}
			if tc.code == codes.OK && string(got) != string(v) {
				t.Fatalf("Echo(%d bytes) answered %d bytes", tc.size, len(got))
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		_, err := call(ctx, c, []byte("status"))
		st := status.Convert(err)
		if st.Code() != codes.PermissionDenied || st.Message() != "denied: 100% ünicode\n" || len(st.Details()) != 1 {
			t.Errorf("status error: %v (details %v), want PermissionDenied with its message and one detail", err, st.Details())
		} else if d, ok := st.Details()[0].(*errdetails.ErrorInfo); !ok || d.GetReason() != "TEST" {
			t.Errorf("detail %v, want ErrorInfo TEST", st.Details()[0])
		}
		if _, err := call(ctx, c, []byte("plain")); status.Code(err) != codes.Unknown || status.Convert(err).Message() != "plain failure" {
			t.Errorf("plain error: %v, want Unknown plain failure", err)
		}
		if _, err := call(ctx, c, []byte("panic")); status.Code(err) != codes.Internal {
			t.Errorf("panic: %v, want Internal", err)
		}
		for path, want := range map[string]string{
			"/test.Echo/Nope": "unknown method Nope for service test.Echo",
			"/test.Nope/Echo": "unknown service test.Nope",
		} {
			err := c.Invoke(ctx, path, &wrapperspb.BytesValue{}, &wrapperspb.BytesValue{})
			if status.Code(err) != codes.Unimplemented || status.Convert(err).Message() != want {
				t.Errorf("%s: %v, want Unimplemented %q", path, err, want)
			}
		}
	})
	t.Run("deadline", func(t *testing.T) {
		dctx, dcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer dcancel()
		if _, err := call(dctx, c, []byte("deadline")); status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("deadline: %v, want DeadlineExceeded", err)
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v := fmt.Appendf(nil, "call %d %s", i, strings.Repeat("y", i*100))
				got, err := call(ctx, c, v)
				if err == nil && string(got) != string(v) {
					err = fmt.Errorf("call %d answered another's message", i)
				}
				if err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func TestCancelAndHold(t *testing.T) {
	_, e, _, addr := testServer(t, Options{})
	c := dial(t, addr)
	// A held call does not hold the others, and cancelling it cancels its
	// handler's context.
	hctx, hcancel := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() { _, err := call(hctx, c, []byte("hold")); held <- err }()
	<-e.started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := call(ctx, c, []byte("beside")); err != nil || string(got) != "beside" {
		t.Fatalf("a call beside a held one: %q %v", got, err)
	}
	hcancel()
	if err := <-held; status.Code(err) != codes.Canceled {
		t.Errorf("cancelled call: %v, want Canceled", err)
	}
	select {
	case err := <-e.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("handler's context: %v, want Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
}

func TestHealth(t *testing.T) {
	s, _, h, addr := testServer(t, Options{})
	c := dial(t, addr)
	hc := healthpb.NewHealthClient(c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		service string
		want    healthpb.HealthCheckResponse_ServingStatus
		code    codes.Code
	}{
		{"", healthpb.HealthCheckResponse_SERVING, codes.OK},
		{"test.Echo", healthpb.HealthCheckResponse_SERVING, codes.OK},
		{"nope", 0, codes.NotFound},
	} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: tc.service})
		if status.Code(err) != tc.code || r.GetStatus() != tc.want {
			t.Errorf("Check(%q) = %v, %v; want %v, %v", tc.service, r, err, tc.want, tc.code)
		}
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: ""})
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "later"})
	if err != nil {
		t.Fatal(err)
	}
	next := func(w healthpb.Health_WatchClient, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		r, err := w.Recv()
		if err != nil || r.GetStatus() != want {
			t.Fatalf("Watch: %v, %v; want %v", r, err, want)
		}
	}
	next(w, healthpb.HealthCheckResponse_SERVING)
	next(unknown, healthpb.HealthCheckResponse_SERVICE_UNKNOWN)
	h.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	next(w, healthpb.HealthCheckResponse_NOT_SERVING)
	h.SetServingStatus("later", healthpb.HealthCheckResponse_SERVING)
	next(unknown, healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	next(w, healthpb.HealthCheckResponse_SERVING)
	// Shutdown: NOT_SERVING, then the stream ends as the server stops.
	h.Shutdown()
	next(w, healthpb.HealthCheckResponse_NOT_SERVING)
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	if r, err := w.Recv(); err == nil {
		t.Errorf("Watch after GracefulStop: %v, want the stream's end", r)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop did not return with a Watch open")
	}
}

// TestGRPCGoClientStreamLimit: grpc-go's client keeps to the advertised
// MAX_CONCURRENT_STREAMS; calls beyond it wait for a place and succeed.
func TestGRPCGoClientStreamLimit(t *testing.T) {
	_, _, _, addr := testServer(t, Options{MaxConcurrentStreams: 3})
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 60)
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := fmt.Appendf(nil, "call %d", i)
			if got, err := call(ctx, c, v); err != nil || string(got) != string(v) {
				errs <- fmt.Errorf("call %d: %q, %v", i, got, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
