// Package pbwire reads and writes protobuf messages straight from and to
// their bytes, for the gRPC fronts (front/extauthz, front/rls), which read
// only a few fields of a request and answer small responses: WellFormed
// first vouches that proto.Unmarshal would decode a message without an
// error, so that reading the fields used with Each means what decoding it
// whole means.
package pbwire

import (
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Each calls f with every field of the well-formed message b: its number,
// wire type, and its bytes (a length-delimited field's contents) or its
// varint's value.
func Each(b []byte, f func(protowire.Number, protowire.Type, []byte, uint64)) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		switch typ {
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			f(num, typ, v, 0)
			b = b[n:]
		case protowire.VarintType:
			x, n := protowire.ConsumeVarint(b)
			f(num, typ, nil, x)
			b = b[n:]
		default:
			b = b[protowire.ConsumeFieldValue(num, typ, b):]
		}
	}
}

// Str is b as a string, without a copy, for reading a request's fields
// while its call lasts: front/grpcwire returns the request's buffer to a
// pool once the call is answered, and the next call's bytes overwrite it.
// A string that must outlive the call (kept by the handler, put in a
// response built later) must be copied (strings.Clone).
func Str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// maxDepth is how deep WellFormed follows messages in messages; a deeper
// message is not vouched for.
const maxDepth = 32

// Shape is what WellFormed needs of a message type, read once from its
// descriptor: its fields by number.
type Shape struct {
	// vouch is whether WellFormed can vouch for the type: proto3, without
	// extensions.
	vouch  bool
	fields []fieldShape // by number, up to the largest below maxDense
	sparse map[protowire.Number]fieldShape
}

// maxDense bounds a shape's fields slice; larger numbers are in sparse.
const maxDense = 64

// fieldShape is a field's: its wire type, whether it is a list, a string
// or a message (and which).
type fieldShape struct {
	known bool
	wire  protowire.Type
	list  bool
	str   bool
	msg   *Shape
}

// NewShape reads md's shape and those of the messages it holds.
func NewShape(md protoreflect.MessageDescriptor) *Shape {
	return buildShape(md, map[protoreflect.FullName]*Shape{})
}

func buildShape(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*Shape) *Shape {
	if sh, ok := seen[md.FullName()]; ok {
		return sh
	}
	sh := &Shape{vouch: md.ExtensionRanges().Len() == 0 && md.ParentFile().Syntax() == protoreflect.Proto3}
	seen[md.FullName()] = sh
	fs := md.Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		f := fieldShape{known: true, wire: wireType(fd.Kind()), list: fd.IsList(), str: fd.Kind() == protoreflect.StringKind}
		if fd.Kind() == protoreflect.MessageKind {
			f.msg = buildShape(fd.Message(), seen)
		}
		if n := fd.Number(); n < maxDense {
			for len(sh.fields) <= int(n) {
				sh.fields = append(sh.fields, fieldShape{})
			}
			sh.fields[n] = f
		} else {
			if sh.sparse == nil {
				sh.sparse = map[protowire.Number]fieldShape{}
			}
			sh.sparse[n] = f
		}
	}
	return sh
}

func (sh *Shape) field(n protowire.Number) fieldShape {
	if int(n) < len(sh.fields) {
		return sh.fields[n]
	}
	return sh.sparse[n]
}

// WellFormed reports whether b is a message of shape sh that
// proto.Unmarshal decodes without an error, as far as it can tell: every
// field's tag and value parse; a known field's value of the wire type of
// its kind is valid (a proto3 string is UTF-8; a message is itself well
// formed); a field of another wire type, or an unknown one, is kept
// unknown by proto.Unmarshal and need only parse. What it does not follow
// (groups, a packed list, a message with extensions, a file not proto3,
// messages nested deeper than maxDepth) it does not vouch for.
func WellFormed(sh *Shape, b []byte) bool {
	return wellFormed(sh, b, 0, true)
}

// Readable reports whether b is a message of shape sh that WellFormed
// vouches for, but for strings that are not UTF-8, which proto.Unmarshal
// refuses: Envoy sends them as it has them (a client's header value of
// bytes above 0x7f, in a descriptor entry or a header). A front that reads
// such a message by its bytes gives them the meaning the sender gave them,
// where decoding it would end in an error, which a proxy may take as an
// admission.
func Readable(sh *Shape, b []byte) bool {
	return wellFormed(sh, b, 0, false)
}

func wellFormed(sh *Shape, b []byte, depth int, utf8Strings bool) bool {
	if depth > maxDepth || !sh.vouch {
		return false
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber || typ == protowire.StartGroupType {
			return false // a number ConsumeTag takes but proto.Unmarshal refuses; a group
		}
		b = b[n:]
		f := sh.field(num)
		if !f.known || typ != f.wire {
			if f.known && f.list && typ == protowire.BytesType {
				return false // a packed list
			}
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return false
			}
			b = b[n:]
			continue
		}
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return false
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if utf8Strings && f.str && !utf8.Valid(v) || f.msg != nil && !wellFormed(f.msg, v, depth+1, utf8Strings) {
			return false
		}
	}
	return true
}

// wireType is the wire type of a value of kind k (a list's element, not
// packed); a group's is StartGroupType, which WellFormed does not follow.
func wireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Uint32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
		return protowire.VarintType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	}
	return protowire.StartGroupType
}

// The field numbers of an envoy.config.core.v3.HeaderValue.
const (
	headerValueKey   = 1
	headerValueValue = 2
)

// HeaderValueLen is the length of the envoy.config.core.v3.HeaderValue of
// key and value, as proto.Marshal encodes it.
func HeaderValueLen(key, value []byte) int {
	n := 0
	if len(key) > 0 {
		n += protowire.SizeTag(headerValueKey) + protowire.SizeBytes(len(key))
	}
	if len(value) > 0 {
		n += protowire.SizeTag(headerValueValue) + protowire.SizeBytes(len(value))
	}
	return n
}

// AppendHeaderValue appends the envoy.config.core.v3.HeaderValue of key
// and value, without its tag and length, as proto.Marshal encodes it.
func AppendHeaderValue(b, key, value []byte) []byte {
	if len(key) > 0 {
		b = protowire.AppendTag(b, headerValueKey, protowire.BytesType)
		b = protowire.AppendBytes(b, key)
	}
	if len(value) > 0 {
		b = protowire.AppendTag(b, headerValueValue, protowire.BytesType)
		b = protowire.AppendBytes(b, value)
	}
	return b
}
