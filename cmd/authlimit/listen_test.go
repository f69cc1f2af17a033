package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// serveWithTimeouts serves h on a loopback port through a listener that
// keeps the timeouts t, as authlimit's does, and returns the listener.
func serveWithTimeouts(t *testing.T, tm timeouts, h fasthttp.RequestHandler) *listener {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newListener(tcp, listenerConfig{maxHeader: 8 << 10, timeouts: tm, metrics: connMetrics{
		accepted:     prometheus.NewCounter(prometheus.CounterOpts{Name: "accepted"}),
		rejected:     prometheus.NewCounter(prometheus.CounterOpts{Name: "rejected"}),
		acceptErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "accept_errors"}),
	}})
	s := &fasthttp.Server{Handler: h, ErrorHandler: errorHandler, NoDefaultServerHeader: true, CloseOnShutdown: true}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	t.Cleanup(func() {
		_ = s.Shutdown()
		<-served
	})
	return l
}

// open counts the listener's connections not yet closed.
func (l *listener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// closedWithin reads from r until the connection ends, and fails the test
// if it did not end or if anything came before its end.
func closedWithin(t *testing.T, r io.Reader, what string) {
	t.Helper()
	n, err := io.Copy(io.Discard, r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: still open at the client's deadline", what)
	}
	if n > 0 {
		t.Errorf("%s: %d bytes came before the close, want none", what, n)
	}
}

// TestConnTimeouts: the connection timeouts hold without fasthttp's: a
// silent connection and a trickled request end a read timeout after they
// began, never sooner; a busy keep-alive connection is never cut, however
// long it lives; an idle one closes an idle timeout after its last request;
// and an answer the client does not read ends the connection.
func TestConnTimeouts(t *testing.T) {
	tm := timeouts{read: 300 * time.Millisecond, write: 300 * time.Millisecond, idle: 2 * time.Second}
	// soon is well within the idle timeout: what should end a read timeout
	// after it began must not wait for the idle one.
	soon := tm.idle / 2
	big := strings.Repeat("x", 16<<20)
	handler := func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/big" {
			ctx.SetBodyString(big)
			return
		}
		ctx.SetBodyString("ok")
	}
	// dial connects to a server of its own.
	// It also returns when it began to connect: authlimit accepts the
	// connection later.
	dial := func(t *testing.T) (net.Conn, *listener, time.Time) {
		t.Helper()
		l := serveWithTimeouts(t, tm, handler)
		began := time.Now()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, l, began
	}
	ask := func(t *testing.T, c net.Conn, br *bufio.Reader) int {
		t.Helper()
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		return r.StatusCode
	}

	t.Run("a silent connection", func(t *testing.T) {
		t.Parallel()
		c, _, start := dial(t)
		br := bufio.NewReader(c)
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if r.StatusCode != 408 {
			t.Errorf("answered %d, want 408", r.StatusCode)
		}
		if d := time.Since(start); d < tm.read || d > soon {
			t.Errorf("answered after %v; want the read timeout %v", d, tm.read)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		closedWithin(t, br, "a connection that never sent a byte")
	})

	// trickle sends a request one byte every 20 ms, each read quick, the
	// request never ending, and checks that it is answered 408 a read
	// timeout after its first byte.
	trickle := func(t *testing.T, c net.Conn, br *bufio.Reader) {
		t.Helper()
		stop := make(chan struct{})
		defer close(stop)
		first := make(chan time.Time, 1)
		go func() {
			for i, b := range []byte("GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 1000)) {
				if i == 0 {
					first <- time.Now()
				}
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if r.StatusCode != 408 {
			t.Errorf("answered %d, want 408", r.StatusCode)
		}
		if d := time.Since(<-first); d < tm.read || d > soon {
			t.Errorf("answered %v after the first byte; want the read timeout %v", d, tm.read)
		}
	}

	t.Run("a trickled request", func(t *testing.T) {
		t.Parallel()
		c, _, _ := dial(t)
		trickle(t, c, bufio.NewReader(c))
	})

	// idleAfterRequest dials, is answered once, then waits two read
	// timeouts, within the idle one: the deadline on the socket moved on.
	idleAfterRequest := func(t *testing.T) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, _, _ := dial(t)
		br := bufio.NewReader(c)
		if status := ask(t, c, br); status != 200 {
			t.Fatalf("answered %d", status)
		}
		time.Sleep(2 * tm.read)
		return c, br
	}

	t.Run("a trickled request after an idle wait", func(t *testing.T) {
		t.Parallel()
		c, br := idleAfterRequest(t)
		trickle(t, c, br)
	})

	t.Run("a busy keep-alive connection", func(t *testing.T) {
		t.Parallel()
		c, _, _ := dial(t)
		br := bufio.NewReader(c)
		for start := time.Now(); time.Since(start) < 4*tm.read; time.Sleep(10 * time.Millisecond) {
			if status := ask(t, c, br); status != 200 {
				t.Fatalf("after %v: answered %d, want 200", time.Since(start), status)
			}
		}
	})

	t.Run("an idle keep-alive connection", func(t *testing.T) {
		t.Parallel()
		c, br := idleAfterRequest(t)
		start := time.Now()
		if status := ask(t, c, br); status != 200 {
			t.Fatalf("after %v idle: answered %d, want 200", 2*tm.read, status)
		}
		closedWithin(t, br, "an idle connection")
		if d := time.Since(start); d < tm.idle-50*time.Millisecond {
			t.Errorf("closed %v after the last request, before the idle timeout %v", d, tm.idle)
		}
	})

	t.Run("an answer nobody reads", func(t *testing.T) {
		t.Parallel()
		c, l, _ := dial(t)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4 << 10)
		}
		start := time.Now()
		if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "authlimit accepting the connection", func() bool { return l.open() == 1 })
		// The answer fills the socket's buffers within moments; authlimit
		// gives up on it a read and a write timeout after the request's
		// first byte, which came after start: seen from here, never sooner.
		deadline := start.Add(tm.read + tm.write + 2*time.Second)
		for l.open() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("still open %v after the request", time.Since(start))
			}
			time.Sleep(10 * time.Millisecond)
		}
		if d := time.Since(start); d < tm.read+tm.write {
			t.Errorf("closed after %v, before its read and write timeouts", d)
		}
	})
}
