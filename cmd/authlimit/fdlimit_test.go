package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// runMainEnv makes the test binary run authlimit's main instead of the
// tests, so that a test can start authlimit as a process of its own, under
// limits of its own.
const runMainEnv = "AUTHLIMITTEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	// A whole run builds the binary while the first tests run, rather
	// than in the first test that needs it.
	flag.Parse()
	runSet := false
	flag.Visit(func(f *flag.Flag) { runSet = runSet || f.Name == "test.run" })
	if !runSet && !testing.Short() {
		go buildBinaryOnce()
	}
	code := m.Run()
	removeBuiltBinary()
	os.Exit(code)
}

// child is authlimit running as a process under an open file limit.
type child struct {
	cmd  *exec.Cmd
	addr string
	out  *syncBuffer
	done chan struct{}
	err  error
}

// startLimited starts authlimit under prlimit's open file limit nofile
// (soft:hard), with env added to the environment, listening on a free
// loopback port.
func startLimited(t *testing.T, nofile string, env ...string) *child {
	t.Helper()
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) is not installed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	c := &child{addr: addr, out: &syncBuffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(prlimit, "--nofile="+nofile, "--", os.Args[0])
	c.cmd.Env = append(os.Environ(), runMainEnv+"=1", "AUTHLIMIT_LISTEN="+addr, "AUTHLIMIT_RULES=name=r limit=1000000/1m", "AUTHLIMIT_LOG_FORMAT=text")
	c.cmd.Env = append(c.cmd.Env, env...)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(15 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("authlimit output:\n%s", c.out.String())
		}
	})
	return c
}

// alive fails the test if authlimit has exited.
func (c *child) alive(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
		t.Fatalf("authlimit exited: %v", c.err)
	default:
	}
}

// proxyConn is a keep-alive connection, as a proxy holds one.
type proxyConn struct {
	c net.Conn
	r *bufio.Reader
}

func (c *child) dialProxy(t *testing.T) *proxyConn {
	t.Helper()
	var nc net.Conn
	waitFor(t, "authlimit listening", func() bool {
		var err error
		nc, err = net.Dial("tcp", c.addr)
		return err == nil
	})
	t.Cleanup(func() { _ = nc.Close() })
	return &proxyConn{c: nc, r: bufio.NewReader(nc)}
}

// get asks for path on the connection and returns the status and body.
func (p *proxyConn) get(t *testing.T, path string) (int, string) {
	t.Helper()
	_ = p.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(p.c, "GET %s HTTP/1.1\r\nHost: authlimit\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n", path); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	r, err := http.ReadResponse(p.r, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	body, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(body)
}

// metric reads a counter from /metrics on the connection.
func (p *proxyConn) metric(t *testing.T, name string) float64 {
	t.Helper()
	status, body := p.get(t, "/metrics")
	if status != 200 {
		t.Fatalf("/metrics: %d", status)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// flood opens n connections that send nothing and keeps them open.
func flood(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	return conns
}

// checkServing asserts the proxy's connection still decides and answers
// /healthz and /metrics.
func checkServing(t *testing.T, c *child, p *proxyConn) {
	t.Helper()
	c.alive(t)
	for _, path := range []string{"/auth", "/healthz", "/metrics"} {
		if status, _ := p.get(t, path); status != 200 {
			t.Errorf("GET %s on a connection opened before the flood: %d, want 200", path, status)
		}
	}
}

// TestConnectionFloodNeverEndsTheProcess: more connections than the open
// file limit allows neither end authlimit nor stop the connections it has.
// Beyond AUTHLIMIT_MAX_CONNS (by default the limit less a reserve) new
// connections are closed at once and counted; with a cap above the limit,
// failed accepts are counted and retried after a wait. Once the flood
// ends, new connections are served again.
func TestConnectionFloodNeverEndsTheProcess(t *testing.T) {
	t.Parallel()
	t.Run("default cap", func(t *testing.T) {
		c := startLimited(t, "256:256")
		p := c.dialProxy(t)
		if status, _ := p.get(t, "/healthz"); status != 200 {
			t.Fatalf("/healthz: %d", status)
		}
		const n = 400
		conns := flood(t, c.addr, n)
		capped := defaultMaxConns(256)
		waitFor(t, "connections beyond the cap closed", func() bool {
			return p.metric(t, "authlimit_connections_rejected_total") >= float64(n-capped+1)
		})
		checkServing(t, c, p)
		// The rejected connections were closed at once: reading one
		// ends without waiting for a timeout.
		closed := 0
		for _, fc := range conns {
			_ = fc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := fc.Read(make([]byte, 1)); err == io.EOF || isReset(err) {
				closed++
			}
		}
		if closed < n-capped+1 {
			t.Errorf("%d of %d flooding connections closed, want at least %d (cap %d)", closed, n, n-capped+1, capped)
		}
		for _, fc := range conns {
			_ = fc.Close()
		}
		fresh := c.dialProxy(t)
		waitFor(t, "a new connection served after the flood", func() bool {
			status, _ := fresh.get(t, "/healthz")
			return status == 200
		})
	})
	t.Run("cap above the limit", func(t *testing.T) {
		c := startLimited(t, "128:128", "AUTHLIMIT_MAX_CONNS=100000")
		p := c.dialProxy(t)
		if status, _ := p.get(t, "/healthz"); status != 200 {
			t.Fatalf("/healthz: %d", status)
		}
		conns := flood(t, c.addr, 300)
		waitFor(t, "failed accepts counted", func() bool {
			return p.metric(t, "authlimit_accept_errors_total") > 0
		})
		checkServing(t, c, p)
		for _, fc := range conns {
			_ = fc.Close()
		}
		// Accepts resume after at most a second's wait; a new
		// connection may first be one the backlog held and closed.
		waitFor(t, "a new connection served after the flood", c.servesNewConnection)
		c.alive(t)
	})
	t.Run("soft limit raised", func(t *testing.T) {
		c := startLimited(t, "128:512", "AUTHLIMIT_LOG_LEVEL=info")
		p := c.dialProxy(t)
		if status, _ := p.get(t, "/healthz"); status != 200 {
			t.Fatalf("/healthz: %d", status)
		}
		// The log reaches c.out through a pipe: it may follow the first
		// answer.
		want := fmt.Sprintf("max_conns=%d open_file_limit=512", defaultMaxConns(512))
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(c.out.String(), want); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("start-up log lacks %q: the soft limit 128 was not raised to the hard 512", want)
				break
			}
		}
	})
}

func isReset(err error) bool {
	return err != nil && (bytes.Contains([]byte(err.Error()), []byte("connection reset")))
}

// TestConnectionCapSharedWithGRPC: AUTHLIMIT_MAX_CONNS caps the decision
// listener and the gRPC listener together, so that a flood on one port
// cannot take the file descriptors set aside for connections twice over.
// Connections refused on either are counted; once the gRPC flood ends,
// the decision listener takes new connections again.
func TestConnectionCapSharedWithGRPC(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := ln.Addr().String()
	_ = ln.Close()
	const capped = 20
	c := startLimited(t, "1024:1024", fmt.Sprintf("AUTHLIMIT_MAX_CONNS=%d", capped), "AUTHLIMIT_GRPC_LISTEN="+grpcAddr)
	p := c.dialProxy(t) // one place taken
	if status, _ := p.get(t, "/healthz"); status != 200 {
		t.Fatalf("/healthz: %d", status)
	}
	// The gRPC listener listens before the decision listener serves.
	const n = capped + 5
	conns := flood(t, grpcAddr, n)
	waitFor(t, "gRPC connections beyond the shared cap refused and counted", func() bool {
		return p.metric(t, "authlimit_connections_rejected_total") >= float64(n-(capped-1))
	})
	// The gRPC listener counts the connections it kept, not those it
	// closed at once.
	if got, want := p.metric(t, "authlimit_grpc_connections_accepted_total"), float64(capped-1); got != want {
		t.Errorf("authlimit_grpc_connections_accepted_total = %v, want %v", got, want)
	}
	// Every place is taken now: a new connection to the decision
	// listener is closed at once.
	nc, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Read(make([]byte, 1)); err != io.EOF && !isReset(err) {
		t.Errorf("a decision connection beyond the shared cap: read %v, want it closed at once", err)
	}
	_ = nc.Close()
	checkServing(t, c, p)
	for _, fc := range conns {
		_ = fc.Close()
	}
	// The server sees the flood's connections close a moment later: until
	// then a new connection may still be refused.
	waitFor(t, "a decision connection served once the gRPC flood ended", c.servesNewConnection)
}

// servesNewConnection reports whether a new connection gets /healthz
// answered 200.
func (c *child) servesNewConnection() bool {
	nc, err := net.DialTimeout("tcp", c.addr, time.Second)
	if err != nil {
		return false
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(nc, "GET /healthz HTTP/1.1\r\nHost: authlimit\r\n\r\n")
	r, err := http.ReadResponse(bufio.NewReader(nc), nil)
	return err == nil && r.StatusCode == 200
}
