//go:build unix

package spoa

import (
	"net"
	"syscall"
)

// rawWriter returns nc's file descriptor and a write of c.tryBuf to it
// that never waits (Go keeps every socket non-blocking), or nil if nc has
// none: an answer completed on a store's goroutine is written there
// without that goroutine ever waiting on HAProxy's socket.
func rawWriter(c *conn, nc net.Conn) (syscall.RawConn, func(fd uintptr) bool) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, nil
	}
	return raw, func(fd uintptr) bool {
		c.tryN, c.tryErr = syscall.Write(int(fd), c.tryBuf)
		return true
	}
}
