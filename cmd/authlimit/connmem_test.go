package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"
)

// memInUse is the heap in use after a full collection, plus goroutine
// stacks: what a connection's buffers and its serving goroutine hold.
func memInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}

// maxBytesPerIdleConn bounds what an idle connection costs authlimit, the
// client's end of it in this test included. README's Resource limits gives
// the figure measured.
const maxBytesPerIdleConn = 16 << 10

// TestIdleConnectionMemory: connections that wait, silent or between
// keep-alive requests, hold no read buffer sized for the largest header
// block: buffers are taken when a request's bytes come and given back once
// it is answered. With AUTHLIMIT_MAX_HEADER_BYTES at its 32 KiB default,
// each held about 41 KB.
func TestIdleConnectionMemory(t *testing.T) {
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

	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	dial := func(request bool) {
		t.Helper()
		c, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if !request {
			return
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, authRequest); err != nil {
			t.Fatal(err)
		}
		r, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		if r.StatusCode != 200 {
			t.Fatalf("status %d, want 200", r.StatusCode)
		}
	}
	dial(true) // the server's pools and first buffers
	before := memInUse()
	const n = 1000
	for i := range n {
		dial(i%2 == 0) // half keep-alive after a request, half silent
	}
	waitFor(t, "every connection accepted", func() bool {
		silent, spoke := l.Open()
		return silent+spoke == n+1
	})
	after := memInUse()
	per := (int64(after) - int64(before)) / n
	t.Logf("%d idle connections: %d bytes each (heap and stacks, both ends)", n, per)
	if per > maxBytesPerIdleConn*raceFactor {
		t.Errorf("an idle connection costs %d bytes, more than %d", per, maxBytesPerIdleConn*raceFactor)
	}
	// Once they close, what they held is free again.
	for _, c := range conns[1:] {
		_ = c.Close()
	}
	conns = conns[:1]
	waitFor(t, "every closed connection gone", func() bool {
		silent, spoke := l.Open()
		return silent+spoke == 1
	})
	// A few hundred bytes a connection is noise: the heap's other users
	// (timers, the metrics, the runtime) move that much between two
	// collections on a busy machine. What must go is the ~8 KB a
	// connection holds, and never the ~41 KB its buffers once took.
	const freed = 4 << 10
	var left int64
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Serving goroutines end a moment after their connections.
		left = (int64(memInUse()) - int64(before)) / n
		if left <= freed*raceFactor || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if left > freed*raceFactor {
		t.Errorf("after the connections closed, %d bytes each are still held", left)
	}
}
