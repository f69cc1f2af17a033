package extauthz

import (
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/authlimit/authlimit/decide"
)

// readRequest reads the CheckRequest encoded in b into r as fromMessage
// reads the decoded message, without decoding it: r's strings point into
// b. It reports false, with r unspecified, when it cannot vouch that
// proto.Unmarshal decodes b without an error (see wellFormed; sh is
// CheckRequest's shape): the caller then decodes it whole.
func readRequest(r *request, b []byte, sh *shape) bool {
	if !wellFormed(sh, b, 0) {
		return false
	}
	r.reset()
	// Every message below is read where it occurs: a singular message
	// that occurs twice is merged, as proto.Unmarshal merges it, its
	// scalars the last seen, its lists and maps added to.
	each(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
		if num == 1 && typ == protowire.BytesType { // attributes
			each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
				switch {
				case num == 1 && typ == protowire.BytesType: // source
					each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
						if num == 1 && typ == protowire.BytesType { // address
							readAddress(r, v)
						}
					})
				case num == 4 && typ == protowire.BytesType: // request
					each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
						if num == 2 && typ == protowire.BytesType { // http
							r.http = true
							readHTTP(r, v)
						}
					})
				}
			})
		}
	})
	r.hdrs.list = r.joinedList
	if !r.hdrs.joined {
		r.hdrs.list = r.rawList
	}
	return true
}

// readAddress reads a core.v3.Address: socket_address, pipe and
// envoy_internal_address are one oneof, each replacing another.
func readAddress(r *request, b []byte) {
	each(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
		if typ != protowire.BytesType {
			return
		}
		switch num {
		case 1: // socket_address
			if !r.socket {
				r.socket, r.source = true, ""
			}
			each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
				if num == 2 && typ == protowire.BytesType { // address
					r.source = str(v)
				}
			})
		case 2, 3: // pipe, envoy_internal_address
			r.socket, r.source = false, ""
		}
	})
}

// readHTTP reads an AttributeContext.HttpRequest.
func readHTTP(r *request, b []byte) {
	each(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) {
		if typ == protowire.VarintType {
			if num == 9 { // size
				r.size = int64(x)
			}
			return
		}
		if typ != protowire.BytesType {
			return
		}
		switch num {
		case 2:
			r.method = str(v)
		case 4:
			r.path = str(v)
		case 5:
			r.host = str(v)
		case 3: // headers, a map entry: key 1, value 2
			var k, val string
			each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
				if typ == protowire.BytesType && num == 1 {
					k = str(v)
				} else if typ == protowire.BytesType && num == 2 {
					val = str(v)
				}
			})
			r.joinedHeader(k, val)
		case 13: // header_map
			r.headerMap(v)
		}
	})
}

// joinedHeader adds a headers map entry, replacing one of the same key, as
// a map's later entry does.
func (r *request) joinedHeader(k, v string) {
	for i := range r.joinedList {
		if r.joinedList[i].key == k {
			r.joinedList[i].value = v
			return
		}
	}
	r.joinedList = append(r.joinedList, field{key: k, value: v})
}

// headerMap adds a core.v3.HeaderMap's headers: its presence, even empty,
// makes the request's headers raw.
func (r *request) headerMap(b []byte) {
	r.hdrs.joined = false
	each(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
		if num != 1 || typ != protowire.BytesType {
			return
		}
		var f field
		each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
			if typ != protowire.BytesType {
				return
			}
			switch num {
			case 1:
				f.key = str(v)
			case 2:
				f.value = str(v)
			case 3:
				f.raw = v
			}
		})
		r.rawList = append(r.rawList, f)
	})
}

// each calls f with every field of the well-formed message b: its number,
// wire type, and its bytes (a length-delimited field's contents) or its
// varint's value.
func each(b []byte, f func(protowire.Number, protowire.Type, []byte, uint64)) {
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

// str is b as a string, without a copy: b is the request's, which
// outlives the call.
func str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// maxDepth is how deep wellFormed follows messages in messages; a deeper
// request is decoded whole.
const maxDepth = 32

// shape is what wellFormed needs of a message type, read once from its
// descriptor: its fields by number.
type shape struct {
	// vouch is whether wellFormed can vouch for the type: proto3, without
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
	msg   *shape
}

// newShape reads md's shape and those of the messages it holds.
func newShape(md protoreflect.MessageDescriptor) *shape {
	return buildShape(md, map[protoreflect.FullName]*shape{})
}

func buildShape(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*shape) *shape {
	if sh, ok := seen[md.FullName()]; ok {
		return sh
	}
	sh := &shape{vouch: md.ExtensionRanges().Len() == 0 && md.ParentFile().Syntax() == protoreflect.Proto3}
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

func (sh *shape) field(n protowire.Number) fieldShape {
	if int(n) < len(sh.fields) {
		return sh.fields[n]
	}
	return sh.sparse[n]
}

// wellFormed reports whether b is a message of shape sh that
// proto.Unmarshal decodes without an error, as far as it can tell: every
// field's tag and value parse; a known field's value of the wire type of
// its kind is valid (a proto3 string is UTF-8; a message is itself well
// formed); a field of another wire type, or an unknown one, is kept
// unknown by proto.Unmarshal and need only parse. What it does not follow
// (groups, a packed list, a message with extensions, a file not proto3,
// messages nested deeper than maxDepth) it does not vouch for.
func wellFormed(sh *shape, b []byte, depth int) bool {
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
		if f.str && !utf8.Valid(v) || f.msg != nil && !wellFormed(f.msg, v, depth+1) {
			return false
		}
	}
	return true
}

// wireType is the wire type of a value of kind k (a list's element, not
// packed); a group's is StartGroupType, which wellFormed does not follow.
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

// The field numbers of an OK CheckResponse, as appendOK writes it.
const (
	checkResponseStatus           = 1 // CheckResponse.status
	checkResponseOK               = 3 // CheckResponse.ok_response
	okResponseHeadersToAdd        = 6 // OkHttpResponse.response_headers_to_add
	headerValueOptionHeader       = 1 // HeaderValueOption.header
	headerValueOptionAppendAction = 3 // HeaderValueOption.append_action
	headerValueKey                = 1 // HeaderValue.key
	headerValueValue              = 2 // HeaderValue.value
	overwriteIfExistsOrAdd        = 2 // HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
)

// appendOK appends the encoding of the OK response with hs to add to the
// client's response, as proto.Marshal encodes response's.
func appendOK(b []byte, hs []decide.Header) []byte {
	b = protowire.AppendTag(b, checkResponseStatus, protowire.BytesType)
	b = protowire.AppendVarint(b, 0) // status: code OK, the default, and nothing else
	n := 0
	for _, h := range hs {
		n += headerOptionSize(h)
	}
	b = protowire.AppendTag(b, checkResponseOK, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	for _, h := range hs {
		b = protowire.AppendTag(b, okResponseHeadersToAdd, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(headerOptionLen(h)))
		b = protowire.AppendTag(b, headerValueOptionHeader, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(headerLen(h)))
		if len(h.Name) > 0 {
			b = protowire.AppendTag(b, headerValueKey, protowire.BytesType)
			b = protowire.AppendBytes(b, h.Name)
		}
		if len(h.Value) > 0 {
			b = protowire.AppendTag(b, headerValueValue, protowire.BytesType)
			b = protowire.AppendBytes(b, h.Value)
		}
		b = protowire.AppendTag(b, headerValueOptionAppendAction, protowire.VarintType)
		b = protowire.AppendVarint(b, overwriteIfExistsOrAdd)
	}
	return b
}

// headerLen is the length of h's HeaderValue.
func headerLen(h decide.Header) int {
	n := 0
	if len(h.Name) > 0 {
		n += protowire.SizeTag(headerValueKey) + protowire.SizeBytes(len(h.Name))
	}
	if len(h.Value) > 0 {
		n += protowire.SizeTag(headerValueValue) + protowire.SizeBytes(len(h.Value))
	}
	return n
}

// headerOptionLen is the length of h's HeaderValueOption.
func headerOptionLen(h decide.Header) int {
	return protowire.SizeTag(headerValueOptionHeader) + protowire.SizeBytes(headerLen(h)) +
		protowire.SizeTag(headerValueOptionAppendAction) + protowire.SizeVarint(overwriteIfExistsOrAdd)
}

// headerOptionSize is the size of h's HeaderValueOption as a field of
// OkHttpResponse: tag, length and message.
func headerOptionSize(h decide.Header) int {
	return protowire.SizeTag(okResponseHeadersToAdd) + protowire.SizeBytes(headerOptionLen(h))
}
