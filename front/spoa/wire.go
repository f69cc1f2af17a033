package spoa

import (
	"encoding/binary"
	"math/bits"
)

// This file reads and writes SPOP's encodings (doc/SPOE.txt, section 3):
// varints, typed data, frames' metadata, KV-lists, messages and actions.
// Every reader takes the bytes as they came and reports what it could not
// read; none of them panics or allocates.

// Frame types (section 3.2.2).
const (
	frameUnset             = 0
	frameHAProxyHello      = 1
	frameHAProxyDisconnect = 2
	frameNotify            = 3
	frameAgentHello        = 101
	frameAgentDisconnect   = 102
	frameAck               = 103
)

// Frame flags (section 3.2).
const (
	flagFin   = 1
	flagAbort = 2
)

// The types of typed data (section 3.1): the type in the low four bits of
// the first byte, a boolean's value in the high four.
const (
	dataNull   = 0
	dataBool   = 1
	dataInt32  = 2
	dataUint32 = 3
	dataInt64  = 4
	dataUint64 = 5
	dataIPv4   = 6
	dataIPv6   = 7
	dataString = 8
	dataBinary = 9

	dataTypeMask = 0x0f
	dataTrue     = 0x10
)

// Actions and the scope of their variables (section 3.4).
const (
	actionSetVar   = 1
	actionUnsetVar = 2
	scopeTxn       = 2
)

// The status codes of a DISCONNECT frame (section 3.5).
const (
	statusNormal         = 0
	statusIO             = 1
	statusTimeout        = 2
	statusTooBig         = 3
	statusInvalid        = 4
	statusNoVersion      = 5
	statusNoFrameSize    = 6
	statusNoCapabilities = 7
	statusBadVersion     = 8
	statusBadFrameSize   = 9
	statusNoFragments    = 10
	statusResources      = 13
)

// statusMessages are the messages a DISCONNECT frame carries with each
// status the agent sends.
var statusMessages = map[int]string{
	statusNormal:         "normal",
	statusIO:             "I/O error",
	statusTimeout:        "a timeout occurred",
	statusTooBig:         "frame is too big",
	statusInvalid:        "invalid frame received",
	statusNoVersion:      "version value not found",
	statusNoFrameSize:    "max-frame-size value not found",
	statusNoCapabilities: "capabilities value not found",
	statusBadVersion:     "unsupported version",
	statusBadFrameSize:   "max-frame-size too big or too small",
	statusNoFragments:    "payload fragmentation is not supported",
	statusResources:      "resource allocation error",
}

// minFrameSize is the least max-frame-size a peer may announce.
const minFrameSize = 256

// frameHeaderMin is the least a frame holds: its type, its flags and two
// one-byte varints.
const frameHeaderMin = 1 + 4 + 1 + 1

// appendVarint appends v in SPOP's variable-length encoding (HAProxy's
// encode_varint): below 240 one byte; otherwise the low four bits with the
// four high bits set, then seven bits at a time, each byte but the last
// with its high bit set, the value less what the bytes before it carry.
func appendVarint(b []byte, v uint64) []byte {
	if v < 240 {
		return append(b, byte(v))
	}
	b = append(b, byte(v)|240)
	v = (v - 240) >> 4
	for v >= 128 {
		b = append(b, byte(v)|128)
		v = (v - 128) >> 7
	}
	return append(b, byte(v))
}

// readVarint reads a varint at the start of b: its value and its length in
// bytes, or a length of 0 when b holds no whole varint or one whose value
// does not fit in 64 bits.
func readVarint(b []byte) (uint64, int) {
	if len(b) == 0 {
		return 0, 0
	}
	v := uint64(b[0])
	if v < 240 {
		return v, 1
	}
	shift := uint(4)
	for i := 1; i < len(b); i++ {
		c := uint64(b[i])
		if shift >= 64 || c>>(64-shift) != 0 {
			return 0, 0
		}
		var carry uint64
		v, carry = bits.Add64(v, c<<shift, 0)
		if carry != 0 {
			return 0, 0
		}
		if c < 128 {
			return v, i + 1
		}
		shift += 7
	}
	return 0, 0
}

// readBytes reads a length-prefixed string at the start of b: the bytes
// (a view of b) and the length read, 0 if b holds no whole string.
func readBytes(b []byte) ([]byte, int) {
	n, k := readVarint(b)
	if k == 0 || n > uint64(len(b)-k) {
		return nil, 0
	}
	return b[k : k+int(n)], k + int(n)
}

// appendString appends s as a length-prefixed string.
func appendString(b []byte, s string) []byte {
	return append(appendVarint(b, uint64(len(s))), s...)
}

// value is one typed datum: its type (dataNull, dataBool, ...), an
// integer's or a boolean's value (a signed integer's bits as sent), and a
// string's, a binary's or an address's bytes (a view of the frame).
type value struct {
	typ byte
	n   uint64
	b   []byte
}

// readValue reads a typed datum at the start of b, and its length; 0 for
// a truncated one or one of a reserved type (10 to 15), which HAProxy
// never sends.
func readValue(b []byte) (value, int) {
	if len(b) == 0 {
		return value{}, 0
	}
	v := value{typ: b[0] & dataTypeMask}
	switch v.typ {
	case dataNull:
		return v, 1
	case dataBool:
		if b[0]&dataTrue != 0 {
			v.n = 1
		}
		return v, 1
	case dataInt32, dataUint32, dataInt64, dataUint64:
		n, k := readVarint(b[1:])
		if k == 0 {
			return value{}, 0
		}
		v.n = n
		return v, 1 + k
	case dataIPv4, dataIPv6:
		size := 4
		if v.typ == dataIPv6 {
			size = 16
		}
		if len(b) < 1+size {
			return value{}, 0
		}
		v.b = b[1 : 1+size]
		return v, 1 + size
	case dataString, dataBinary:
		s, k := readBytes(b[1:])
		if k == 0 {
			return value{}, 0
		}
		v.b = s
		return v, 1 + k
	}
	return value{}, 0
}

// isInt reports whether v is an integer of any of SPOP's four kinds.
func (v value) isInt() bool {
	return v.typ == dataInt32 || v.typ == dataUint32 || v.typ == dataInt64 || v.typ == dataUint64
}

// header is a frame's metadata (section 3.2): its type, flags, stream and
// frame identifiers, and the payload that follows.
type header struct {
	typ      byte
	flags    uint32
	sid, fid uint64
	payload  []byte
}

// readHeader reads the metadata at the start of a frame (its bytes after
// the length); false if they are truncated.
func readHeader(f []byte) (header, bool) {
	if len(f) < frameHeaderMin {
		return header{}, false
	}
	h := header{typ: f[0], flags: binary.BigEndian.Uint32(f[1:5])}
	p := f[5:]
	var k int
	if h.sid, k = readVarint(p); k == 0 {
		return header{}, false
	}
	p = p[k:]
	if h.fid, k = readVarint(p); k == 0 {
		return header{}, false
	}
	h.payload = p[k:]
	return h, true
}

// startFrame appends a frame's length (filled in by endFrame) and
// metadata, and returns where the frame starts.
func startFrame(b []byte, typ byte, sid, fid uint64) ([]byte, int) {
	at := len(b)
	b = append(b, 0, 0, 0, 0, typ, 0, 0, 0, flagFin)
	b = appendVarint(b, sid)
	return appendVarint(b, fid), at
}

// endFrame writes the length of the frame that starts at at.
func endFrame(b []byte, at int) []byte {
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return b
}

// kv is one item of a KV-list.
type kv struct {
	name []byte
	v    value
}

// readKV reads the KV-list item at the start of b, and its length; 0 if
// it is truncated or its name is empty (HAProxy refuses those).
func readKV(b []byte) (kv, int) {
	name, k := readBytes(b)
	if k == 0 || len(name) == 0 {
		return kv{}, 0
	}
	v, n := readValue(b[k:])
	if n == 0 {
		return kv{}, 0
	}
	return kv{name: name, v: v}, k + n
}

// message is one message of a NOTIFY frame's LIST-OF-MESSAGES: its name
// and its arguments, still encoded (see nextArg).
type message struct {
	name  []byte
	nargs int
	args  []byte
}

// readMessage reads the message at the start of b, and its length; 0 if
// it is malformed (truncated, or an argument that is not a name and a
// typed datum).
func readMessage(b []byte) (message, int) {
	name, k := readBytes(b)
	if k == 0 || k >= len(b) {
		return message{}, 0
	}
	m := message{name: name, nargs: int(b[k])}
	at := k + 1
	for i := 0; i < m.nargs; i++ {
		_, n := readArg(b[at:])
		if n == 0 {
			return message{}, 0
		}
		at += n
	}
	m.args = b[k+1 : at]
	return m, at
}

// readArg reads one argument of a message: its name (empty for an
// unnamed one) and value, and its length; 0 if it is malformed.
func readArg(b []byte) (kv, int) {
	name, k := readBytes(b)
	if k == 0 {
		return kv{}, 0
	}
	v, n := readValue(b[k:])
	if n == 0 {
		return kv{}, 0
	}
	return kv{name: name, v: v}, k + n
}

// appendSetVar appends a set-var action of a transaction variable to a
// string value.
func appendSetVar[T string | []byte](b []byte, name string, val T) []byte {
	b = append(b, actionSetVar, 3, scopeTxn)
	b = appendString(b, name)
	b = append(b, dataString)
	b = appendVarint(b, uint64(len(val)))
	return append(b, val...)
}

// appendSetVarInt appends a set-var action of a transaction variable to an
// integer value.
func appendSetVarInt(b []byte, name string, n uint32) []byte {
	b = append(b, actionSetVar, 3, scopeTxn)
	b = appendString(b, name)
	b = append(b, dataUint32)
	return appendVarint(b, uint64(n))
}
