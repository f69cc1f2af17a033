package grpcwire

import (
	"context"
	"errors"
	"time"

	"golang.org/x/net/http2"
)

// maxQueuedControl is how many control frames (acknowledgements, resets)
// may wait behind a write that does not progress: a client that sends
// PING, SETTINGS or refused streams without reading the answers is cut
// off.
const maxQueuedControl = 10000

// Frames that cost the server work and move nothing forward: a PING (but
// the first after a call was answered), a SETTINGS after the first, an
// acknowledgement never asked for, an empty CONTINUATION or DATA that ends
// nothing, PRIORITY (ignored here), an unknown type, a WINDOW_UPDATE or
// RST_STREAM for a stream that is gone, a frame that only earns its stream
// a reset. A client may send a few, as keep-alives and leftovers of a
// race; more than maxIdleFrames within idleWindow end the connection
// (GOAWAY ENHANCE_YOUR_CALM), as x/net's server ends a CONTINUATION flood
// and grpc-go's a client that pings too often.
const (
	maxIdleFrames = 1000
	idleWindow    = time.Second
)

// errIdleFlood ends a connection that sends frames without progress.
var errIdleFlood = connError{http2.ErrCodeEnhanceYourCalm, "too many frames that move nothing forward"}

// idleFrame counts a frame that moves nothing forward (on the reader).
// The clock is read at the first of a window's frames and at its
// maxIdleFrames-th, not for each.
func (c *conn) idleFrame() error {
	rd := &c.rd
	rd.idleFrames++
	switch {
	case rd.idleFrames == 1:
		rd.idleSince = time.Now()
	case rd.idleFrames > maxIdleFrames:
		if time.Since(rd.idleSince) < idleWindow {
			return errIdleFlood
		}
		rd.idleFrames, rd.idleSince = 1, time.Now()
	}
	return nil
}

// frame handles one frame (on the reader).
func (c *conn) frame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		if f.Length == 0 && !f.StreamEnded() {
			if err := c.idleFrame(); err != nil {
				return err
			}
		}
		return c.data(f)
	case *http2.HeadersFrame:
		if f.StreamID%2 == 0 {
			return connError{http2.ErrCodeProtocol, "even stream id"}
		}
		if len(f.HeaderBlockFragment()) == 0 && !f.HeadersEnded() {
			if err := c.idleFrame(); err != nil {
				return err
			}
		}
		if !c.growBlock(len(f.HeaderBlockFragment()), false) {
			return errBlockBudget
		}
		c.rd.block = append(c.rd.block[:0], f.HeaderBlockFragment()...)
		c.rd.blockID, c.rd.blockEnd = f.StreamID, f.StreamEnded()
		c.rd.blockDep = f.HasPriority() && f.Priority.StreamDep == f.StreamID
		if f.HeadersEnded() {
			return c.headers()
		}
		return c.checkBlock()
	case *http2.ContinuationFrame:
		if len(f.HeaderBlockFragment()) == 0 && !f.HeadersEnded() {
			if err := c.idleFrame(); err != nil {
				return err
			}
		}
		if !c.growBlock(len(f.HeaderBlockFragment()), true) {
			return errBlockBudget
		}
		c.rd.block = append(c.rd.block, f.HeaderBlockFragment()...)
		if f.HeadersEnded() {
			return c.headers()
		}
		return c.checkBlock()
	case *http2.SettingsFrame:
		// The server sends one SETTINGS, acknowledged once; the client's
		// first came with its preface.
		if !f.IsAck() || c.rd.settingsAcked {
			if err := c.idleFrame(); err != nil {
				return err
			}
		}
		if f.IsAck() {
			c.rd.settingsAcked = true
			return nil
		}
		return c.settings(f)
	case *http2.PingFrame:
		// The server sends no PING: an ACK answers nothing. A PING moves
		// nothing forward either, unless a call was answered since the
		// last one: a client that measures the connection as answers
		// arrive (grpc-go's BDP estimator pings at most once per round
		// trip, on receiving data) is let be, as grpc-go's server lets it
		// be, and such pings number at most the calls answered.
		c.mu.Lock()
		answered := c.sh.answered && !f.IsAck()
		c.sh.answered = false
		c.mu.Unlock()
		if !answered {
			if err := c.idleFrame(); err != nil {
				return err
			}
		}
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
		again := c.sh.peerGone
		c.mu.Unlock()
		if again {
			return c.idleFrame()
		}
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
	case *http2.PriorityFrame:
		// Ignored (section 5.3.2), unless the stream depends on
		// itself: a stream error (section 5.3.1).
		if err := c.idleFrame(); err != nil {
			return err
		}
		if f.StreamDep == f.StreamID {
			c.resetStream(f.StreamID, http2.ErrCodeProtocol)
		}
		return nil
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE from a client"}
	default:
		// Unknown frame types are ignored (section 5.5).
		return c.idleFrame()
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

// errBlockBudget ends a connection whose header block finds no room in
// the memory budget.
var errBlockBudget = connError{http2.ErrCodeEnhanceYourCalm, "header block beyond the memory budget"}

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
	// The acknowledgement goes first, then what a larger window lets
	// go: the client learns the settings took effect before it reads
	// frames sent under them.
	c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 0, frameSettings, flagAck, 0)
	c.pushBlockedLocked()
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
	s := c.sh.streams[f.StreamID]
	if s != nil {
		c.dropLocked(s)
	}
	c.flushLocked()
	if s == nil {
		return c.idleFrame()
	}
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
