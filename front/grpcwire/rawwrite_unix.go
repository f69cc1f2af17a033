//go:build unix

package grpcwire

import (
	"net"
	"syscall"
)

// rawWriter returns nc's file descriptor and a write of c.tryBuf to it
// that never waits (the descriptor is non-blocking, as Go keeps every
// socket's), or nil if nc has none.
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
