package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/redistest"
)

type namedStore struct {
	name  string
	store algo.Decider
}

// bothStores returns a memory store and a Redis store on a real server, both
// reading clock.
func bothStores(t *testing.T, clock *algotest.Clock) []namedStore {
	t.Helper()
	mem := algo.NewMemory(algo.MemoryOptions{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	srv := redistest.New(t)
	rs := newRedis(t, srv.Client(t), srv.Prefix(t))
	rs.clock = clock.Now
	return []namedStore{{"memory", mem}, {"redis", rs}}
}

// newRedisStore returns a Redis store on a real server with the script's own
// clock (Redis TIME), the client and the server.
func newRedisStore(t testing.TB, opts *goredis.Options) (*Store, *goredis.Client, *redistest.Server) {
	t.Helper()
	srv := redistest.New(t)
	if opts == nil {
		opts = &goredis.Options{}
	}
	base, err := goredis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.Addr, opts.Username, opts.Password, opts.DB = base.Addr, base.Username, base.Password, base.DB
	c := goredis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return newRedis(t, c, srv.Prefix(t)), c, srv
}

// newClusterStore returns a warm Redis store on a fresh Redis Cluster of
// three primaries (the script's own clock), and the cluster client.
func newClusterStore(t testing.TB) (*Store, *goredis.ClusterClient) {
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
func newRedis(t testing.TB, c goredis.UniversalClient, prefix string) *Store {
	t.Helper()
	rs := New(c, Options{Prefix: prefix, Timeout: 10 * time.Second})
	t.Cleanup(func() { _ = rs.Close() })
	return rs
}
