//go:build !unix

package spoa

import (
	"net"
	"syscall"
)

// rawWriter returns nil: elsewhere than on Unix every answer is written by
// a goroutine of the connection's (see flushLocked).
func rawWriter(*conn, net.Conn) (syscall.RawConn, func(fd uintptr) bool) { return nil, nil }
