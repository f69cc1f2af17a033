package grpcwire

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const keepPath = "/test.Keep/Keep"

// keeper serves keepPath: each call hands its context over and, for
// "hold", waits for it to end; for "detach", it waits for its context to
// end and reports what WithoutCancel of it says then.
type keeper struct {
	ctxs     chan context.Context
	ended    chan error
	detached chan context.Context
}

func (k *keeper) call(ctx context.Context, r *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	k.ctxs <- ctx
	switch string(r.GetValue()) {
	case "hold":
		<-ctx.Done()
		k.ended <- ctx.Err()
		return nil, ctx.Err()
	case "detach":
		d := WithoutCancel(ctx)
		<-ctx.Done()
		k.detached <- d
		return nil, ctx.Err()
	}
	return r, nil
}

func keepServer(t *testing.T) (*keeper, string) {
	t.Helper()
	s := NewServer(Options{})
	k := &keeper{ctxs: make(chan context.Context, 10), ended: make(chan error, 10), detached: make(chan context.Context, 10)}
	if err := Unary(s, keepPath, k.call); err != nil {
		t.Fatal(err)
	}
	return k, serveLoopback(t, s)
}

// serveLoopback serves s on a loopback port until the test ends, and
// returns its address.
func serveLoopback(t testing.TB, s *Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

func (r *raw) keep(id uint32, v string, extra ...string) {
	r.t.Helper()
	r.headers(id, false, grpcHeaders(keepPath, extra...)...)
	r.data(id, message(r.t, &wrapperspb.BytesValue{Value: []byte(v)}), true)
}

// TestCallContext: a unary call's context ends when its client resets the
// stream, Canceled, and a handler watching Done sees it; a context kept
// past its call has ended with the call, and a later call's reset is not
// seen by it; WithoutCancel of a call's context never ends.
func TestCallContext(t *testing.T) {
	k, addr := keepServer(t)
	r := rawDial(t, addr)

	r.keep(1, "quick")
	if a := r.answer(1); a.grpcStatus != "0" {
		t.Fatalf("quick call: %+v", a)
	}
	kept := <-k.ctxs
	select {
	case <-kept.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a finished call's context did not end")
	}
	if err := kept.Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("finished call's context: %v, want Canceled", err)
	}
	if _, ok := kept.Deadline(); ok {
		t.Error("a call without grpc-timeout has a deadline")
	}

	r.keep(3, "hold")
	held := <-k.ctxs
	if held == kept {
		t.Fatal("two calls share a context")
	}
	if err := held.Err(); err != nil {
		t.Fatalf("held call's context ended early: %v", err)
	}
	if err := r.fr.WriteRSTStream(3, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	if err := <-k.ended; !errors.Is(err, context.Canceled) {
		t.Errorf("reset call's context: %v, want Canceled", err)
	}

	r.keep(5, "detach")
	<-k.ctxs
	if err := r.fr.WriteRSTStream(5, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	d := <-k.detached
	if d.Done() != nil || d.Err() != nil {
		t.Errorf("WithoutCancel of a reset call's context: Done %v, Err %v; want nil, nil", d.Done(), d.Err())
	}
	if _, ok := d.Deadline(); ok {
		t.Error("WithoutCancel of a call's context has a deadline")
	}
}

// TestCallContextDeadline: a call's grpc-timeout is its context's
// deadline, which ends it, DeadlineExceeded, whether the handler waits on
// Done or only asks Err.
func TestCallContextDeadline(t *testing.T) {
	k, addr := keepServer(t)
	r := rawDial(t, addr)
	start := time.Now()
	r.keep(1, "hold", "grpc-timeout", "50m")
	ctx := <-k.ctxs
	dl, ok := ctx.Deadline()
	if !ok || dl.Before(start.Add(50*time.Millisecond)) || dl.After(time.Now().Add(50*time.Millisecond)) {
		t.Errorf("deadline %v (%v, call sent at %v), want 50ms after the call", dl, ok, start)
	}
	if err := <-k.ended; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("held call's context: %v, want DeadlineExceeded", err)
	}
	if a := r.answer(1); a.grpcStatus != code(4) {
		t.Errorf("held call past its deadline: %+v, want DEADLINE_EXCEEDED", a)
	}

	// A deadline passed before Done is asked: Done is closed at once.
	x := &callCtx{c: &conn{}, deadline: time.Now().Add(-time.Second)}
	select {
	case <-x.Done():
	default:
		t.Error("Done of a context past its deadline is open")
	}
	if !errors.Is(x.Err(), context.DeadlineExceeded) {
		t.Errorf("Err = %v, want DeadlineExceeded", x.Err())
	}
	// Only Err asked: it ends the context once the deadline passed.
	y := &callCtx{c: &conn{}, deadline: time.Now().Add(20 * time.Millisecond)}
	if err := y.Err(); err != nil {
		t.Fatalf("Err before the deadline = %v", err)
	}
	for y.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-y.Done():
	default:
		t.Error("Err says DeadlineExceeded, Done is open")
	}
}

// TestWithoutCancel: WithoutCancel of another context is
// context.WithoutCancel's.
func TestWithoutCancel(t *testing.T) {
	if got := WithoutCancel(context.Background()); got != context.Background() {
		t.Errorf("WithoutCancel(Background) = %v", got)
	}
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	cancel()
	d := WithoutCancel(ctx)
	if d.Err() != nil || d.Done() != nil || d.Value(key{}) != "v" {
		t.Errorf("WithoutCancel(cancelled) = %v: Err %v, Done %v, value %v", d, d.Err(), d.Done(), d.Value(key{}))
	}
}
