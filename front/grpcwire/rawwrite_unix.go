//go:build unix

package grpcwire

import "syscall"

// rawWriter returns nc's file descriptor and a write of w.buf to it that
// never waits (the descriptor is non-blocking, as Go keeps every
// socket's), or nil if nc has none. See "The raw write path" in write.go.
func rawWriter(w *rawWrite, nc any) (syscall.RawConn, func(fd uintptr) bool) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, nil
	}
	return raw, func(fd uintptr) bool {
		w.n, w.err = syscall.Write(int(fd), w.buf)
		return true
	}
}
