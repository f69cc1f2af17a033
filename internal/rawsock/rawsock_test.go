package rawsock

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection, closed when t
// ends.
func tcpPair(t *testing.T) (nc, peer net.Conn) {
	t.Helper()
	return socketPair(t, "tcp", "127.0.0.1:0")
}

// socketPair returns both ends of a connection to a listener on network
// and address, closed when t ends.
func socketPair(t *testing.T, network, address string) (nc, peer net.Conn) {
	t.Helper()
	l, err := net.Listen(network, address)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	nc, err = net.Dial(network, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	peer = <-accepted
	if peer == nil {
		t.Fatal("no connection accepted")
	}
	t.Cleanup(func() { _ = peer.Close() })
	return nc, peer
}

// TestWriteTakesWhatFits: on a socket whose peer does not read, Write
// returns at once with part of a block larger than both sockets' buffers,
// no error, and the bytes it wrote arrive whole and in order.
func TestWriteTakesWhatFits(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no write without waiting here")
	}
	nc, peer := tcpPair(t)
	w := New(nc)
	if w == nil {
		t.Fatal("New returned nil for a TCP connection")
	}
	// More than the two sockets' buffers hold (Linux grows each to a few
	// MiB at most).
	block := make([]byte, 32<<20)
	for i := range block {
		block[i] = byte(i % 251)
	}
	start := time.Now()
	n, err := w.Write(block)
	if err != nil {
		t.Fatalf("Write = %d, %v; want no error for a full socket", n, err)
	}
	if n == 0 || n == len(block) {
		t.Fatalf("the socket took %d of %d bytes at once: want some, not all", n, len(block))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Write took %v: it waited for the peer", d)
	}
	got := make([]byte, n)
	_ = peer.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, block[:n]) {
		t.Error("the bytes that arrived are not the block's first ones")
	}
}

// TestNoSocket: a connection with no descriptor of its own gets no
// Writer, and a nil Writer writes nothing.
func TestNoSocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	w := New(a)
	if w != nil {
		t.Fatal("New returned a Writer for an in-memory pipe")
	}
	if n, err := w.Write([]byte("x")); n != 0 || err != nil {
		t.Errorf("a nil Writer's Write = %d, %v; want 0, nil", n, err)
	}
}

// TestWriteAfterClose: an error other than a full socket is returned.
func TestWriteAfterClose(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no write without waiting here")
	}
	nc, peer := tcpPair(t)
	_ = peer.Close()
	w := New(nc)
	_ = nc.Close()
	if _, err := w.Write([]byte("x")); err == nil {
		t.Error("Write on a closed connection returned no error")
	}
}

// TestWrapNoSocket: a connection with no socket of its own is returned
// as it is.
func TestWrapNoSocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if c := Wrap(a); c != a {
		t.Errorf("Wrap of an in-memory pipe returned %T, not the pipe", c)
	}
}

// ownReadWrite is a connection with Read and Write of its own over a
// socket's.
type ownReadWrite struct{ *net.TCPConn }

func (c ownReadWrite) Read(b []byte) (int, error)  { return c.TCPConn.Read(b) }
func (c ownReadWrite) Write(b []byte) (int, error) { return c.TCPConn.Write(b) }

// TestWrapOthers: a connection that wraps a socket's, with Read and Write
// of its own, is returned as it is: its own are not bypassed.
func TestWrapOthers(t *testing.T) {
	nc, _ := tcpPair(t)
	own := ownReadWrite{nc.(*net.TCPConn)}
	if c := Wrap(own); c != net.Conn(own) {
		t.Errorf("Wrap of a connection with its own Read and Write returned %T", c)
	}
}
