// Package rawsock reads and writes sockets with raw system calls: calls
// the Go scheduler is not told about (on Linux, without the race
// detector; elsewhere the syscall package's calls, which go through the C
// library, and under the race detector those that tell it a socket's
// write happens before its read).
//
// Go tells its scheduler of every system call a goroutine makes, and the
// first call after the process was idle (every goroutine parked) wakes
// the scheduler's monitor thread, which then polls every 20 µs until the
// process is idle again. At a few thousand decisions a second the process
// is idle between most of them, so each decision paid a wake-up of that
// thread and its polls: behind HAProxy's SPOE at 4 connections, 14 µs of
// the 67 µs of CPU authlimit spent per decision, and 0.7 of its 2.3
// context switches. A socket's read and write never wait (Go keeps every
// socket non-blocking), so nothing is lost by making them raw:
// syscall.RawConn still waits for the socket in the network poller when
// it has nothing to read or no room, and keeps the deadlines.
//
// Wrap makes a TCP or Unix connection whose Read and Write are raw: the
// decision listener's, the gRPC port's (under its TLS too), the SPOE
// agent's, and the Redis store's own connections to a Redis without TLS.
//
// Writer writes what a socket takes at once, never waiting for it to take
// more. A goroutine that completes a decision for another connection's
// client (a relay answering a batch's calls) must not wait on one
// client's socket, and handing each answer to a goroutine of its own
// costs a goroutine switch per answer: a function given to RawConn.Write
// that writes until the socket is full and returns true writes what the
// socket takes without ever waiting, and leaves the rest to a writer that
// may wait.
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
