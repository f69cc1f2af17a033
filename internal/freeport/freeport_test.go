package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestGet: ports are free, distinct, and below the ephemeral range, where
// no outgoing connection takes them as its source port.
func TestGet(t *testing.T) {
	hi := ephemeralLow()
	seen := map[int]bool{}
	for range 50 {
		port, err := Get()
		if err != nil {
			t.Fatal(err)
		}
		if seen[port] {
			t.Fatalf("port %d returned twice", port)
		}
		seen[port] = true
		if hi-lowest >= 1000 && (port < lowest || port >= hi) {
			t.Errorf("port %d is outside [%d, %d), below the ephemeral range", port, lowest, hi)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d is not free: %v", port, err)
		}
		_ = l.Close()
	}
}
