// Package acceptwait decides what a server's accept loop does after a
// failed accept: give up, or wait and accept again, the wait doubling
// from 5 ms up to 1 s. authlimit's HTTP and gRPC listeners share it, so
// that running out of file descriptors pauses both alike rather than
// ending either.
package acceptwait

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// The waits after a failed accept: doubling from the first to the longest.
const (
	First   = 5 * time.Millisecond
	Longest = time.Second
)

// Retryable reports whether a failed accept may succeed later: the
// process or the system is out of file descriptors or memory, or a
// connection went away before it was accepted. A closed listener's error
// is not.
func Retryable(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Next is the wait after one of wait (0 before the first failure).
func Next(wait time.Duration) time.Duration {
	return min(max(2*wait, First), Longest)
}
