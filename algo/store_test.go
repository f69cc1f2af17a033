package algo

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/internal/redistest"
)

// decider is what the tests need of a store.
type decider interface {
	Decide(ctx context.Context, reqs []Request, res []Result) (bool, error)
}

var (
	_ decider = (*Memory)(nil)
	_ decider = (*Redis)(nil)
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ us atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.Set(t)
	return c
}

func (c *fakeClock) Now() time.Time          { return time.UnixMicro(c.us.Load()) }
func (c *fakeClock) Set(t time.Time)         { c.us.Store(t.UnixMicro()) }
func (c *fakeClock) Advance(d time.Duration) { c.us.Add(d.Microseconds()) }
func (c *fakeClock) Micros() int64           { return c.us.Load() }
func (c *fakeClock) SetMicros(us int64)      { c.us.Store(us) }

// epoch is a pinned start aligned to a day, so every window in the tables
// begins at it.
var epoch = time.Unix(1799971200, 0)

type namedStore struct {
	name  string
	store decider
}

// bothStores returns a memory store and a Redis store on a real server, both
// reading clock.
func bothStores(t *testing.T, clock *fakeClock) []namedStore {
	t.Helper()
	mem := NewMemory(MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	srv := redistest.New(t)
	rs := newRedis(t, srv.Client(t), srv.Prefix(t))
	rs.clock = clock.Now
	return []namedStore{{"memory", mem}, {"redis", rs}}
}

// newRedisStore returns a Redis store on a real server with the script's own
// clock (Redis TIME), the client and the server.
func newRedisStore(t testing.TB, opts *redis.Options) (*Redis, *redis.Client, *redistest.Server) {
	t.Helper()
	srv := redistest.New(t)
	if opts == nil {
		opts = &redis.Options{}
	}
	base, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.Addr, opts.Username, opts.Password, opts.DB = base.Addr, base.Username, base.Password, base.DB
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return newRedis(t, c, srv.Prefix(t)), c, srv
}

// newClusterStore returns a warm Redis store on a fresh Redis Cluster of
// three primaries (the script's own clock), and the cluster client.
func newClusterStore(t testing.TB) (*Redis, *redis.ClusterClient) {
	t.Helper()
	cluster := redistest.NewCluster(t)
	client := cluster.Client(t)
	rs := newRedis(t, client, cluster.Prefix(t))
	if rs.cluster == nil {
		t.Fatal("a cluster client did not make a cluster store")
	}
	if err := rs.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rs, client
}

// newRedis returns a Redis store with a generous budget (tests run on busy
// machines) and closes it when t ends.
func newRedis(t testing.TB, c redis.UniversalClient, prefix string) *Redis {
	t.Helper()
	rs := NewRedis(c, RedisOptions{Prefix: prefix, Timeout: 10 * time.Second})
	t.Cleanup(func() { _ = rs.Close() })
	return rs
}

func mustPolicy(t testing.TB, s Spec) *Policy {
	t.Helper()
	r, err := NewPolicy(s)
	if err != nil {
		t.Fatalf("NewPolicy(%+v): %v", s, err)
	}
	return r
}

func decideOne(t testing.TB, st decider, q Request) Result {
	t.Helper()
	var res [1]Result
	if _, err := st.Decide(context.Background(), []Request{q}, res[:]); err != nil {
		t.Fatalf("Decide(%s, %q): %v", q.Policy.Name(), q.Key, err)
	}
	return res[0]
}
