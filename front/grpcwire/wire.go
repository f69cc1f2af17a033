package grpcwire

import (
	"encoding/base64"
	"strconv"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// HTTP/2 frame types and flags (RFC 9113, section 6), as written.
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
)

// appendFrameHeader appends a frame header (section 4.1).
func appendFrameHeader(b []byte, length int, typ, flags byte, stream uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), typ, flags,
		byte(stream>>24), byte(stream>>16), byte(stream>>8), byte(stream))
}

func appendUint32(b []byte, v uint32) []byte {
	return append(b, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// appendHeaderBlock appends block as a HEADERS frame on stream, followed
// by CONTINUATION frames when it is longer than maxFrame.
func appendHeaderBlock(b []byte, stream uint32, block []byte, endStream bool, maxFrame int) []byte {
	var flags byte
	if endStream {
		flags = flagEndStream
	}
	typ := byte(frameHeaders)
	for {
		n := min(len(block), maxFrame)
		f := flags
		if n == len(block) {
			f |= flagEndHeaders
		}
		b = appendFrameHeader(b, n, typ, f, stream)
		b = append(b, block[:n]...)
		block = block[n:]
		if len(block) == 0 {
			return b
		}
		typ, flags = frameContinuation, 0
	}
}

// appendHpackInt appends an HPACK integer with an n-bit prefix whose
// other bits are first (RFC 7541, section 5.1).
func appendHpackInt(b []byte, first byte, n uint, v uint64) []byte {
	limit := uint64(1)<<n - 1
	if v < limit {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(limit))
	v -= limit
	for v >= 128 {
		b = append(b, byte(v&0x7f|0x80))
		v >>= 7
	}
	return append(b, byte(v))
}

// appendHpackString appends a string literal without Huffman coding.
func appendHpackString(b []byte, s string) []byte {
	b = appendHpackInt(b, 0, 7, uint64(len(s)))
	return append(b, s...)
}

// appendLiteral appends a header field as a literal without indexing with
// a literal name: it leaves both ends' dynamic tables alone, so that the
// prebuilt blocks stay valid whatever the peer's HEADER_TABLE_SIZE.
func appendLiteral(b []byte, name, value string) []byte {
	b = append(b, 0)
	b = appendHpackString(b, name)
	return appendHpackString(b, value)
}

// HPACK static table indexes (RFC 7541, appendix A).
const (
	hpackStatus200   = 8
	hpackStatus      = 8 // :status's name
	hpackContentType = 31
)

// appendStatusField appends :status, indexed when 200.
func appendStatusField(b []byte, code int) []byte {
	if code == 200 {
		return append(b, 0x80|hpackStatus200)
	}
	b = appendHpackInt(b, 0, 4, hpackStatus)
	return appendHpackString(b, strconv.Itoa(code))
}

// appendContentType appends content-type: application/grpc.
func appendContentType(b []byte) []byte {
	b = appendHpackInt(b, 0, 4, hpackContentType)
	return appendHpackString(b, "application/grpc")
}

// The prebuilt header blocks: a response's headers, and the trailers of a
// call that succeeded.
var (
	responseHeaders = appendContentType(appendStatusField(nil, 200))
	okTrailers      = appendLiteral(nil, "grpc-status", "0")
)

// appendStatus appends the trailers of a call that ended with st: a
// trailers-only response when head (with :status httpStatus and the
// content type), trailers after the response headers otherwise.
func appendStatus(b []byte, st *status.Status, head bool, httpStatus int) []byte {
	if head {
		b = appendStatusField(b, httpStatus)
		b = appendContentType(b)
	}
	b = appendLiteral(b, "grpc-status", strconv.Itoa(int(st.Code())))
	if msg := st.Message(); msg != "" {
		b = appendLiteral(b, "grpc-message", encodeMessage(msg))
	}
	if p := st.Proto(); len(p.GetDetails()) > 0 {
		if raw, err := proto.Marshal(p); err == nil {
			b = appendLiteral(b, "grpc-status-details-bin", base64.RawStdEncoding.EncodeToString(raw))
		}
	}
	return b
}

// encodeMessage percent-encodes grpc-message as gRPC's HTTP/2 protocol
// says: every byte outside printable ASCII, and '%'.
func encodeMessage(msg string) string {
	n := 0
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			n++
		}
	}
	if n == 0 {
		return msg
	}
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(msg)+2*n)
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			out = append(out, '%', hex[c>>4], hex[c&15])
		} else {
			out = append(out, c)
		}
	}
	return string(out)
}

// errTimeout is a malformed grpc-timeout.
type errTimeout string

func (e errTimeout) Error() string { return string(e) }

// parseTimeout reads grpc-timeout: 1 to 8 ASCII digits and a unit (H, M,
// S, m, u, n).
func parseTimeout(v string) (time.Duration, error) {
	if len(v) < 2 {
		return 0, errTimeout("timeout string is too short: " + strconv.Quote(v))
	}
	if len(v) > 9 {
		return 0, errTimeout("timeout string is too long: " + strconv.Quote(v))
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, errTimeout("timeout unit is not recognized: " + strconv.Quote(v))
	}
	var n int64
	for _, c := range []byte(v[:len(v)-1]) {
		if c < '0' || c > '9' {
			return 0, errTimeout("timeout value is not a number: " + strconv.Quote(v))
		}
		n = n*10 + int64(c-'0')
	}
	// At most 99999999 hours: cap it rather than overflow.
	const most = int64(1<<63-1) / int64(time.Hour)
	if unit == time.Hour && n > most || unit == time.Minute && n > most*60 {
		return time.Duration(1<<63 - 1), nil
	}
	return time.Duration(n) * unit, nil
}

// staticTableLen is the number of entries in HPACK's static table (RFC
// 7541, appendix A).
const staticTableLen = 61

// standalone reports whether a complete HPACK header block neither reads
// nor writes the dynamic table (RFC 7541, section 6): every field is
// indexed in the static table, or a literal not indexed or never indexed
// whose name, if indexed, is in the static table; no table size update.
// Such a block decodes to the same fields whatever the table holds, and
// leaves it as it was. A block it cannot read whole is not.
func standalone(b []byte) bool {
	for len(b) > 0 {
		var idx uint64
		var ok bool
		switch {
		case b[0]&0x80 != 0: // indexed field
			idx, b, ok = hpackInt(b, 7)
			if !ok || idx == 0 || idx > staticTableLen {
				return false
			}
			continue
		case b[0]&0xf0 == 0x00, b[0]&0xf0 == 0x10: // literal not indexed, never indexed
			idx, b, ok = hpackInt(b, 4)
		default: // literal with incremental indexing, table size update
			return false
		}
		if !ok || idx > staticTableLen {
			return false
		}
		if idx == 0 {
			if b, ok = skipString(b); !ok {
				return false
			}
		}
		if b, ok = skipString(b); !ok {
			return false
		}
	}
	return true
}

// hpackInt reads an integer with an n-bit prefix (RFC 7541, section
// 5.1); values beyond 2^28 are refused.
func hpackInt(b []byte, n uint) (uint64, []byte, bool) {
	mask := uint64(1)<<n - 1
	v := uint64(b[0]) & mask
	b = b[1:]
	if v < mask {
		return v, b, true
	}
	for shift := uint(0); len(b) > 0 && shift <= 21; shift += 7 {
		c := b[0]
		b = b[1:]
		v += uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, b, true
		}
	}
	return 0, nil, false
}

// skipString skips a string literal (RFC 7541, section 5.2).
func skipString(b []byte) ([]byte, bool) {
	if len(b) == 0 {
		return nil, false
	}
	n, b, ok := hpackInt(b, 7)
	if !ok || n > uint64(len(b)) {
		return nil, false
	}
	return b[n:], true
}
