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
package redistest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		p, err := startProcess(path, port, t.TempDir(), extra)
		if err != nil {
			lastErr = err
			continue // most likely another process took the port
		}
		t.Cleanup(p.stop)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		return &Server{URL: "redis://" + addr, Addr: addr, Owned: true, proc: p}, nil
	}
	return nil, lastErr
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
	_, port, _ := net.SplitHostPort(s.Addr)
	n, _ := strconv.Atoi(port)
	p, err := startProcess(s.proc.path, n, t.TempDir(), s.proc.extra)
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

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

type process struct {
	path  string
	extra []string
	cmd   *exec.Cmd
	done  chan struct{}
}

// startProcess runs redis-server; a config file, when given, comes first
// on its command line, as redis-server requires.
func startProcess(path string, port int, dir string, extra []string, config ...string) (*process, error) {
	args := append(config, []string{
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(port),
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--daemonize", "no",
		"--logfile", filepath.Join(dir, "redis.log"),
	}...)
	args = append(args, extra...)
	cmd := exec.Command(path, args...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	p := &process{path: path, extra: extra, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if pingRaw(addr) == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("redis-server on port %d exited at start: %s", port, tail(filepath.Join(dir, "redis.log")))
		default:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("redis-server on port %d not ready after 10s: %s", port, tail(filepath.Join(dir, "redis.log")))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// pingRaw speaks just enough RESP to tell whether Redis serves.
func pingRaw(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return errors.New(strings.TrimSpace(line))
	}
	return nil
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 400 {
		s = s[len(s)-400:]
	}
	return s
}

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
	for i := 0; i < 3; i++ {
		s, err := Start(t, path, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		if err != nil {
			t.Fatalf("redistest: cluster node: %v", err)
		}
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Split the 16384 slots between the nodes and introduce them.
	for i, addr := range c.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		lo, hi := i*16384/len(c.Addrs), (i+1)*16384/len(c.Addrs)-1
		if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("redistest: CLUSTER ADDSLOTSRANGE on %s: %v", addr, err)
		}
		if i > 0 {
			host, port, _ := net.SplitHostPort(c.Addrs[0])
			if err := node.Do(ctx, "CLUSTER", "MEET", host, port).Err(); err != nil {
				t.Fatalf("redistest: CLUSTER MEET from %s: %v", addr, err)
			}
		}
		_ = node.Close()
	}
	for _, addr := range c.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := node.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("redistest: cluster not ready on %s: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = node.Close()
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
	for attempt := 0; attempt < 5; attempt++ {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		proc, err := startProcess(path, p, dir, []string{"--sentinel"}, conf)
		if err != nil {
			continue
		}
		t.Cleanup(proc.stop)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		return &Server{URL: "redis://" + addr, Addr: addr, Owned: true, proc: proc}
	}
	t.Fatalf("redistest: sentinel did not start")
	return nil
}
