//go:build unix

package rawsock

import (
	"errors"
	"syscall"
)

// New returns a Writer for nc's socket, or nil if nc has none (TLS, an
// in-memory pipe): then its writer that may wait writes everything.
func New(nc any) *Writer {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &Writer{raw: raw}
	w.fn = w.write
	return w
}

// write writes w.b to fd until it is all written or the socket is full.
func (w *Writer) write(fd uintptr) bool {
	for w.n < len(w.b) {
		m, err := syscall.Write(int(fd), w.b[w.n:])
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			return true // full: the rest is for the writer that waits
		case err != nil:
			w.err = err
			return true
		}
		w.n += m
	}
	return true
}
