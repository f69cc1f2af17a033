//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd || solaris || illumos

package spoa

import (
	"errors"
	"net"
	"syscall"
)

// nowWriter writes to a socket what it takes at once, without waiting
// for it to take more. One goroutine at a time uses it (the one writing,
// see conn.flushing); it allocates nothing once made.
type nowWriter struct {
	rc  syscall.RawConn
	fn  func(fd uintptr) bool // write, made once
	b   []byte
	n   int
	err error
}

// newNowWriter returns a nowWriter for nc, or nil if nc is not a socket:
// then the writer that may wait writes everything.
func newNowWriter(nc net.Conn) *nowWriter {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &nowWriter{rc: rc}
	w.fn = w.write
	return w
}

// writeNow writes what of b the socket takes at once: the bytes written,
// and an error that is not the socket being full.
func (w *nowWriter) writeNow(b []byte) (int, error) {
	w.b, w.n, w.err = b, 0, nil
	if err := w.rc.Write(w.fn); err != nil {
		w.err = err
	}
	n, err := w.n, w.err
	w.b, w.err = nil, nil
	return n, err
}

func (w *nowWriter) write(fd uintptr) bool {
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
