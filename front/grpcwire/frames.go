package grpcwire

import (
	"context"
	"errors"

	"golang.org/x/net/http2"
)

// maxQueuedControl is how many control frames (acknowledgements, resets)
// may wait behind a write that does not progress: a client that sends
// PING, SETTINGS or refused streams without reading the answers is cut
// off.
const maxQueuedControl = 10000

// frame handles one frame (on the reader).
func (c *conn) frame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		return c.data(f)
	case *http2.HeadersFrame:
		if f.StreamID%2 == 0 {
			return connError{http2.ErrCodeProtocol, "even stream id"}
		}
		c.rd.block = append(c.rd.block[:0], f.HeaderBlockFragment()...)
		c.rd.blockID, c.rd.blockEnd = f.StreamID, f.StreamEnded()
		if f.HeadersEnded() {
			return c.headers()
		}
		return c.checkBlock()
	case *http2.ContinuationFrame:
		c.rd.block = append(c.rd.block, f.HeaderBlockFragment()...)
		if f.HeadersEnded() {
			return c.headers()
		}
		return c.checkBlock()
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		return c.settings(f)
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		c.mu.Lock()
		c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 8, framePing, flagAck, 0)
		c.sh.wbuf = append(c.sh.wbuf, f.Data[:]...)
		err := c.controlLocked()
		c.mu.Unlock()
		return err
	case *http2.WindowUpdateFrame:
		return c.windowUpdate(f)
	case *http2.RSTStreamFrame:
		return c.rstStream(f)
	case *http2.GoAwayFrame:
		c.mu.Lock()
		c.sh.peerGone = true
		if c.sh.active == 0 {
			c.sh.closing = true
		}
		closing := c.sh.closing
		c.flushLocked()
		c.mu.Unlock()
		if closing {
			return errors.New("client went away")
		}
		return nil
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE from a client"}
	default:
		// PRIORITY and unknown frame types are ignored (section 5.5).
		return nil
	}
}

// controlLocked ends the queueing of a control frame: it writes it unless
// a write is under way, and cuts the connection off when too many wait
// behind one.
func (c *conn) controlLocked() error {
	c.sh.queued++
	if c.sh.queued > maxQueuedControl {
		c.rd.flooded = true
		return errFlood
	}
	c.flushLocked()
	return nil
}

// errFlood ends a connection whose client does not read the answers to
// its control frames.
var errFlood = connError{http2.ErrCodeEnhanceYourCalm, "too many control frames unanswered"}

// settings applies the client's SETTINGS and acknowledges them.
func (c *conn) settings(f *http2.SettingsFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				return connError{http2.ErrCode(ce), "invalid setting " + s.String()}
			}
			return connError{http2.ErrCodeProtocol, "invalid setting " + s.String()}
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.sh.peerWindow
			c.sh.peerWindow = int64(s.Val)
			for _, st := range c.sh.streams {
				st.sh.sendWindow += delta
				if st.sh.sendWindow > maxWindow {
					return connError{http2.ErrCodeFlowControl, "stream window overflow"}
				}
			}
		case http2.SettingMaxFrameSize:
			c.sh.maxFrame = int(s.Val)
		}
		// HEADER_TABLE_SIZE needs nothing: responses never use the
		// dynamic table.
		return nil
	})
	if err != nil {
		return err
	}
	c.pushBlockedLocked()
	c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 0, frameSettings, flagAck, 0)
	return c.controlLocked()
}

// rstStream cancels a call.
func (c *conn) rstStream(f *http2.RSTStreamFrame) error {
	c.discard(f.StreamID)
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID > c.sh.maxStream {
		return connError{http2.ErrCodeProtocol, "RST_STREAM on an idle stream"}
	}
	if s := c.sh.streams[f.StreamID]; s != nil {
		c.dropLocked(s)
	}
	c.flushLocked()
	return nil
}

// resetStream resets a stream with code (on the reader).
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.discard(id)
	c.mu.Lock()
	if s := c.sh.streams[id]; s != nil {
		c.dropLocked(s)
	}
	c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 4, frameRSTStream, 0, id)
	c.sh.wbuf = appendUint32(c.sh.wbuf, uint32(code))
	_ = c.controlLocked()
	c.mu.Unlock()
}

// dropLocked forgets a stream that was reset: its call's context is
// cancelled, and it counts against MaxConcurrentStreams until its handler
// returns.
func (c *conn) dropLocked(s *stream) {
	s.sh.reset = true
	s.ctx.endLocked(context.Canceled)
	if s.sh.out != nil {
		putBuf(s.sh.out)
		s.sh.out = nil
	}
	delete(c.sh.streams, s.id)
	c.finishLocked(s)
}

// finishLocked ends a stream's count once it is finished and its handler
// returned; the connection closes after its last call once it is going
// away.
func (c *conn) finishLocked(s *stream) {
	s.sh.finished = true
	if s.sh.handling || !s.sh.counted {
		return
	}
	s.sh.counted = false
	c.sh.active--
	if c.sh.active == 0 && (c.sh.goingAway || c.sh.peerGone) {
		c.sh.closing = true
	}
}
