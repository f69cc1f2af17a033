//go:build !unix

package grpcwire

import "syscall"

// rawWriter returns nil: elsewhere than on Unix an asynchronous call's
// answer is written as any other (flushFor falls back to flushLocked), so
// its writer may wait for a slow client's socket.
func rawWriter(*rawWrite, any) (syscall.RawConn, func(fd uintptr) bool) { return nil, nil }
