package main

// Tests of the reference servers: redis-floor against a real redis-server,
// and the flags of naive and redis-floor.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
)

// startRedisServer starts a redis-server of the test's own, so that its
// statistics count nothing but the test's traffic.
func startRedisServer(t *testing.T) *redistest.Server {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not on PATH (apt-get install redis-server): %v", err)
	}
	srv, err := redistest.Start(t, path)
	if err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	return srv
}

// startFloor runs serve-redis-floor in this process until the test ends
// and waits until it answers.
func startFloor(t *testing.T, redisAddr string) string {
	t.Helper()
	return serveInTest(t, "serve-redis-floor", serveRedisFloor, "-redis", redisAddr, "-timeout", "500ms")
}

// serveInTest runs a reference server in this process on a free port with
// args until the test ends, waits until its /healthz answers, and returns
// its address.
func serveInTest(t *testing.T, name string, serve func(context.Context, []string, io.Writer) error, args ...string) string {
	t.Helper()
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, append([]string{"-listen", addr}, args...), io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for wantStatus("http://"+addr+"/healthz", 200)() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s not ready after 10s", name, addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return addr
}

// infoCounter reads a counter of an INFO section, or of a command's line of
// INFO commandstats ("cmdstat_ping").
func infoCounter(t *testing.T, r *redisServer, section, name string) uint64 {
	t.Helper()
	if section == "commandstats" {
		cs, err := r.commandStats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return cs[strings.TrimPrefix(name, "cmdstat_")].calls
	}
	info, err := r.info(context.Background(), section)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	if _, err := fmt.Sscan(info[name], &n); err != nil {
		t.Fatalf("INFO %s: %s = %q: %v", section, name, info[name], err)
	}
	return n
}

// TestRedisFloorOnePingPerRequest: every request is one PING that Redis
// counts, no more, on pooled connections (no more of them than requests in
// flight at once), and /healthz asks nothing.
func TestRedisFloorOnePingPerRequest(t *testing.T) {
	srv := startRedisServer(t)
	r := &redisServer{addr: srv.Addr, client: srv.Client(t)}
	addr := startFloor(t, srv.Addr)

	const workers, each = 4, 50
	pings0 := infoCounter(t, r, "commandstats", "cmdstat_ping")
	conns0 := infoCounter(t, r, "stats", "total_connections_received")
	var wg sync.WaitGroup
	statuses := make(chan string, workers*each)
	for range workers {
		wg.Go(func() {
			for range each {
				status, _, err := httpGet("http://" + addr + "/auth")
				if err != nil || status != 200 {
					statuses <- fmt.Sprintf("status %d, err %v", status, err)
				}
			}
		})
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		t.Errorf("GET /auth: %s, want 200", s)
	}
	if _, _, err := httpGet("http://" + addr + "/healthz"); err != nil {
		t.Fatal(err)
	}
	pings := infoCounter(t, r, "commandstats", "cmdstat_ping") - pings0
	if pings != workers*each {
		t.Errorf("PING calls grew by %d over %d requests, want exactly %d", pings, workers*each, workers*each)
	}
	// The startup PING's connection is idle in the pool: at most one new
	// connection per request in flight at once.
	if conns := infoCounter(t, r, "stats", "total_connections_received") - conns0; conns > workers {
		t.Errorf("Redis received %d connections for %d requests from %d workers, want at most %d (pooled)", conns, workers*each, workers, workers)
	}
}

// TestRedisFloorRedisDown: a Redis that is gone makes requests 500 within
// the deadline, and the server recovers once Redis is back, dropping the
// connections that broke.
func TestRedisFloorRedisDown(t *testing.T) {
	srv := startRedisServer(t)
	addr := startFloor(t, srv.Addr)
	status := func() int {
		t.Helper()
		s, _, err := httpGet("http://" + addr + "/auth")
		if err != nil {
			t.Fatalf("GET /auth: %v", err)
		}
		return s
	}
	waitStatus := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := status()
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET /auth: status %d, want %d within 10s", got, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got := status(); got != 200 {
		t.Fatalf("GET /auth with Redis up: status %d, want 200", got)
	}
	srv.Stop(t)
	waitStatus(500)
	if got := status(); got != 500 {
		t.Errorf("GET /auth with Redis down (a fresh dial): status %d, want 500", got)
	}
	srv.Restart(t)
	waitStatus(200)
}

// TestRedisFloorRefused: a reply other than +PONG (here NOAUTH from a
// server that wants a password) is an error at startup, naming it.
func TestRedisFloorRefused(t *testing.T) {
	srv := startRedisServer(t)
	// The client's own connection stays authenticated; new ones are not.
	if err := srv.Client(t).ConfigSet(context.Background(), "requirepass", "secret").Err(); err != nil {
		t.Fatal(err)
	}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	err = serveRedisFloor(context.Background(), []string{"-listen", addr, "-redis", srv.Addr}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("serve-redis-floor against a server wanting a password: %v, want an error naming NOAUTH", err)
	}
}

// TestNaiveDenyStatus: naive keys by X-Forwarded-For and denies with its
// -deny-status, as nginx-naive-redis needs (auth_request passes only a 403
// on as a denial).
func TestNaiveDenyStatus(t *testing.T) {
	srv := startRedisServer(t)
	addr := serveInTest(t, "serve-naive", serveNaive, "-redis", srv.Addr, "-limit", "1", "-window", "1h", "-deny-status", "403")
	client := &http.Client{Timeout: 2 * time.Second}
	for i, tt := range []struct {
		method, client string
		want           int
	}{
		{"HEAD", "198.18.0.1", 200}, // nginx's subrequest is a HEAD
		{"HEAD", "198.18.0.1", 403},
		{"GET", "198.18.0.2", 200},
		{"GET", "198.18.0.2", 403},
		{"GET", "198.18.0.1", 403},
	} {
		req, err := http.NewRequest(tt.method, "http://"+addr+"/auth", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", tt.client)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("request %d: %s from %s: status %d, want %d", i, tt.method, tt.client, resp.StatusCode, tt.want)
		}
	}
}

// TestNaiveRaw: with -client raw, naive limits as it does through
// go-redis, with exactly one EVALSHA per request and one connection per
// request in flight at most.
func TestNaiveRaw(t *testing.T) {
	srv := startRedisServer(t)
	r := &redisServer{addr: srv.Addr, client: srv.Client(t)}
	addr := serveInTest(t, "serve-naive", serveNaive, "-redis", srv.Addr, "-limit", "3", "-window", "1h", "-client", "raw")
	before := infoCounter(t, r, "commandstats", "cmdstat_evalsha")
	get := func(from string) int { return askAuth(t, addr, from) }
	var got []int
	for range 4 {
		got = append(got, get("198.18.0.1"))
	}
	got = append(got, get("198.18.0.2"))
	want := []int{200, 200, 200, 429, 200}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	if n := infoCounter(t, r, "commandstats", "cmdstat_evalsha") - before; n != 5 {
		t.Errorf("EVALSHA calls grew by %d for 5 requests, want 5", n)
	}
}

// TestNaiveClock: with -clock, naive counts in a key per window index of
// Redis's clock, which expires with its window, through either client.
func TestNaiveClock(t *testing.T) {
	for _, kind := range []string{"raw", "go-redis"} {
		t.Run(kind, func(t *testing.T) {
			srv := startRedisServer(t)
			rc := srv.Client(t)
			addr := serveInTest(t, "serve-naive", serveNaive, "-redis", srv.Addr, "-limit", "2", "-window", "1h", "-client", kind, "-clock")
			get := func(from string) int { return askAuth(t, addr, from) }
			ctx := context.Background()
			before, err := rc.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			got := []int{get("198.18.0.1"), get("198.18.0.1"), get("198.18.0.1"), get("198.18.0.2")}
			after, err := rc.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if want := []int{200, 200, 429, 200}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("statuses %v, want %v", got, want)
			}
			keys, err := rc.Keys(ctx, "naive:198.18.0.1*").Result()
			if err != nil {
				t.Fatal(err)
			}
			hour := time.Hour.Milliseconds()
			var want []string
			for _, at := range []time.Time{before, after} {
				if k := fmt.Sprintf("naive:198.18.0.1:%d", at.UnixMilli()/hour); !slices.Contains(want, k) {
					want = append(want, k)
				}
			}
			if len(keys) != 1 || !slices.Contains(want, keys[0]) {
				t.Fatalf("keys %q, want one of %q", keys, want)
			}
			if n, err := rc.Get(ctx, keys[0]).Int(); err != nil || n != 3 {
				t.Errorf("%s = %d, %v; want 3", keys[0], n, err)
			}
			if ttl, err := rc.PTTL(ctx, keys[0]).Result(); err != nil || ttl <= 0 || ttl > time.Hour {
				t.Errorf("%s expires in %v, %v; want within the window", keys[0], ttl, err)
			}
		})
	}
}

// askAuth sends a GET /auth to the server at addr for the client from (its
// X-Forwarded-For) and returns the answer's status.
func askAuth(t *testing.T, addr, from string) int {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+"/auth", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-For", from)
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestServerFlags: bad flags are refused, naming the flag, before any
// Redis is dialled (the address given answers nothing).
func TestServerFlags(t *testing.T) {
	tests := []struct {
		name  string
		serve func(context.Context, []string, io.Writer) error
		args  []string
		want  string
	}{
		{"naive deny status 200", serveNaive, []string{"-deny-status", "200"}, "-deny-status 200"},
		{"naive deny status 500", serveNaive, []string{"-deny-status", "500"}, "-deny-status 500"},
		{"naive limit 0 and window 0", serveNaive, []string{"-limit", "0", "-window", "0s"}, "-limit 0 must be at least 1\n-window 0s"},
		{"naive unknown client", serveNaive, []string{"-client", "redigo"}, `-client "redigo"`},
		{"floor timeout 0", serveRedisFloor, []string{"-timeout", "0s"}, "-timeout 0s"},
		{"floor unknown flag", serveRedisFloor, []string{"-pipeline"}, "-pipeline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"-redis", "127.0.0.1:1"}, tt.args...)
			err := tt.serve(context.Background(), args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("serve(%q) = %v, want an error with %q", args, err, tt.want)
			}
		})
	}
}
