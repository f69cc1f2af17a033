package redistest

import (
	"net"
	"sync"
	"testing"
)

// Silent listens on a free loopback port, accepts every connection and
// never reads or writes, as a Redis does whose event loop is stopped (the
// kernel accepts for it): a dial succeeds, and a TLS handshake or a
// command waits forever. It returns the address; the listener and the
// connections it accepted close when t ends.
func Silent(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: Silent: %v", err)
	}
	var (
		mu   sync.Mutex
		held []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}
