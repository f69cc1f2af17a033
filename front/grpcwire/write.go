package grpcwire

import (
	"errors"
	"time"
)

// Writing. Frames are appended to c.sh.wbuf under c.mu by whoever has
// them: the reader (acknowledgements, resets, window updates), a handler
// (its answer), whoever completes an asynchronous call. Then one of them
// writes: flushLocked takes the whole buffer, releases c.mu and writes it
// in one write, while the others append to a fresh buffer (c.sh.spare)
// and leave it to the one writing (c.sh.flushing), which writes again
// until nothing is left. So the answers of every call ready at that
// moment go out in one system call, and no goroutine waits for another's
// write but the one that writes.

// queueLocked adds out to what s sends, sends what the windows allow, and
// keeps the rest for a WINDOW_UPDATE.
func (c *conn) queueLocked(s *stream, out *[]byte) {
	if s.sh.out == nil {
		s.sh.out, s.sh.outOff = out, 0
	} else {
		*s.sh.out = append((*s.sh.out)[s.sh.outOff:], *out...)
		s.sh.outOff = 0
		putBuf(out)
	}
	if !c.pushLocked(s) {
		shrinkLocked(s)
		if len(c.sh.blocked) == 0 {
			c.sh.blockedAt = time.Now()
		}
		for _, b := range c.sh.blocked {
			if b == s {
				return
			}
		}
		c.sh.blocked = append(c.sh.blocked, s)
	}
}

// shrinkLocked keeps what waits of s's answer in a buffer of its size,
// and gives the pooled one back: a client that never opens its window may
// leave every one of its streams waiting, and each would hold a pooled
// buffer many times its answer's size.
func shrinkLocked(s *stream) {
	rest := (*s.sh.out)[s.sh.outOff:]
	if cap(*s.sh.out) <= 2*len(rest)+256 {
		return
	}
	b := make([]byte, len(rest))
	copy(b, rest)
	putBuf(s.sh.out)
	s.sh.out, s.sh.outOff = &b, 0
}

// pushLocked sends what the windows allow of s's waiting bytes, then its
// trailers if it has them (or the last DATA frame ends the stream, when
// s.sh.endData); it reports whether nothing waits.
func (c *conn) pushLocked(s *stream) bool {
	if s.sh.reset {
		return true
	}
	for s.sh.out != nil && s.sh.outOff < len(*s.sh.out) {
		n := min(int64(len(*s.sh.out)-s.sh.outOff), int64(c.sh.maxFrame), c.sh.sendWindow, s.sh.sendWindow)
		if n <= 0 {
			return false
		}
		var flags byte
		if s.sh.endData && s.sh.outOff+int(n) == len(*s.sh.out) {
			flags = flagEndStream
		}
		c.sh.wbuf = appendFrameHeader(c.sh.wbuf, int(n), frameData, flags, s.id)
		c.sh.wbuf = append(c.sh.wbuf, (*s.sh.out)[s.sh.outOff:s.sh.outOff+int(n)]...)
		s.sh.outOff += int(n)
		c.sh.sendWindow -= n
		s.sh.sendWindow -= n
	}
	if s.sh.out != nil {
		putBuf(s.sh.out)
		s.sh.out = nil
	}
	if s.sh.trailers != nil {
		c.sh.wbuf = appendHeaderBlock(c.sh.wbuf, s.id, s.sh.trailers, true, c.sh.maxFrame)
		s.sh.trailers = nil
	} else if !s.sh.endData {
		return true
	}
	s.sh.endData = false
	delete(c.sh.streams, s.id)
	c.finishLocked(s)
	return true
}

// pushBlockedLocked sends what the windows now allow of the blocked
// streams.
func (c *conn) pushBlockedLocked() {
	kept := c.sh.blocked[:0]
	for _, s := range c.sh.blocked {
		if !c.pushLocked(s) {
			kept = append(kept, s)
		}
	}
	clear(c.sh.blocked[len(kept):])
	if len(kept) > 0 && len(kept) < len(c.sh.blocked) {
		c.sh.blockedAt = time.Now()
	}
	c.sh.blocked = kept
}

// flushLocked writes what is queued, unless another goroutine is writing
// (which then writes this too). c.mu is held on entry and on return; it is
// released while the socket is written or closed, as sync.Cond's Wait
// releases it, so the caller must not rely on what it read under c.mu
// before. Once the connection is closing and nothing is left to write or
// to answer, it half-closes the socket, which ends the reader.
func (c *conn) flushLocked() {
	sh := &c.sh
	if sh.closed {
		return
	}
	if sh.flushing {
		c.chargeBacklogLocked()
		return
	}
	sh.flushing = true
	for len(sh.wbuf) > 0 && !sh.closed {
		b, charged := sh.wbuf, sh.wcharged
		sh.wbuf, sh.queued, sh.wcharged = sh.spare[:0], 0, 0
		sh.writing = len(b)
		c.mu.Unlock()
		err := c.writeDeadline()
		if err == nil {
			_, err = c.nc.Write(b)
		}
		c.hold.Give(charged)
		c.mu.Lock()
		sh.writing = 0
		if sh.backlogWait {
			sh.flushed.Broadcast()
		}
		if cap(b) <= keptBuf {
			sh.spare = b[:0]
		} else {
			sh.spare = nil
		}
		if err != nil {
			sh.flushing = false
			sh.flushed.Broadcast()
			if c.closeLocked() {
				c.mu.Unlock()
				_ = c.nc.Close()
				c.mu.Lock()
			}
			return
		}
	}
	sh.flushing = false
	sh.flushed.Broadcast()
	if sh.closing && sh.active == 0 && !sh.closed && !sh.halfClosed {
		sh.halfClosed = true
		// The reader, woken by the deadline, half-closes and drains.
		c.mu.Unlock()
		if tc, ok := c.nc.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		_ = c.nc.SetReadDeadline(time.Now().Add(drainTime))
		c.mu.Lock()
	}
}

// maxBacklog is the most bytes of answers and control frames a
// connection may have waiting to be written, the write under way
// included, before its reader stops reading its client (see
// waitBacklog).
const maxBacklog = 256 << 10

// errSlowReader ends a connection whose client has not read its answers
// down to maxBacklog within WriteTimeout.
var errSlowReader = errors.New("the client reads its answers too slowly")

// waitBacklog holds the reader while more than maxBacklog bytes wait to
// be written (on the reader): a client that does not read its answers
// is not read either, so it cannot make the server queue more for it,
// whatever the budget has left. x/net's server bounds the same thing
// otherwise: a handler's write waits until its frame is written, and
// too many control frames waiting end the connection. Here an answer is
// queued and its handler freed at once (a worker, or a store's batch,
// must not wait for one client), so the bound is the connection's. The
// socket's write deadline ends a write that makes no progress; a client
// that reads, but too slowly to bring the backlog down within
// WriteTimeout, is cut off as well.
func (c *conn) waitBacklog() error {
	if !c.over.Load() {
		return nil
	}
	sh := &c.sh
	c.mu.Lock()
	defer c.mu.Unlock()
	if sh.writing+len(sh.wbuf) <= maxBacklog {
		c.over.Store(false)
		return nil
	}
	deadline := time.Now().Add(c.srv.opts.WriteTimeout)
	wake := time.AfterFunc(c.srv.opts.WriteTimeout, func() {
		c.mu.Lock()
		c.sh.flushed.Broadcast()
		c.mu.Unlock()
	})
	defer wake.Stop()
	sh.backlogWait = true
	defer func() { sh.backlogWait = false }()
	for sh.writing+len(sh.wbuf) > maxBacklog && !sh.closed {
		if !time.Now().Before(deadline) {
			c.srv.opts.Log.Debug("grpc connection cut off: its client does not read its answers", "remote", c.nc.RemoteAddr().String(), "backlog", sh.writing+len(sh.wbuf))
			if c.closeLocked() {
				c.mu.Unlock()
				_ = c.nc.Close()
				c.mu.Lock()
			}
			return errSlowReader
		}
		sh.flushed.Wait()
	}
	c.over.Store(false)
	return nil
}

// backlogFree is the part of the bytes queued behind a write under way
// that the memory budget does not count: a connection's own buffer,
// which Options.MaxConns bounds.
const backlogFree = keptBuf

// chargeBacklogLocked counts in the memory budget what is queued behind
// the write under way beyond backlogFree: answers, acknowledgements and
// resets that the client has not read yet. A client that makes calls and
// never reads their answers would otherwise make the server hold them
// all, unbounded, until the write timeout; counted, they are bounded with
// every other port's requests, and the connection holding the most is
// the one cut off when room runs out, as x/net's and grpc-go's servers
// end a client that does not read what they queue.
func (c *conn) chargeBacklogLocked() {
	sh := &c.sh
	if sh.writing+len(sh.wbuf) > maxBacklog {
		c.over.Store(true)
	}
	want := int64(max(cap(sh.wbuf)-backlogFree, 0))
	if want <= sh.wcharged {
		return
	}
	if !c.hold.Take(want - sh.wcharged) {
		c.cutOffLocked()
		return
	}
	sh.wcharged = want
}

// cutOffLocked ends a connection whose backlog found no room in the
// budget: it is dropped, and the socket closed, which ends the write
// under way. c.mu is released while the socket closes.
func (c *conn) cutOffLocked() {
	c.srv.opts.Log.Debug("grpc connection cut off: its client does not read its answers", "remote", c.nc.RemoteAddr().String(), "backlog", len(c.sh.wbuf))
	c.sh.wbuf = nil
	c.hold.Give(c.sh.wcharged)
	c.sh.wcharged = 0
	if c.closeLocked() {
		c.mu.Unlock()
		_ = c.nc.Close()
		c.mu.Lock()
	}
}

// writeDeadline gives the next write at least half of WriteTimeout, and
// at most all of it: the socket's deadline is moved only when less than
// half is left, not on every write (called by the one writing, whose
// c.sh.flushing keeps c.sh.wdl its own).
func (c *conn) writeDeadline() error {
	now, t := time.Now(), c.srv.opts.WriteTimeout
	if c.sh.wdl.Sub(now) >= t/2 {
		return nil
	}
	c.sh.wdl = now.Add(t)
	return c.nc.SetWriteDeadline(c.sh.wdl)
}

// The raw write path.
//
// An asynchronous call (UnaryRawAsync) is answered by whoever completed
// its decision: a store's batch goroutine answers tens of calls of many
// connections in a row. Writing each answer with nc.Write would make that
// goroutine wait for any one client's full socket (nc.Write parks the
// goroutine until the socket takes every byte or the write deadline
// passes), and every other call of the batch behind it. Handing every
// answer to a goroutine of its own to write instead costs a goroutine
// switch per call, which is most of a small call's cost (see the package
// doc's figures).
//
// So flushFor writes an asynchronous call's answer with non-blocking
// writes on the socket's file descriptor (package rawsock), which never
// wait for the socket to become writable. What the socket takes is gone;
// what it does not (it is full) is left in c.sh.wbuf for a goroutine of
// its own, which writes it as flushLocked does, waiting. The write happens
// under c.mu, so no other write can interleave: c.sh.flushing is false (no
// one is writing), and the bytes written are the head of c.sh.wbuf. A
// connection without a descriptor (TLS, an in-memory pipe) has no raw
// path: see flushFor.

// flushFor writes what is queued, as flushLocked does, after stream s's
// answer was queued; c.mu is held on entry and on return. An
// asynchronous call's answer is written by whoever completed its
// decision, which may answer many calls of many connections in turn: it
// must not wait for one client's socket. It writes what the socket takes
// at once (see the raw write path above), and leaves the rest, if any,
// to a goroutine of its own, which waits as flushLocked does.
func (c *conn) flushFor(s *stream) {
	sh := &c.sh
	if !s.async || c.raw == nil || sh.flushing || sh.closed || len(sh.wbuf) == 0 {
		c.flushLocked()
		return
	}
	n, err := c.raw.Write(sh.wbuf)
	sh.wbuf = sh.wbuf[:copy(sh.wbuf, sh.wbuf[n:])]
	if err != nil {
		c.flushLocked() // it writes what is left, and meets the error
		return
	}
	sh.queued = 0
	if len(sh.wbuf) == 0 {
		c.flushLocked() // nothing left to write: whatever ends the connection
		return
	}
	sh.flushing = true
	go c.flushLater()
}

// flushLater writes what flushFor left, on a goroutine of its own.
func (c *conn) flushLater() {
	c.mu.Lock()
	c.sh.flushing = false
	c.flushLocked()
	c.mu.Unlock()
}
