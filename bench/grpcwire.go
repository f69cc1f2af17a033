package main

// This file is the gRPC load's client: unary calls written as prebuilt
// HTTP/2 frames on a plain TCP connection (HTTP/2 without TLS, as gRPC's
// plaintext transport speaks it), one call in flight per connection, and
// the answer's frames read back. The HTTP load writes prebuilt requests
// and parses responses without allocating; a general gRPC client would
// cost the harness several times what the servers under test spend, on
// the same cores, and shift every gRPC figure.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// HTTP/2 frame types and flags (RFC 9113, section 6).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	frameHeaderLen = 9
	// maxFrameLen is SETTINGS_MAX_FRAME_SIZE's default, which this client
	// never raises: a peer must not send larger frames.
	maxFrameLen = 1 << 14
	// initialWindow is the flow-control window of a connection and of a
	// stream until a WINDOW_UPDATE (section 6.9.2).
	initialWindow = 65535
	// windowRefill is how much received data the client lets pile up
	// before it returns the connection's window to the server.
	windowRefill = 1 << 14
	// maxStreamID is the last stream a connection can open.
	maxStreamID = 1<<31 - 1
)

// clientPreface opens every HTTP/2 connection (section 3.4).
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// errGoAway is a call not made on a connection that takes no more: the
// server is closing it, or its stream ids are used up. The client
// reconnects.
var errGoAway = errors.New("the connection takes no further call")

// wireCall is one prebuilt call: a HEADERS frame and a DATA frame ending
// the stream, whose stream ids are patched per call.
type wireCall struct {
	frames  []byte
	dataOff int // where the DATA frame starts
}

// appendFrameHeader appends a frame header (section 4.1).
func appendFrameHeader(b []byte, length int, typ, flags byte, stream uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), typ, flags,
		byte(stream>>24), byte(stream>>16), byte(stream>>8), byte(stream))
}

// buildWireCall encodes a unary call of method carrying req. Header fields
// are encoded as never-indexed literals, so that the block leaves both
// sides' HPACK dynamic tables alone and can be sent any number of times.
func buildWireCall(authority, method string, req proto.Message) (*wireCall, error) {
	msg, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("marshal %s request: %w", method, err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", authority},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"user-agent", "authlimit-bench"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true}); err != nil {
			return nil, fmt.Errorf("encode %s headers: %w", method, err)
		}
	}
	if block.Len() > maxFrameLen || 5+len(msg) > maxFrameLen {
		return nil, fmt.Errorf("%s request of %d bytes does not fit one frame", method, len(msg))
	}
	b := appendFrameHeader(nil, block.Len(), frameHeaders, flagEndHeaders, 0)
	b = append(b, block.Bytes()...)
	dataOff := len(b)
	b = appendFrameHeader(b, 5+len(msg), frameData, flagEndStream, 0)
	b = append(b, 0) // not compressed
	b = binary.BigEndian.AppendUint32(b, uint32(len(msg)))
	b = append(b, msg...)
	return &wireCall{frames: b, dataOff: dataOff}, nil
}

// wireConn is one HTTP/2 connection making one call at a time. It is not
// safe for concurrent use.
type wireConn struct {
	conn       net.Conn
	br         *bufio.Reader
	dec        *hpack.Decoder
	out        []byte // the frames being written
	hdr        [frameHeaderLen]byte
	payload    []byte
	block      []byte // a header block across CONTINUATION frames
	next       uint32 // the next stream id
	sendWindow int64  // the connection's send window
	received   int    // data received since the last WINDOW_UPDATE
	// goingAway is set by a GOAWAY: calls up to lastID are answered, no
	// further call is.
	goingAway bool
	lastID    uint32
	// The answer of the call in flight.
	httpStatus, grpcStatus, grpcMessage string
	msg                                 []byte
}

// newWireConn starts HTTP/2 on c: the preface and empty SETTINGS. The
// server's SETTINGS are read and acknowledged with the first answer.
func newWireConn(c net.Conn) (*wireConn, error) {
	w := &wireConn{conn: c, br: bufio.NewReaderSize(c, 32<<10), next: 1, sendWindow: initialWindow}
	w.dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		switch f.Name {
		case ":status":
			w.httpStatus = f.Value
		case "grpc-status":
			w.grpcStatus = f.Value
		case "grpc-message":
			w.grpcMessage = f.Value
		}
	})
	w.out = append(w.out, clientPreface...)
	w.out = appendFrameHeader(w.out, 0, frameSettings, 0, 0)
	if _, err := c.Write(w.out); err != nil {
		return nil, err
	}
	return w, nil
}

// call makes one unary call and unmarshals its reply. A call the server
// answered with a gRPC status other than OK returns that status as a
// status error; any other error leaves the connection unusable.
func (w *wireConn) call(wc *wireCall, reply proto.Message) error {
	msg, err := w.exchange(wc)
	if err != nil {
		return err
	}
	return proto.Unmarshal(msg, reply)
}

// exchange makes one unary call, as call does, and returns its reply
// message's bytes, valid until the next call.
func (w *wireConn) exchange(wc *wireCall) ([]byte, error) {
	id := w.next
	if w.goingAway || id > maxStreamID {
		return nil, errGoAway
	}
	w.next += 2
	dataLen := int64(len(wc.frames) - wc.dataOff - frameHeaderLen)
	for w.sendWindow < dataLen {
		if _, err := w.readFrame(0); err != nil {
			return nil, err
		}
		if w.goingAway {
			return nil, errGoAway
		}
	}
	w.sendWindow -= dataLen
	w.out = append(w.out[:0], wc.frames...)
	binary.BigEndian.PutUint32(w.out[5:], id)
	binary.BigEndian.PutUint32(w.out[wc.dataOff+5:], id)
	w.httpStatus, w.grpcStatus, w.grpcMessage, w.msg = "", "", "", w.msg[:0]
	if _, err := w.conn.Write(w.out); err != nil {
		return nil, err
	}
	for {
		done, err := w.readFrame(id)
		if err != nil {
			return nil, err
		}
		if done {
			break
		}
	}
	if w.received >= windowRefill {
		w.out = appendFrameHeader(w.out[:0], 4, frameWindowUpdate, 0, 0)
		w.out = binary.BigEndian.AppendUint32(w.out, uint32(w.received))
		w.received = 0
		if _, err := w.conn.Write(w.out); err != nil {
			return nil, err
		}
	}
	return w.answer()
}

// answer reads the finished call's status, and returns its message.
func (w *wireConn) answer() ([]byte, error) {
	if w.httpStatus != "200" {
		return nil, fmt.Errorf("HTTP status %q", w.httpStatus)
	}
	code, err := strconv.ParseUint(w.grpcStatus, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("grpc-status %q", w.grpcStatus)
	}
	if code != 0 {
		return nil, status.Error(codes.Code(code), w.grpcMessage)
	}
	if len(w.msg) < 5 || w.msg[0] != 0 || int(binary.BigEndian.Uint32(w.msg[1:])) != len(w.msg)-5 {
		return nil, fmt.Errorf("malformed gRPC message of %d bytes", len(w.msg))
	}
	return w.msg[5:], nil
}

// readFrame reads and handles one frame; done reports the end of stream
// id's answer.
func (w *wireConn) readFrame(id uint32) (done bool, err error) {
	typ, flags, stream, p, err := w.read()
	if err != nil {
		return false, err
	}
	switch typ {
	case frameData:
		w.received += len(p)
		if stream != id {
			return false, nil
		}
		if p, err = unpad(p, flags); err != nil {
			return false, err
		}
		w.msg = append(w.msg, p...)
		return flags&flagEndStream != 0, nil
	case frameHeaders:
		if p, err = unpad(p, flags); err != nil {
			return false, err
		}
		if flags&flagPriority != 0 {
			if len(p) < 5 {
				return false, errors.New("short HEADERS priority")
			}
			p = p[5:]
		}
		w.block = append(w.block[:0], p...)
		for end := flags&flagEndHeaders != 0; !end; {
			ctyp, cflags, cstream, cp, err := w.read()
			if err != nil {
				return false, err
			}
			if ctyp != frameContinuation || cstream != stream {
				return false, fmt.Errorf("frame type %d inside a header block", ctyp)
			}
			w.block = append(w.block, cp...)
			end = cflags&flagEndHeaders != 0
		}
		// Every block goes through the decoder, whatever its stream,
		// to keep its dynamic table in step with the server's.
		if _, err := w.dec.Write(w.block); err != nil {
			return false, fmt.Errorf("decode headers: %w", err)
		}
		if err := w.dec.Close(); err != nil {
			return false, fmt.Errorf("decode headers: %w", err)
		}
		return stream == id && flags&flagEndStream != 0, nil
	case frameRSTStream:
		if stream == id && len(p) == 4 {
			return false, fmt.Errorf("stream reset (error code %d)", binary.BigEndian.Uint32(p))
		}
	case frameSettings:
		if flags&flagAck == 0 {
			return false, w.write(frameSettings, flagAck, 0, nil)
		}
	case framePing:
		if flags&flagAck == 0 {
			return false, w.write(framePing, flagAck, 0, p)
		}
	case frameGoAway:
		if len(p) < 8 {
			return false, errors.New("short GOAWAY")
		}
		w.goingAway, w.lastID = true, binary.BigEndian.Uint32(p)&maxStreamID
		if id > w.lastID {
			return false, errGoAway
		}
	case frameWindowUpdate:
		if stream == 0 && len(p) == 4 {
			w.sendWindow += int64(binary.BigEndian.Uint32(p) & maxStreamID)
		}
	}
	return false, nil
}

// read reads one frame; p is valid until the next read.
func (w *wireConn) read() (typ, flags byte, stream uint32, p []byte, err error) {
	if _, err := io.ReadFull(w.br, w.hdr[:]); err != nil {
		return 0, 0, 0, nil, err
	}
	n := int(w.hdr[0])<<16 | int(w.hdr[1])<<8 | int(w.hdr[2])
	if n > maxFrameLen {
		return 0, 0, 0, nil, fmt.Errorf("frame of %d bytes, over the %d allowed", n, maxFrameLen)
	}
	if cap(w.payload) < n {
		w.payload = make([]byte, n, maxFrameLen)
	}
	p = w.payload[:n]
	if _, err := io.ReadFull(w.br, p); err != nil {
		return 0, 0, 0, nil, err
	}
	return w.hdr[3], w.hdr[4], binary.BigEndian.Uint32(w.hdr[5:]) & maxStreamID, p, nil
}

// write sends one frame.
func (w *wireConn) write(typ, flags byte, stream uint32, p []byte) error {
	w.out = appendFrameHeader(w.out[:0], len(p), typ, flags, stream)
	w.out = append(w.out, p...)
	_, err := w.conn.Write(w.out)
	return err
}

// unpad strips a PADDED frame's padding.
func unpad(p []byte, flags byte) ([]byte, error) {
	if flags&flagPadded == 0 {
		return p, nil
	}
	if len(p) < 1 || int(p[0]) > len(p)-1 {
		return nil, errors.New("malformed padding")
	}
	return p[1 : len(p)-int(p[0])], nil
}
