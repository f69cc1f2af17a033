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
