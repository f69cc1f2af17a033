package grpcwire

import (
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Flow control (RFC 9113, section 5.2): the windows the server gives, and
// those it keeps for what it sends.
const (
	// streamWindow is the window the server gives each stream; it is
	// returned as the stream's data is read.
	streamWindow = 1 << 20
	// connWindow is the connection's window; it is returned as the
	// requests are handed to their handlers, so that a connection holds
	// at most this much of unfinished requests.
	connWindow = 8 << 20
	// defaultWindow is every window's size before SETTINGS or
	// WINDOW_UPDATE (section 6.9.2).
	defaultWindow = 65535
	maxWindow     = 1<<31 - 1
)

// data takes a DATA frame (on the reader).
func (c *conn) data(f *http2.DataFrame) error {
	n := int(f.Length)
	c.rd.connRecv += n
	if c.rd.connRecv > connWindow {
		return connError{http2.ErrCodeFlowControl, "connection window exceeded"}
	}
	c.mu.Lock()
	s := c.sh.streams[f.StreamID]
	idle := f.StreamID > c.sh.maxStream
	late := c.sh.goingAway && f.StreamID > c.sh.lastStream
	c.mu.Unlock()
	if s == nil || s.rd.ended {
		c.release(n)
		switch {
		case idle:
			return connError{http2.ErrCodeProtocol, "DATA on an idle stream"}
		case s != nil:
			// Half-closed by the client, whose call runs.
			c.resetStream(f.StreamID, http2.ErrCodeStreamClosed)
		case late:
			// A stream opened after GOAWAY: ignored (section 6.8).
		default:
			// A stream closed: STREAM_CLOSED (section 5.1), counted as
			// a frame that only earns a reset.
			if err := c.idleFrame(); err != nil {
				return err
			}
			c.resetStream(f.StreamID, http2.ErrCodeStreamClosed)
		}
		return nil
	}
	s.rd.recvUsed += n
	s.rd.stale = false
	if s.rd.recvUsed-s.rd.recvAcked > streamWindow {
		c.release(n)
		c.resetStream(s.id, http2.ErrCodeFlowControl)
		return nil
	}
	data := f.Data()
	s.rd.body += int64(len(data))
	if s.rd.declared >= 0 && s.rd.body > s.rd.declared {
		// More than content-length said: malformed (RFC 9113,
		// section 8.1.1).
		c.release(n)
		c.resetStream(s.id, http2.ErrCodeProtocol)
		return nil
	}
	if s.refusal != nil {
		// Read and discarded: the connection's window is returned at
		// once, the stream's never (see refusal.go).
		c.release(n)
		if f.StreamEnded() {
			return c.endStream(s)
		}
		return nil
	}
	c.release(n - len(data)) // padding
	if !c.reserve(s, data) {
		c.release(len(reqBytes(s)) + len(data))
		c.answerEarly(s, errBudget, f.StreamEnded())
		return nil
	}
	if len(data) > 0 {
		*s.req = append(*s.req, data...)
	}
	if st := c.checkMessage(s); st != nil {
		c.release(len(reqBytes(s)))
		c.answerEarly(s, st, f.StreamEnded())
		return nil
	}
	if f.StreamEnded() {
		return c.endStream(s)
	}
	if unacked := s.rd.recvUsed - s.rd.recvAcked; unacked >= streamWindow/2 {
		s.rd.recvAcked = s.rd.recvUsed
		c.mu.Lock()
		c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 4, frameWindowUpdate, 0, s.id)
		c.sh.wbuf = appendUint32(c.sh.wbuf, uint32(unacked))
		c.flushLocked()
		c.mu.Unlock()
	}
	return nil
}

// release returns n received bytes to the connection's window, in
// WINDOW_UPDATEs of at least a quarter of it (on the reader).
func (c *conn) release(n int) {
	c.rd.connUnused += n
	if c.rd.connUnused < connWindow/4 {
		return
	}
	inc := c.rd.connUnused
	c.rd.connUnused, c.rd.connRecv = 0, c.rd.connRecv-inc
	c.mu.Lock()
	c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 4, frameWindowUpdate, 0, 0)
	c.sh.wbuf = appendUint32(c.sh.wbuf, uint32(inc))
	c.flushLocked()
	c.mu.Unlock()
}

// checkMessage looks at a request's bytes as they come: a message larger
// than the limit, or a second one, is answered at once.
func (c *conn) checkMessage(s *stream) *status.Status {
	b := reqBytes(s)
	if len(b) < 5 {
		return nil
	}
	size := int(b[1])<<24 | int(b[2])<<16 | int(b[3])<<8 | int(b[4])
	if max := c.srv.opts.MaxRecvMsgSize; size > max {
		return status.Newf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", size, max)
	}
	if len(b) > 5+size {
		return status.New(codes.Internal, "cardinality violation: received multiple request messages for non-client-streaming RPC")
	}
	return nil
}

// discard returns to the connection's window the request bytes of a
// stream being reset before its client's side ended (on the reader).
func (c *conn) discard(id uint32) {
	c.mu.Lock()
	s := c.sh.streams[id]
	c.mu.Unlock()
	if s != nil && !s.rd.ended {
		s.rd.ended = true
		c.release(len(reqBytes(s)))
		c.freeReq(s)
	}
}

// windowUpdate opens a send window.
func (c *conn) windowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	if f.StreamID == 0 {
		c.sh.sendWindow += int64(f.Increment)
		if c.sh.sendWindow > maxWindow {
			c.mu.Unlock()
			return connError{http2.ErrCodeFlowControl, "connection window overflow"}
		}
	} else if s := c.sh.streams[f.StreamID]; s != nil {
		s.sh.sendWindow += int64(f.Increment)
		if s.sh.sendWindow > maxWindow {
			c.mu.Unlock()
			c.resetStream(f.StreamID, http2.ErrCodeFlowControl)
			return nil
		}
	} else if f.StreamID > c.sh.maxStream {
		c.mu.Unlock()
		return connError{http2.ErrCodeProtocol, "WINDOW_UPDATE on an idle stream"}
	} else {
		// A stream that is gone.
		c.mu.Unlock()
		return c.idleFrame()
	}
	c.pushBlockedLocked()
	c.flushLocked()
	c.mu.Unlock()
	return nil
}
