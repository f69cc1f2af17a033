package algo

import (
	"context"
	"errors"
)

// What follows is the contract every store keeps (Memory, the Redis store
// in package store/redis), and what their callers (the guard, the engine)
// rely on.

// Decider decides one request's policies atomically, all or nothing: a
// store (Memory, Redis).
type Decider interface {
	Decide(ctx context.Context, reqs []Request, res []Result) (bool, error)
}

// Resetter forgets the state of policies for keys: a store (Memory, Redis).
type Resetter interface {
	Reset(ctx context.Context, reqs []Request) error
}

var (
	_ Resetter = (*Memory)(nil)
	_ Decider  = (*Memory)(nil)
)

// Done is told the outcome of a store's asynchronous decision (the Redis
// store's DecideAsync): Decide's results and error.
type Done interface {
	Decided(admitted bool, err error)
}

// RunDone is a Done that can be told its outcome within a Run.
type RunDone interface {
	Done
	DecidedIn(run *Run, admitted bool, err error)
}

// Run is the outcomes a store tells one after another on one goroutine:
// a batch's. Told an outcome within a run (see RunDone), whoever answers
// a client over a connection may buffer the answer and leave its write
// to the run's end (Defer): the answers of a batch bound for one
// connection then leave in one write, which costs both ends less than a
// write each. A Run is used by one goroutine at a time; its zero value is
// empty.
type Run struct {
	later []Flusher
}

// Flusher writes what it left for a run's end.
type Flusher interface {
	Flush()
}

// Defer has f flushed at the run's end, once per Defer.
func (r *Run) Defer(f Flusher) { r.later = append(r.later, f) }

// End flushes what was deferred, in order, and leaves the run empty for
// the next.
func (r *Run) End() {
	for i := 0; i < len(r.later); i++ {
		f := r.later[i]
		r.later[i] = nil
		f.Flush()
	}
	r.later = r.later[:0]
}

// Tell tells d the outcome: within run if run is not nil and d can be
// told so, else as Decided does.
func Tell(d Done, run *Run, admitted bool, err error) {
	if run != nil {
		if rd, ok := d.(RunDone); ok {
			rd.DecidedIn(run, admitted, err)
			return
		}
	}
	d.Decided(admitted, err)
}

// ErrClosed is returned by a store used after Close.
var ErrClosed = errors.New("store closed")

// ErrUnreachable is wrapped by the error of a decision that a remote store
// never sent: it refused the connection, or no connection was free in time.
// Nothing was decided or consumed.
var ErrUnreachable = errors.New("redis unreachable")

// ShardError is the error of a decision that failed on some shards (such as
// Redis Cluster primaries) only: a guard counts the failure against
// those, not against the shards that answered.
type ShardError struct {
	Shards []int
	Err    error
}

func (e *ShardError) Error() string { return e.Err.Error() }
func (e *ShardError) Unwrap() error { return e.Err }
