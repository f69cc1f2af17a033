package redistest

import (
	"testing"
	"time"
)

// Option changes how a helper starts its redis-server processes. Each
// option names the helpers that read it; the others ignore it.
type Option func(*options)

type options struct {
	args            []string
	nodeTimeout     time.Duration
	downAfter       time.Duration
	failoverTimeout time.Duration
}

func newOptions(opts []Option) options {
	o := options{
		nodeTimeout:     time.Second,
		downAfter:       time.Second,
		failoverTimeout: 3 * time.Second,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithArgs adds arguments to the command line of every data node a helper
// starts (not to sentinels), e.g. WithArgs("--maxmemory", "10mb").
func WithArgs(args ...string) Option {
	return func(o *options) { o.args = append(o.args, args...) }
}

// WithDebugCommand lets clients on loopback run DEBUG (for DebugSleep).
// Redis 7.0 refuses DEBUG by default, even from 127.0.0.1, with "ERR DEBUG
// command not allowed"; "--enable-debug-command local" allows it from
// loopback and Unix sockets only, which is every client here. Redis checks
// this before the ACL, so without it even a user granted +debug is refused.
func WithDebugCommand() Option {
	return WithArgs("--enable-debug-command", "local")
}

// WithNodeTimeout sets cluster-node-timeout for NewClusterTopology (default
// 1s): how long a node may be unreachable before a replica takes over.
func WithNodeTimeout(d time.Duration) Option {
	return func(o *options) { o.nodeTimeout = d }
}

// WithDownAfter sets down-after-milliseconds for NewSentinelTopology
// (default 1s): how long the master may be silent before a sentinel calls
// it down.
func WithDownAfter(d time.Duration) Option {
	return func(o *options) { o.downAfter = d }
}

// WithFailoverTimeout sets failover-timeout for NewSentinelTopology
// (default 3s). Sentinels wait twice this long before retrying a failover
// that did not finish, so keep it short in tests.
func WithFailoverTimeout(d time.Duration) Option {
	return func(o *options) { o.failoverTimeout = d }
}

// NewLocal starts a throwaway redis-server from PATH on a free loopback
// port, with the arguments WithArgs and WithDebugCommand give, and stops it
// when t ends. Unlike New it never uses a shared server or a container, so
// a test may stop, stall or reconfigure it.
func NewLocal(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := newOptions(opts)
	s, err := Start(t, serverPath(t), o.args...)
	if err != nil {
		t.Fatalf("redistest: start redis-server with %q: %v", o.args, err)
	}
	return s
}
