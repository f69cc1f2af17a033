package redistest

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestSilent: a dial to Silent's address succeeds, and a read on it gets
// nothing until its deadline.
func TestSilent(t *testing.T) {
	addr := Silent(t)
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := c.Read(make([]byte, 16))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read from a silent server = %d bytes, %v; want nothing until the deadline", n, err)
	}
}
