package grpcwire

import (
	"context"
	"time"
)

// callCtx is a call's context, part of its stream: a call costs no
// context of its own (context.WithCancel under the connection's would
// allocate, and lock and enter the connection's context on every call).
// Its channel is made on the first Done, under the connection's lock, and
// closed when the client resets the stream, when the connection closes,
// when the deadline of the call's grpc-timeout passes, or when the call
// ends; a deadline's timer is started only by a Done before it. Streams
// are never reused: a context a handler keeps sees its own call's end,
// never a later call's.
type callCtx struct {
	c        *conn
	deadline time.Time // zero: none
	// Under c.mu.
	done  chan struct{}
	err   error
	timer *time.Timer
}

// Deadline implements context.Context: the call's grpc-timeout.
func (x *callCtx) Deadline() (time.Time, bool) {
	return x.deadline, !x.deadline.IsZero()
}

// Done implements context.Context.
func (x *callCtx) Done() <-chan struct{} {
	c := x.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if x.done != nil {
		return x.done
	}
	x.done = make(chan struct{})
	switch {
	case x.err != nil:
		close(x.done)
	case !x.deadline.IsZero():
		if x.expiredLocked() {
			break
		}
		x.timer = time.AfterFunc(time.Until(x.deadline), func() {
			c.mu.Lock()
			x.expiredLocked()
			c.mu.Unlock()
		})
	}
	return x.done
}

// Err implements context.Context.
func (x *callCtx) Err() error {
	c := x.c
	c.mu.Lock()
	defer c.mu.Unlock()
	x.expiredLocked()
	return x.err
}

// Value implements context.Context: a call's context carries no values.
func (*callCtx) Value(any) any { return nil }

// String names the context, as the standard library's do.
func (*callCtx) String() string { return "grpcwire.callCtx" }

// expiredLocked ends the context with DeadlineExceeded if its deadline has
// passed, and reports whether it has ended.
func (x *callCtx) expiredLocked() bool {
	if x.err == nil && !x.deadline.IsZero() && !time.Now().Before(x.deadline) {
		x.endLocked(context.DeadlineExceeded)
	}
	return x.err != nil
}

// endLocked ends the context with err, unless it has ended.
func (x *callCtx) endLocked(err error) {
	if x.err != nil {
		return
	}
	x.err = err
	if x.done != nil {
		close(x.done)
	}
	if x.timer != nil {
		x.timer.Stop()
		x.timer = nil
	}
}

// detachedCtx is a call's context without its cancellation or deadline,
// as context.WithoutCancel makes one: see WithoutCancel.
type detachedCtx callCtx

func (*detachedCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detachedCtx) Done() <-chan struct{}       { return nil }
func (*detachedCtx) Err() error                  { return nil }
func (x *detachedCtx) Value(key any) any         { return (*callCtx)(x).Value(key) }
func (*detachedCtx) String() string              { return "grpcwire.callCtx.WithoutCancel" }

// WithoutCancel is context.WithoutCancel(ctx), without its allocation when
// ctx is a call's context (or context.Background(), which is already
// without cancellation): for a handler whose work must not stop when its
// caller goes away.
func WithoutCancel(ctx context.Context) context.Context {
	switch x := ctx.(type) {
	case *callCtx:
		return (*detachedCtx)(x)
	case *detachedCtx:
		return x
	}
	if ctx == context.Background() {
		return ctx
	}
	return context.WithoutCancel(ctx)
}
