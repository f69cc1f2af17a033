//go:build !unix

package rawsock

import "net"

// New returns nil: elsewhere than on Unix a socket cannot be written
// without waiting, and its writer that may wait writes everything.
func New(any) *Writer { return nil }

// Wrap returns nc: elsewhere than on Unix its own Read and Write serve.
func Wrap(nc net.Conn) net.Conn { return nc }
