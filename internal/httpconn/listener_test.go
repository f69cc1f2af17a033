package httpconn

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/internal/membudget"
)

// testServer serves h through a Listener over l, with fasthttp configured
// as authlimit configures it (ReduceMemoryUsage, no timeouts of its own),
// and returns the listener.
func testServer(t *testing.T, l net.Listener, tm Timeouts, h fasthttp.RequestHandler) *Listener {
	t.Helper()
	return serveWith(t, l, tm, h, true)
}

// serveWith is testServer, with fasthttp's ReduceMemoryUsage or without:
// without it, fasthttp answers a connection silent until its read timeout
// 408 before closing it, where with it it closes at once.
func serveWith(t *testing.T, l net.Listener, tm Timeouts, h fasthttp.RequestHandler, reduceMemory bool) *Listener {
	t.Helper()
	return serveBudget(t, l, tm, h, reduceMemory, nil)
}

// serveBudget is serveWith, with a memory budget.
func serveBudget(t *testing.T, l net.Listener, tm Timeouts, h fasthttp.RequestHandler, reduceMemory bool, b *membudget.Budget) *Listener {
	t.Helper()
	hl := New(l, Config{MaxHeader: 32 << 10, Budget: b, Timeouts: tm, Metrics: Metrics{
		Accepted:     prometheus.NewCounter(prometheus.CounterOpts{Name: "accepted"}),
		AcceptErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "accept_errors"}),
	}})
	s := &fasthttp.Server{
		Handler:               h,
		NoDefaultServerHeader: true,
		ReadBufferSize:        32 << 10,
		ReduceMemoryUsage:     reduceMemory,
		CloseOnShutdown:       true,
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			if IsTimeout(err) {
				ctx.Error("timeout", fasthttp.StatusRequestTimeout)
				return
			}
			ctx.Error(err.Error(), fasthttp.StatusBadRequest)
		},
		Logger: discard{},
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(hl) }()
	t.Cleanup(func() {
		_ = s.Shutdown()
		<-served
	})
	return hl
}

// discard drops fasthttp's messages.
type discard struct{}

func (discard) Printf(string, ...any) {}

// loopback listens on a loopback port.
func loopback(t *testing.T) net.Listener {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return tcp
}

// longTimeouts are a server's that no test waits for.
var longTimeouts = Timeouts{Read: 10 * time.Second, Write: 10 * time.Second, Idle: time.Minute}

// ok answers 200 "ok".
func ok(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }

// dial connects to l, with a deadline on the client's side.
func dial(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// open counts the listener's connections not yet closed.
func (l *Listener) open() int {
	silent, spoke := l.Open()
	return silent + spoke
}

// waitFor polls cond until it holds, or fails the test after 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never came: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
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
	// The timeouts and the slack below are generous: on a loaded machine a
	// test's own sleeps and reads run late. Under the race detector, beside
	// other packages' tests, a client began its request 300 ms after its
	// connection (the read timeout was 300 ms then: the server rightly took
	// it for a silent one), and connections ended with no answer, as when a
	// server comes to write its 408 past the write deadline. Neither is the
	// behaviour under test, and a second makes both unlikely.
	tm := Timeouts{Read: time.Second, Write: time.Second, Idle: 6 * time.Second}
	// soon is well within the idle timeout: what should end a read timeout
	// after it began must not wait for the idle one.
	soon := tm.Idle / 2
	big := strings.Repeat("x", 16<<20)
	handler := func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/big" {
			ctx.SetBodyString(big)
			return
		}
		ctx.SetBodyString("ok")
	}
	// serveAndDial connects to a server of its own.
	// It also returns when it began to connect: the server accepts the
	// connection later.
	serveAndDial := func(t *testing.T) (net.Conn, *Listener, time.Time) {
		t.Helper()
		l := serveWith(t, loopback(t), tm, handler, false)
		began := time.Now()
		return dial(t, l), l, began
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
		c, _, start := serveAndDial(t)
		br := bufio.NewReader(c)
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if r.StatusCode != 408 {
			t.Errorf("answered %d, want 408", r.StatusCode)
		}
		if d := time.Since(start); d < tm.Read || d > soon {
			t.Errorf("answered after %v; want the read timeout %v", d, tm.Read)
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
		d := time.Since(<-first)
		switch {
		case err != nil:
			// A reset here is the server closing with a trickled byte
			// unread, which it must not: it lingers.
			t.Fatalf("no answer: %v", err)
		case r.StatusCode != 408:
			t.Errorf("answered %d, want 408", r.StatusCode)
		}
		if d < tm.Read || d > soon {
			t.Errorf("answered %v after the first byte; want the read timeout %v", d, tm.Read)
		}
	}

	t.Run("a trickled request", func(t *testing.T) {
		t.Parallel()
		c, _, _ := serveAndDial(t)
		trickle(t, c, bufio.NewReader(c))
	})

	// idleAfterRequest dials, is answered once, then waits two read
	// timeouts, within the idle one: the deadline on the socket moved on.
	idleAfterRequest := func(t *testing.T) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, _, _ := serveAndDial(t)
		br := bufio.NewReader(c)
		if status := ask(t, c, br); status != 200 {
			t.Fatalf("answered %d", status)
		}
		time.Sleep(2 * tm.Read)
		return c, br
	}

	t.Run("a trickled request after an idle wait", func(t *testing.T) {
		t.Parallel()
		c, br := idleAfterRequest(t)
		trickle(t, c, br)
	})

	t.Run("a busy keep-alive connection", func(t *testing.T) {
		t.Parallel()
		c, _, _ := serveAndDial(t)
		br := bufio.NewReader(c)
		for start := time.Now(); time.Since(start) < 4*tm.Read; time.Sleep(10 * time.Millisecond) {
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
			t.Fatalf("after %v idle: answered %d, want 200", 2*tm.Read, status)
		}
		closedWithin(t, br, "an idle connection")
		if d := time.Since(start); d < tm.Idle-50*time.Millisecond {
			t.Errorf("closed %v after the last request, before the idle timeout %v", d, tm.Idle)
		}
	})

	t.Run("an answer nobody reads", func(t *testing.T) {
		t.Parallel()
		c, l, _ := serveAndDial(t)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4 << 10)
		}
		start := time.Now()
		if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the server accepting the connection", func() bool { return l.open() == 1 })
		// The answer fills the socket's buffers within moments; the server
		// gives up on it a read and a write timeout after the request's
		// first byte, which came after start: seen from here, never sooner.
		deadline := start.Add(tm.Read + tm.Write + 5*time.Second)
		for l.open() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("still open %v after the request", time.Since(start))
			}
			time.Sleep(10 * time.Millisecond)
		}
		if d := time.Since(start); d < tm.Read+tm.Write {
			t.Errorf("closed after %v, before its read and write timeouts", d)
		}
	})
}

// get sends a request on c and reads its answer, which must be 200.
func get(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, r.Body)
	if r.StatusCode != 200 {
		t.Fatalf("answered %d, want 200", r.StatusCode)
	}
}

// TestCloseSilent: a shutdown closes at once the connections that never
// sent a byte, and those accepted after it began; a connection that sent
// a request is left to the server to finish.
func TestCloseSilent(t *testing.T) {
	l := testServer(t, loopback(t), longTimeouts, ok)
	silent := dial(t, l)
	spoke := dial(t, l)
	br := bufio.NewReader(spoke)
	if _, err := io.WriteString(spoke, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	get(t, spoke, br)
	waitFor(t, "one silent and one spoken connection", func() bool {
		s, k := l.Open()
		return s == 1 && k == 1
	})
	l.CloseSilent()
	closedWithin(t, silent, "the silent connection")
	late := dial(t, l)
	closedWithin(t, late, "a connection accepted after the shutdown began")
	// The one that spoke is still served.
	get(t, spoke, br)
	if s, k := l.Open(); s != 0 || k != 1 {
		t.Errorf("Open() = %d silent, %d spoke; want 0, 1", s, k)
	}
}

// TestAcceptedCounted: each accepted connection counts once, whatever the
// number of its requests.
func TestAcceptedCounted(t *testing.T) {
	l := testServer(t, loopback(t), longTimeouts, ok)
	for range 3 {
		c := dial(t, l)
		br := bufio.NewReader(c)
		for range 4 {
			get(t, c, br)
		}
	}
	if got := testutil.ToFloat64(l.cfg.Metrics.Accepted); got != 3 {
		t.Errorf("accepted %v connections, want 3", got)
	}
}

// countingListener counts the reads that returned bytes and the writes on
// the connections it accepts: each is at least one system call. A read
// counts once it returns, so a read waiting for the next request does
// not.
type countingListener struct {
	net.Listener
	reads, writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, l: l}, nil
}

type countingConn struct {
	net.Conn
	l *countingListener
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.l.reads.Add(1)
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.l.writes.Add(1)
	return c.Conn.Write(p)
}

// TestOneSocketReadPerRequest: a keep-alive connection's request that
// comes at once, as a proxy sends it, is read from the socket with one
// read and answered with one write. fasthttp, waiting for a request with
// ReduceMemoryUsage, reads its first byte alone; Conn reads ahead, so
// that this costs no second read.
func TestOneSocketReadPerRequest(t *testing.T) {
	counted := &countingListener{Listener: loopback(t)}
	l := testServer(t, counted, longTimeouts, ok)
	c := dial(t, l)
	br := bufio.NewReader(c)
	// A subrequest as nginx sends it, headers and all, in one write.
	req := "HEAD /auth HTTP/1.1\r\nHost: authlimit\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Method: GET\r\n" +
		"X-Forwarded-Uri: /index.html\r\nX-Forwarded-Host: example.com\r\nX-Forwarded-Proto: http\r\n" +
		"User-Agent: " + strings.Repeat("u", 200) + "\r\n\r\n"
	ask := func() {
		t.Helper()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		r, err := http.ReadResponse(br, &http.Request{Method: "HEAD"})
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("status %d, want 200", r.StatusCode)
		}
	}
	ask()
	const n = 50
	reads, writes := counted.reads.Load(), counted.writes.Load()
	for range n {
		ask()
	}
	if got := counted.reads.Load() - reads; got != n {
		t.Errorf("%d socket reads for %d requests, want one each", got, n)
	}
	if got := counted.writes.Load() - writes; got != n {
		t.Errorf("%d socket writes for %d answers, want one each", got, n)
	}
}

const request = "GET /auth HTTP/1.1\r\nHost: authlimit\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n"

// TestReadAheadKeepsRequestsWhole: whatever Conn reads ahead reaches
// fasthttp whole and in order: a header block larger than the read-ahead
// buffer, two requests in one write, a request in two writes.
func TestReadAheadKeepsRequestsWhole(t *testing.T) {
	cookie := strings.Repeat("c", 3*aheadSize)
	l := testServer(t, loopback(t), longTimeouts, func(ctx *fasthttp.RequestCtx) {
		// The whole header block came: the big one's cookie is whole.
		if c := ctx.Request.Header.Cookie("c"); len(c) > 0 && string(c) != cookie {
			ctx.Error("cookie cut", 500)
		}
	})
	big := "GET /auth HTTP/1.1\r\nHost: authlimit\r\nCookie: c=" + cookie + "\r\n\r\n"
	tests := []struct {
		name   string
		writes []string
		n      int // answers
	}{
		{"larger than the read-ahead buffer", []string{big}, 1},
		{"two requests in one write", []string{request + request}, 2},
		{"one request in two writes", []string{request[:1], request[1:]}, 1},
		{"a large one behind a small one", []string{request + big}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, l)
			for _, w := range tc.writes {
				if _, err := io.WriteString(c, w); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond) // let the server read the pieces apart
			}
			br := bufio.NewReader(c)
			for i := range tc.n {
				r, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("answer %d: %v", i+1, err)
				}
				_, _ = io.Copy(io.Discard, r.Body)
				if r.StatusCode != 200 {
					t.Fatalf("answer %d: status %d, want 200", i+1, r.StatusCode)
				}
			}
		})
	}
}

// TestLingeringClose: an answer to a request that was not read whole, as
// fasthttp's own answers (408, 400, 431) are, and after which the
// connection closes, reaches its client whole although the client sent
// more meanwhile. A socket closed with bytes unread is reset by its
// kernel, which throws away what it had not sent yet of the answer; the
// connection lingers instead, its write side shut, reading what comes,
// and closes once the client has closed (or after lingerTime).
func TestLingeringClose(t *testing.T) {
	tm := Timeouts{Read: 5 * time.Second, Write: 5 * time.Second, Idle: 10 * time.Second}
	// Larger than the kernel's largest send buffer: the answer is still
	// being sent when the server closes. The handler does not call
	// Whole, as fasthttp's own answers do not.
	body := strings.Repeat("x", 16<<20)
	l := serveWith(t, loopback(t), tm, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(body) }, false)
	// A small receive buffer: the answer drains slowly, so that much of
	// it waits in the server's send buffer when the server closes.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<10)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	if _, err := br.Peek(1); err != nil {
		t.Fatalf("no answer: %v", err)
	}
	// The server is writing the answer: what comes now stays unread.
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	// Read nothing for a while: the server writes what its send buffer
	// takes, then closes with the rest of the answer still to send.
	time.Sleep(100 * time.Millisecond)
	r, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil || n != int64(len(body)) {
		t.Fatalf("read %d of the answer's %d bytes, then %v: the connection was reset", n, len(body), err)
	}
	start := time.Now()
	closedWithin(t, br, "a connection that answered with Connection: close")
	if d := time.Since(start); d > 2*lingerTime+time.Second {
		t.Errorf("closed %v after the answer, want within the lingering time, %v", d, lingerTime)
	}
}
