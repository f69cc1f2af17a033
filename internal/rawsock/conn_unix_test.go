//go:build unix

package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/race"
)

// unixPair is tcpPair over a Unix socket.
func unixPair(t *testing.T) (nc, peer net.Conn) {
	t.Helper()
	return socketPair(t, "unix", t.TempDir()+"/s")
}

// TestConnBothWays: a wrapped connection carries blocks far larger than
// the socket's buffers both ways at once, every byte in order, its
// Write waiting for room and its Read for bytes, until the peer's end
// of stream, which reads as io.EOF; CloseWrite ends its own side while
// it still reads.
func TestConnBothWays(t *testing.T) {
	for name, pair := range map[string]func(*testing.T) (net.Conn, net.Conn){"tcp": tcpPair, "unix": unixPair} {
		t.Run(name, func(t *testing.T) {
			nc, peer := pair(t)
			c := Wrap(nc)
			if _, ok := c.(*Conn); !ok {
				t.Fatalf("Wrap returned %T for a %s connection", c, name)
			}
			out, in := make([]byte, 8<<20), make([]byte, 8<<20)
			for i := range out {
				out[i], in[i] = byte(i%251), byte(i%241)
			}
			errs := make(chan error, 4)
			// c → peer, and peer → c, at the same time.
			go func() {
				n, err := c.Write(out)
				if err == nil && n != len(out) {
					err = io.ErrShortWrite
				}
				if err == nil {
					err = c.(*Conn).CloseWrite()
				}
				errs <- err
			}()
			go func() {
				got, err := io.ReadAll(peer)
				if err == nil && !bytes.Equal(got, out) {
					err = io.ErrUnexpectedEOF
				}
				errs <- err
			}()
			go func() {
				_, err := peer.Write(in)
				if err == nil {
					err = peer.(interface{ CloseWrite() error }).CloseWrite()
				}
				errs <- err
			}()
			got := make([]byte, 0, len(in))
			buf := make([]byte, 1500)
			var err error
			for {
				var n int
				n, err = c.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					break
				}
			}
			if err != io.EOF {
				t.Errorf("Read at the peer's end of stream: %v; want io.EOF", err)
			}
			if !bytes.Equal(got, in) {
				t.Errorf("read %d bytes, not the %d the peer wrote, in order", len(got), len(in))
			}
			for range 3 {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestConnErrors: a wrapped connection's errors are the connection's
// own: a passed deadline is a timeout (os.ErrDeadlineExceeded, a
// net.Error whose Timeout is true) for Read and for a Write that waits
// for room; a closed connection is net.ErrClosed; a reset is a
// *net.OpError wrapping ECONNRESET.
func TestConnErrors(t *testing.T) {
	timeout := func(t *testing.T, what string, err error) {
		t.Helper()
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("%s past its deadline: %v; want a timeout", what, err)
		}
	}
	t.Run("read deadline", func(t *testing.T) {
		nc, _ := tcpPair(t)
		c := Wrap(nc)
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := c.Read(make([]byte, 10))
		if n != 0 {
			t.Errorf("read %d bytes from a silent peer", n)
		}
		timeout(t, "Read", err)
	})
	t.Run("write deadline", func(t *testing.T) {
		nc, _ := tcpPair(t)
		c := Wrap(nc)
		block := make([]byte, 64<<20)
		_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := c.Write(block)
		if n == 0 || n == 64<<20 {
			t.Errorf("wrote %d bytes to a peer that reads nothing: want some, not all", n)
		}
		timeout(t, "Write", err)
	})
	t.Run("closed", func(t *testing.T) {
		nc, _ := tcpPair(t)
		c := Wrap(nc)
		_ = c.Close()
		if _, err := c.Read(make([]byte, 10)); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Read after Close: %v; want net.ErrClosed", err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Write after Close: %v; want net.ErrClosed", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		nc, peer := tcpPair(t)
		c := Wrap(nc)
		// Closing with bytes unread resets the connection.
		if _, err := c.Write([]byte("unread")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		_ = peer.(*net.TCPConn).SetLinger(0)
		_ = peer.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 10))
		var oe *net.OpError
		if !errors.Is(err, syscall.ECONNRESET) || !errors.As(err, &oe) || oe.Op != "read" {
			t.Errorf("Read of a reset connection: %v; want a read *net.OpError wrapping ECONNRESET", err)
		}
	})
}

// TestConnAllocatesNothing: a read and a write allocate nothing.
func TestConnAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	nc, peer := tcpPair(t)
	c := Wrap(nc)
	p := Wrap(peer)
	msg, buf := []byte("ping"), make([]byte, 16)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per write and read; want 0", allocs)
	}
}
