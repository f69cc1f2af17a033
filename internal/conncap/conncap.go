// Package conncap is a cap on open connections that several listeners
// share, so that together they never hold more than the file descriptors
// set aside for connections: a flood on one port cannot take the
// descriptors the other port's connections and the store need.
package conncap

import "sync/atomic"

// Cap counts open connections against a maximum. A nil *Cap takes every
// connection.
type Cap struct {
	max      int64
	open     atomic.Int64
	rejected func() // called for each connection refused; may be nil
}

// New returns a cap of max connections (max ≤ 0: no cap, and New returns
// nil). rejected, if not nil, is called for every connection Take refuses.
func New(max int, rejected func()) *Cap {
	if max <= 0 {
		return nil
	}
	return &Cap{max: int64(max), rejected: rejected}
}

// Take reserves a place for a new connection, and reports whether there
// was one. Every Take that returned true is followed by one Give.
func (c *Cap) Take() bool {
	if c == nil {
		return true
	}
	if c.open.Add(1) > c.max {
		c.open.Add(-1)
		if c.rejected != nil {
			c.rejected()
		}
		return false
	}
	return true
}

// Give frees the place of a connection that closed.
func (c *Cap) Give() {
	if c != nil {
		c.open.Add(-1)
	}
}

// Open is the number of places taken.
func (c *Cap) Open() int {
	if c == nil {
		return 0
	}
	return int(c.open.Load())
}
