package grpcwire

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const asyncPath = "/test.Async/Echo"

// asyncEcho answers echo calls asynchronously: start hands each call to
// the test on calls, which answers it with Send whenever it likes. A
// request "sync" is left to the worker, "panic" panics in start.
type asyncEcho struct {
	calls  chan asyncCall
	worker atomic.Int64 // calls the worker answered
}

type asyncCall struct {
	value []byte
	out   []byte
	r     *Reply
}

func (a *asyncEcho) start(_ context.Context, req, out []byte, r *Reply) bool {
	var m wrapperspb.BytesValue
	if err := proto.Unmarshal(req, &m); err != nil {
		r.Send(out, status.Error(codes.Internal, err.Error()))
		return true
	}
	switch string(m.Value) {
	case "sync":
		return false
	case "panic":
		panic("start failed")
	}
	a.calls <- asyncCall{m.Value, out, r}
	return true
}

func (a *asyncEcho) sync(_ context.Context, req, out []byte) ([]byte, error) {
	a.worker.Add(1)
	return append(out, req...), nil
}

// answer sends the call's echo.
func (c asyncCall) answer(t *testing.T) {
	b, err := proto.Marshal(&wrapperspb.BytesValue{Value: c.value})
	if err != nil {
		t.Error(err)
	}
	c.r.Send(append(c.out, b...), nil)
}

func asyncServer(t *testing.T) (*Server, *asyncEcho, string) {
	t.Helper()
	s := NewServer(Options{Log: slog.New(slog.NewTextHandler(tWriter{t}, nil))})
	a := &asyncEcho{calls: make(chan asyncCall, 1000)}
	if err := UnaryRawAsync(s, asyncPath, a.sync, a.start); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return s, a, l.Addr().String()
}

func (r *raw) asyncCall(id uint32, v string) {
	r.t.Helper()
	r.headers(id, false, grpcHeaders(asyncPath)...)
	r.data(id, message(r.t, &wrapperspb.BytesValue{Value: []byte(v)}), true)
}

// TestAsyncCalls: an asynchronous handler answers from another goroutine,
// in any order, once; one that declines leaves the call to its worker;
// one that panics is answered INTERNAL; the connection serves on.
func TestAsyncCalls(t *testing.T) {
	_, a, addr := asyncServer(t)
	r := rawDial(t, addr)
	r.asyncCall(1, "one")
	r.asyncCall(3, "two")
	first, second := <-a.calls, <-a.calls
	second.answer(t) // out of order
	if got := r.answer(3); got.grpcStatus != "0" || !proto.Equal(decodeBytes(t, got.data), wrapperspb.Bytes([]byte("two"))) {
		t.Errorf("second call answered %+v", got)
	}
	first.answer(t)
	first.r.Send(nil, errors.New("a second Send")) // ignored
	if got := r.answer(1); got.grpcStatus != "0" || !proto.Equal(decodeBytes(t, got.data), wrapperspb.Bytes([]byte("one"))) {
		t.Errorf("first call answered %+v", got)
	}
	r.asyncCall(5, "sync")
	if got := r.answer(5); got.grpcStatus != "0" || a.worker.Load() != 1 {
		t.Errorf("declined call answered %+v, worker ran %d", got, a.worker.Load())
	}
	r.asyncCall(7, "panic")
	if got := r.answer(7); got.grpcStatus != code(codes.Internal) {
		t.Errorf("panicking call answered %+v, want INTERNAL", got)
	}
	r.asyncCall(9, "after")
	(<-a.calls).answer(t)
	if got := r.answer(9); got.grpcStatus != "0" {
		t.Errorf("call after a panic answered %+v", got)
	}
}

func decodeBytes(t *testing.T, framed []byte) *wrapperspb.BytesValue {
	t.Helper()
	var m wrapperspb.BytesValue
	if len(framed) < 5 {
		t.Fatalf("message of %d bytes", len(framed))
	}
	if err := proto.Unmarshal(framed[5:], &m); err != nil {
		t.Fatal(err)
	}
	return &m
}

// TestAsyncGracefulStop: GracefulStop waits for an asynchronous call to be
// answered, and the client gets the answer.
func TestAsyncGracefulStop(t *testing.T) {
	s, a, addr := asyncServer(t)
	r := rawDial(t, addr)
	r.asyncCall(1, "held")
	c := <-a.calls
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call unanswered")
	case <-time.After(200 * time.Millisecond):
	}
	c.answer(t)
	if got := r.answer(1); got.grpcStatus != "0" {
		t.Errorf("held call answered %+v", got)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop did not return once the call was answered")
	}
}

// TestAsyncSendNeverWaits: Send writes what the client's socket takes and
// returns: a client that reads nothing holds up no one answering it, as
// the goroutine that completes many clients' decisions answers them.
//
// Every call reaches the handler before any is answered: once a
// connection's unwritten answers pass maxBacklog its reader reads no more
// frames until the client reads (waitBacklog), so answering while calls
// are still on their way could leave the rest unread, depending on how
// much the kernel's socket buffers had taken by then.
func TestAsyncSendNeverWaits(t *testing.T) {
	_, a, addr := asyncServer(t)
	r := rawDial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	if err := r.fr.WriteWindowUpdate(0, 1<<30); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 15000) // a frame each
	const calls = 400          // 6 MB: more than loopback's socket buffers hold
	for i := range calls {
		r.asyncCall(uint32(2*i+1), string(big))
	}
	started := make([]asyncCall, 0, calls)
	for len(started) < calls {
		select {
		case c := <-a.calls:
			started = append(started, c)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d calls reached the handler", len(started), calls)
		}
	}
	for _, c := range started {
		start := time.Now()
		c.answer(t)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Send to a client that reads nothing took %v", d)
		}
	}
	// What the socket did not take is written once the client reads.
	for i := range calls {
		if got := r.answer(uint32(2*i + 1)); got.grpcStatus != "0" || len(got.data) < len(big) {
			t.Fatalf("call %d answered %q with %d bytes", 2*i+1, got.grpcStatus, len(got.data))
		}
	}
}
