package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

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
// ReduceMemoryUsage, reads its first byte alone; conn reads ahead, so
// that this costs no second read.
func TestOneSocketReadPerRequest(t *testing.T) {
	a, s := newTestApp(t, map[string]string{"AUTHLIMIT_RULES": "name=r limit=1000000/1m"})
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingListener{Listener: tcp}
	l := a.listener(counted, s)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.serve(ctx, l, time.Second) }()
	t.Cleanup(func() { cancel(); <-served })

	c, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
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
		if r.StatusCode != 200 || r.Header.Get("X-RateLimit-Remaining") == "" {
			t.Fatalf("status %d, X-RateLimit-Remaining %q; want 200 with the header", r.StatusCode, r.Header.Get("X-RateLimit-Remaining"))
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

// TestReadAheadKeepsRequestsWhole: whatever conn reads ahead reaches
// fasthttp whole and in order: a header block larger than the read-ahead
// buffer, two requests in one write, a request in two writes.
func TestReadAheadKeepsRequestsWhole(t *testing.T) {
	a, s := newTestApp(t, map[string]string{"AUTHLIMIT_RULES": "name=r limit=1000000/1m"})
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := a.listener(tcp, s)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.serve(ctx, l, time.Second) }()
	t.Cleanup(func() { cancel(); <-served })

	big := "GET /auth HTTP/1.1\r\nHost: authlimit\r\nX-Forwarded-For: 203.0.113.8\r\nCookie: " + strings.Repeat("c", 3*aheadSize) + "\r\n\r\n"
	tests := []struct {
		name   string
		writes []string
		n      int // answers
	}{
		{"larger than the read-ahead buffer", []string{big}, 1},
		{"two requests in one write", []string{authRequest + authRequest}, 2},
		{"one request in two writes", []string{authRequest[:1], authRequest[1:]}, 1},
		{"a large one behind a small one", []string{authRequest + big}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", tcp.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
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
