// Package rawsock writes to a socket what it takes at once, never waiting
// for it to take more.
//
// A goroutine that completes a decision for another connection's client
// (a relay answering a batch's calls) must not wait on one client's
// socket, and handing each answer to a goroutine of its own costs a
// goroutine switch per answer. Go keeps every socket non-blocking, and
// syscall.RawConn.Write runs a function with the socket's descriptor while
// holding it open: a function that writes until the socket is full and
// returns true writes what the socket takes without ever waiting, and
// leaves the rest to a writer that may wait.
package rawsock

import "syscall"

// Writer writes what a socket takes at once. One goroutine at a time uses
// it; it allocates nothing once made. A nil *Writer (see New) writes
// nothing.
type Writer struct {
	raw syscall.RawConn
	fn  func(fd uintptr) bool // write, bound once: a closure per call would allocate
	b   []byte
	n   int
	err error
}

// Write writes what of b the socket takes at once. It returns how many
// bytes it wrote, and an error other than the socket being full.
func (w *Writer) Write(b []byte) (int, error) {
	if w == nil {
		return 0, nil
	}
	w.b, w.n, w.err = b, 0, nil
	if err := w.raw.Write(w.fn); err != nil {
		w.err = err
	}
	n, err := w.n, w.err
	w.b, w.err = nil, nil
	return n, err
}
