package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// waitFor polls cond until it holds, or fails the test after 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// A deadline, not a measurement: a busy machine can take seconds to
	// start a process.
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never came: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const authRequest = "GET /auth HTTP/1.1\r\nHost: authlimit\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n"

// TestShutdownClosesIdleConnectionsAtOnce serves on a real TCP port, as
// run does, and shuts down with a connection that never sent a byte, one
// idle after its request, and one whose request is in flight (held by a
// shaping rule). Shutdown closes the first two at once and answers the
// third: it is done within AUTHLIMIT_SHUTDOWN_TIMEOUT=3s, far below the
// 10 s read timeout a silent connection would otherwise hold it for.
func TestShutdownClosesIdleConnectionsAtOnce(t *testing.T) {
	s, err := loadConfig(map[string]string{
		"AUTHLIMIT_RULES":            "name=smooth key=global limit=1/1s algorithm=leaky_bucket burst=1 delay=2s",
		"AUTHLIMIT_SHUTDOWN_TIMEOUT": "3s",
	})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	a, err := newApp(context.Background(), s, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := a.listener(tcp, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- a.serve(ctx, l, s.ShutdownTimeout) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("authlimit logs:\n%s", logs.String())
		}
	})

	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(8 * time.Second))
		return c
	}
	silent := dial()
	idle := dial()
	if _, err := io.WriteString(idle, authRequest); err != nil {
		t.Fatal(err)
	}
	idleReader := bufio.NewReader(idle)
	r, err := http.ReadResponse(idleReader, nil)
	if err != nil {
		t.Fatalf("first request: %v", err)
	}
	_, _ = io.Copy(io.Discard, r.Body)
	if r.StatusCode != 200 {
		t.Fatalf("first request: %d, want 200", r.StatusCode)
	}
	// The bucket is full: the next request is held about a second.
	held := dial()
	if _, err := io.WriteString(held, authRequest); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "authlimit reading the held request and holding the silent connection", func() bool {
		silent, spoke := l.Open()
		return spoke == 2 && silent == 1
	})

	start := time.Now()
	cancel()

	r, err = http.ReadResponse(bufio.NewReader(held), nil)
	if err != nil {
		t.Fatalf("the request in flight at shutdown got no answer: %v", err)
	}
	if r.StatusCode != 200 || !r.Close {
		t.Errorf("the request in flight at shutdown: %d, Connection: close %v; want 200 and close", r.StatusCode, r.Close)
	}
	for _, c := range []struct {
		name string
		r    io.Reader
	}{{"the idle keep-alive connection", idleReader}, {"the silent connection", silent}} {
		name := c.name
		n, err := c.r.Read(make([]byte, 1))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s is still open after shutdown", name)
		} else if n > 0 || err == nil {
			t.Errorf("%s: read %d bytes, %v after shutdown; want it closed", name, n, err)
		}
	}
	if err := <-served; err != nil {
		t.Errorf("shutdown after %v: %v", time.Since(start), err)
	}
}

// TestConnectionsAcceptedCounted: authlimit_connections_accepted_total
// counts connections, not requests. Denials answered to HEAD, as nginx
// sends its auth subrequests with proxy_method HEAD, carry no body, so the
// connection that carried them serves the next request: behind such a
// proxy the count stays at the proxy's few connections.
func TestConnectionsAcceptedCounted(t *testing.T) {
	app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=a limit=2/1m", "AUTHLIMIT_DENY_STATUS": "403"})
	send := func(c net.Conn, br *bufio.Reader, method string) (*http.Response, string) {
		t.Helper()
		req := method + " /auth HTTP/1.1\r\nHost: authlimit\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Method: GET\r\n\r\n"
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		r, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("%s /auth: %v", method, err)
		}
		body, _ := io.ReadAll(r.Body)
		return r, string(body)
	}
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := app.ln.Dial()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		return c, bufio.NewReader(c)
	}

	// One connection: 2 allowed, then 8 denied, all HEAD, then a GET
	// whose answer is read right only if no HEAD answer had a body.
	c, br := dial()
	for i := 0; i < 10; i++ {
		want := 200
		if i >= 2 {
			want = 403
		}
		r, body := send(c, br, "HEAD")
		if r.StatusCode != want || body != "" || r.Close {
			t.Fatalf("HEAD %d: %d, body %q, Connection: close %v; want %d, no body, kept open", i+1, r.StatusCode, body, r.Close, want)
		}
	}
	if r, body := send(c, br, "GET"); r.StatusCode != 403 || !strings.Contains(body, "urn:authlimit:rate-limited") {
		t.Fatalf("GET after the HEAD denials on one connection: %d %q, want 403 with the problem body", r.StatusCode, body)
	}
	// A second connection, three requests.
	c2, br2 := dial()
	for i := 0; i < 3; i++ {
		send(c2, br2, "GET")
	}

	// The scrape comes on a third connection.
	if got, want := metric(t, app, "authlimit_connections_accepted_total"), 3.0; got != want {
		t.Errorf("authlimit_connections_accepted_total = %v after 14 requests on 2 connections and a scrape on a third, want %v", got, want)
	}
	if got := metric(t, app, `authlimit_requests_total{front="http",result="denied"}`); got != 12 {
		t.Errorf(`authlimit_requests_total{result="denied"} = %v, want 12`, got)
	}
}

// TestShutdownAdmitsShapedRequestsAtOnce: requests held by delay= have
// spent their quota; a shutdown cuts their wait short and admits them at
// once (200, Connection: close), well within AUTHLIMIT_SHUTDOWN_TIMEOUT,
// however long their turn was to come.
func TestShutdownAdmitsShapedRequestsAtOnce(t *testing.T) {
	a, s := newTestApp(t, map[string]string{
		"AUTHLIMIT_RULES":            "name=smooth key=global limit=1/10s algorithm=leaky_bucket burst=1 delay=1m",
		"AUTHLIMIT_SHUTDOWN_TIMEOUT": "5s",
	})
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := a.listener(tcp, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- a.serve(ctx, l, s.ShutdownTimeout) }()

	send := func() *bufio.Reader {
		t.Helper()
		c, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(c, authRequest); err != nil {
			t.Fatal(err)
		}
		return bufio.NewReader(c)
	}
	first, err := http.ReadResponse(send(), nil)
	if err != nil || first.StatusCode != 200 {
		t.Fatalf("first request: %v, %v", first, err)
	}
	// The next five wait their turns, 10 s apart: 10 s to 50 s.
	var held []*bufio.Reader
	for i := 0; i < 5; i++ {
		held = append(held, send())
	}
	waitFor(t, "five requests held", func() bool {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/metrics")
		a.handler.Serve(&ctx)
		return strings.Contains(string(ctx.Response.Body()), "authlimit_shaping_delay_seconds_count 5\n")
	})

	start := time.Now()
	cancel()
	for i, r := range held {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Errorf("held request %d got no answer at shutdown: %v", i+1, err)
			continue
		}
		if resp.StatusCode != 200 || !resp.Close {
			t.Errorf("held request %d at shutdown: %d, Connection: close %v; want 200 and close", i+1, resp.StatusCode, resp.Close)
		}
	}
	if err := <-served; err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if d := time.Since(start); d >= s.ShutdownTimeout {
		t.Errorf("shutdown took %v, the whole AUTHLIMIT_SHUTDOWN_TIMEOUT", d)
	}
}
