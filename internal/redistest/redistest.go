// Package redistest gives tests a real Redis server, found in one of three
// ways, in order:
//
//  1. AUTHLIMIT_TEST_REDIS_URL, a server someone else runs: it is shared, so
//     tests use random key prefixes, delete only their own keys and never
//     FLUSHALL it;
//  2. a throwaway redis-server found on PATH, started on a free loopback port
//     and stopped when the test ends;
//  3. a redis container through testcontainers-go, when a Docker engine
//     answers.
//
// If none works the test fails, naming the three ways. It never skips.
//
// For fault tests it also starts whole topologies from redis-server on
// PATH, always on 127.0.0.1, on free ports, in t.TempDir directories, and
// stops them when the test ends, failed or not:
//
//   - NewClusterTopology: a cluster with replicas, with Kill, Restart,
//     WaitFailover and WaitHealthy (topology.go), and slot moves by
//     redis-cli (Reshard) or by hand (MoveSlot, BeginMigration) (reshard.go);
//   - NewSentinelTopology: a master, a replica and three sentinels, with
//     KillMaster and WaitFailover (sentinel.go);
//   - StartTLS: a TLS-only server with a CA made for the test and an
//     unrelated one (tls.go);
//   - NewACLUser: a least-privilege user for a key prefix (acl.go);
//   - NewLatencyProxy: a TCP proxy that delays, stalls or cuts a link
//     (proxy.go);
//   - PauseClients and DebugSleep: a stalled server (stall.go);
//   - OpenConns, WaitConns and SnapshotGoroutines: leak checks (leak.go).
//
// Every helper takes the test, fails it with what it tried and the end of
// the servers' logs rather than return something half started, and waits
// by polling against a deadline.
package redistest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/authlimit/authlimit/internal/clusterform"
	"github.com/authlimit/authlimit/internal/freeport"
)

// EnvURL names the variable that points tests at an existing server.
const EnvURL = "AUTHLIMIT_TEST_REDIS_URL"

// Server is a Redis server for one test.
type Server struct {
	// URL is a redis:// URL for the server.
	URL string
	// Addr is its host:port.
	Addr string
	// Owned reports whether the test started the server (and may stop,
	// restart or flush it).
	Owned bool

	proc *process
	// tlsConfig, for a TLS server, trusts its CA.
	tlsConfig *tls.Config
}

// New returns a server for t, found as the package comment says, and stops
// it (if t started it) when t ends.
func New(t testing.TB) *Server {
	t.Helper()
	if url := os.Getenv(EnvURL); url != "" {
		opts, err := redis.ParseURL(url)
		if err != nil {
			t.Fatalf("redistest: %s=%q: %v", EnvURL, url, err)
		}
		return &Server{URL: url, Addr: opts.Addr}
	}
	var why []string
	if path, err := exec.LookPath("redis-server"); err == nil {
		s, err := Start(t, path)
		if err == nil {
			return s
		}
		why = append(why, fmt.Sprintf("redis-server at %s did not start: %v", path, err))
	} else {
		why = append(why, "no redis-server on PATH")
	}
	s, err := container(t)
	if err == nil {
		return s
	}
	why = append(why, fmt.Sprintf("no Docker engine for testcontainers-go: %v", err))
	t.Fatalf("redistest: no Redis server for the tests. Set %s to a server's URL, put redis-server on PATH (Debian: apt-get install redis-server), or run a Docker engine. Tried: %s",
		EnvURL, strings.Join(why, "; "))
	return nil
}

// Start starts the redis-server binary at path on a free loopback port and
// stops it when t ends. Extra arguments go to redis-server's command line.
func Start(t testing.TB, path string, extra ...string) (*Server, error) {
	t.Helper()
	p, err := startOwned(t, procSpec{path: path, dir: t.TempDir(), extra: extra}, 1, nil)
	if err != nil {
		return nil, err
	}
	return newServer(p), nil
}

// newServer wraps a process the test started.
func newServer(p *process) *Server {
	addr := p.spec.addr()
	return &Server{URL: "redis://" + addr, Addr: addr, Owned: true, proc: p}
}

// Stop stops a server the test started, as a crash would: no save, no
// goodbye. Restart brings it back on the same port.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if !s.Owned || s.proc == nil {
		t.Fatalf("redistest: cannot stop a server the test did not start")
	}
	s.proc.stop()
}

// Restart starts a stopped server again on the same port, empty.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if !s.Owned || s.proc == nil {
		t.Fatalf("redistest: cannot restart a server the test did not start")
	}
	spec := s.proc.spec
	spec.dir = t.TempDir()
	p, err := startProcess(spec)
	if err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
	s.proc = p
	t.Cleanup(p.stop)
}

// Client returns a client of the server, closed when t ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(s.URL)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	if s.tlsConfig != nil {
		opts.TLSConfig = s.tlsConfig.Clone()
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a random key prefix for t and, on a shared server, deletes
// every key under it when t ends.
func (s *Server) Prefix(t testing.TB) string {
	t.Helper()
	prefix := newPrefix()
	if !s.Owned {
		t.Cleanup(func() {
			opts, err := redis.ParseURL(s.URL)
			if err != nil {
				return
			}
			c := redis.NewClient(opts)
			defer c.Close()
			deleteKeys(c, prefix)
		})
	}
	return prefix
}

func newPrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "authlimit-test-" + hex.EncodeToString(b[:])
}

// deleteKeys deletes every key under prefix from one node.
func deleteKeys(node *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := node.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		node.Del(ctx, iter.Val())
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for
// a process started next to bind (see package freeport).
func FreePort() (int, error) { return freeport.Get() }

func container(t testing.TB) (*Server, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return nil, err
	}
	defer provider.Close()
	if err := provider.Health(ctx); err != nil {
		return nil, err
	}
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        "redis:7-alpine",
			ExposedPorts: []string{"6379/tcp"},
			Cmd:          []string{"redis-server", "--save", "", "--appendonly", "no"},
			WaitingFor:   wait.ForListeningPort("6379/tcp"),
		},
		Started: true,
	})
	if err != nil {
		return nil, fmt.Errorf("start redis container: %w", err)
	}
	t.Cleanup(func() { _ = c.Terminate(context.Background()) })
	host, err := c.Host(ctx)
	if err != nil {
		return nil, err
	}
	port, err := c.MappedPort(ctx, "6379/tcp")
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(host, port.Port())
	return &Server{URL: "redis://" + addr, Addr: addr, Owned: true}, nil
}

// EnvClusterAddrs names the variable that points cluster tests at an
// existing Redis Cluster: comma-separated host:port of its nodes.
const EnvClusterAddrs = "AUTHLIMIT_TEST_REDIS_CLUSTER_ADDRS"

// Cluster is a Redis Cluster for one test.
type Cluster struct {
	// Addrs are the nodes' host:port.
	Addrs []string
	// Nodes are the servers, when the test started them.
	Nodes []*Server
}

// NewCluster returns a Redis Cluster for t: the one EnvClusterAddrs names,
// or three redis-server primaries started on free loopback ports and joined
// into a cluster, stopped when t ends. If neither works the test fails.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	if addrs := os.Getenv(EnvClusterAddrs); addrs != "" {
		return &Cluster{Addrs: strings.Split(addrs, ",")}
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: no Redis Cluster for the tests. Set %s to a cluster's node addresses, or put redis-server on PATH (Debian: apt-get install redis-server)", EnvClusterAddrs)
	}
	c := &Cluster{}
	var members []clusterform.Node
	for i := 0; i < 3; i++ {
		// The bus on a port chosen as the client's is (see
		// clusterform.Node).
		bus, err := FreePort()
		if err != nil {
			t.Fatalf("redistest: cluster bus port: %v", err)
		}
		s, err := Start(t, path, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--cluster-port", strconv.Itoa(bus))
		if err != nil {
			t.Fatalf("redistest: cluster node: %v", err)
		}
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
		members = append(members, clusterform.Node{Addr: s.Addr, Bus: bus})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := clusterform.Form(ctx, members); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// Client returns a cluster client, closed when t ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Prefix returns a random key prefix for t and, on a cluster the test did
// not start, deletes every key under it from every primary when t ends.
func (c *Cluster) Prefix(t testing.TB) string {
	t.Helper()
	prefix := newPrefix()
	if c.Nodes == nil {
		t.Cleanup(func() {
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
			defer cc.Close()
			_ = cc.ForEachMaster(context.Background(), func(_ context.Context, node *redis.Client) error {
				deleteKeys(node, prefix)
				return nil
			})
		})
	}
	return prefix
}

// StartSentinel starts a Redis Sentinel on a free loopback port that
// monitors master under the name given, and stops it when t ends.
func StartSentinel(t testing.TB, master *Server, name string) *Server {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: no redis-server on PATH for a sentinel (Debian: apt-get install redis-server)")
	}
	host, port, _ := net.SplitHostPort(master.Addr)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 5000\n", name, host, port, name)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	proc, err := startOwned(t, procSpec{path: path, dir: dir, config: conf, extra: []string{"--sentinel"}}, 1, nil)
	if err != nil {
		t.Fatalf("redistest: sentinel did not start: %v", err)
	}
	return newServer(proc)
}
