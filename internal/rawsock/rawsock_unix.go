//go:build unix

package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
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

// write writes w.b to fd until it is all written or the socket is full,
// whose rest is for the writer that waits.
func (w *Writer) write(fd uintptr) bool {
	_, w.err = writeUntilFull(fd, w.b, &w.n)
	return true
}

// writeUntilFull writes b[*n:] to fd, adding what it wrote to *n, until
// all of b is written or the socket is full (full); its error is one
// other than a full socket.
func writeUntilFull(fd uintptr, b []byte, n *int) (full bool, err error) {
	for *n < len(b) {
		m, e := rawWrite(fd, b[*n:])
		switch e {
		case 0:
			*n += m
		case syscall.EINTR:
		case syscall.EAGAIN:
			return true, nil
		default:
			return false, os.NewSyscallError("write", e)
		}
	}
	return false, nil
}

// Conn is a connection whose Read and Write make raw system calls (see
// the package's doc), waiting for the socket in the network poller as
// the connection's own would, deadlines included. Its other methods are
// the connection's. Reads are one at a time, and so are writes, as with
// the connection's own.
type Conn struct {
	net.Conn
	raw syscall.RawConn

	rmu sync.Mutex
	r   op
	wmu sync.Mutex
	w   op
}

// op is one Read's or Write's state, for its function, which is bound
// once: a closure per call would allocate.
type op struct {
	fn  func(fd uintptr) bool
	b   []byte
	n   int
	err error
}

// Wrap returns nc as a Conn if it is a TCP or Unix socket's own
// connection; any other (TLS, an in-memory pipe, a connection that wraps
// a socket's with Read and Write of its own) as it is.
func Wrap(nc net.Conn) net.Conn {
	var sc syscall.Conn
	switch c := nc.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return nc
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nc
	}
	c := &Conn{Conn: nc, raw: raw}
	c.r.fn, c.w.fn = c.read, c.write
	return c
}

// SyscallConn is the connection's own, for New and whoever else looks at
// the socket.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

// CloseWrite shuts the connection's writing side, if it has one to shut.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// Read reads as the connection's Read does.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.r.b, c.r.n, c.r.err = b, 0, nil
	err := c.raw.Read(c.r.fn)
	n := c.r.n
	if err == nil {
		err = c.r.err
	}
	c.r.b, c.r.err = nil, nil
	return n, c.wrap("read", err)
}

// read reads once into c.r.b, or reports false if nothing waits.
func (c *Conn) read(fd uintptr) bool {
	for {
		n, e := rawRead(fd, c.r.b)
		switch e {
		case 0:
			c.r.n = n
			if n == 0 {
				c.r.err = io.EOF
			}
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.r.err = os.NewSyscallError("read", e)
			return true
		}
	}
}

// Write writes as the connection's Write does: all of b, or an error.
func (c *Conn) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.w.b, c.w.n, c.w.err = b, 0, nil
	err := c.raw.Write(c.w.fn)
	n := c.w.n
	if err == nil {
		err = c.w.err
	}
	c.w.b, c.w.err = nil, nil
	return n, c.wrap("write", err)
}

// write writes c.w.b until it is all written, or reports false when the
// socket is full.
func (c *Conn) write(fd uintptr) bool {
	full, err := writeUntilFull(fd, c.w.b, &c.w.n)
	c.w.err = err
	return !full
}

// wrap gives a system call's error the form the connection's own Read and
// Write give it (a *net.OpError); the poller's own errors (a deadline, a
// closed connection) come as RawConn gives them, a *net.OpError already,
// and io.EOF as it is.
func (c *Conn) wrap(op string, err error) error {
	if _, ok := err.(*os.SyscallError); !ok {
		return err
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
