package extauthz

import (
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/internal/pbwire"
)

// readRequest reads the CheckRequest encoded in b into r as fromMessage
// reads the decoded message, without decoding it: r's strings point into
// b. It reports false, with r unspecified, when it cannot vouch that
// proto.Unmarshal decodes b without an error but for strings that are not
// UTF-8, which it reads as the bytes Envoy sent (see pbwire.Readable; sh
// is CheckRequest's shape): the caller then decodes it whole.
func readRequest(r *request, b []byte, sh *pbwire.Shape) bool {
	if !pbwire.Readable(sh, b) {
		return false
	}
	r.reset()
	// Every message below is read where it occurs: a singular message
	// that occurs twice is merged, as proto.Unmarshal merges it, its
	// scalars the last seen, its lists and maps added to.
	pbwire.Each(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
		if num == 1 && typ == protowire.BytesType { // attributes
			pbwire.Each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
				switch {
				case num == 1 && typ == protowire.BytesType: // source
					pbwire.Each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
						if num == 1 && typ == protowire.BytesType { // address
							readAddress(r, v)
						}
					})
				case num == 4 && typ == protowire.BytesType: // request
					pbwire.Each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
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
	pbwire.Each(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
		if typ != protowire.BytesType {
			return
		}
		switch num {
		case 1: // socket_address
			if !r.socket {
				r.socket, r.source = true, ""
			}
			pbwire.Each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
				if num == 2 && typ == protowire.BytesType { // address
					r.source = pbwire.Str(v)
				}
			})
		case 2, 3: // pipe, envoy_internal_address
			r.socket, r.source = false, ""
		}
	})
}

// readHTTP reads an AttributeContext.HttpRequest.
func readHTTP(r *request, b []byte) {
	pbwire.Each(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) {
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
			r.method = pbwire.Str(v)
		case 4:
			r.path = pbwire.Str(v)
		case 5:
			r.host = pbwire.Str(v)
		case 3: // headers, a map entry: key 1, value 2
			var k, val string
			pbwire.Each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
				if typ == protowire.BytesType && num == 1 {
					k = pbwire.Str(v)
				} else if typ == protowire.BytesType && num == 2 {
					val = pbwire.Str(v)
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
	pbwire.Each(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
		if num != 1 || typ != protowire.BytesType {
			return
		}
		var f field
		pbwire.Each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
			if typ != protowire.BytesType {
				return
			}
			switch num {
			case 1:
				f.key = pbwire.Str(v)
			case 2:
				f.value = pbwire.Str(v)
			case 3:
				f.raw = v
			}
		})
		r.rawList = append(r.rawList, f)
	})
}

// The field numbers of an OK CheckResponse, as appendOK writes it.
const (
	checkResponseStatus           = 1 // CheckResponse.status
	checkResponseOK               = 3 // CheckResponse.ok_response
	okResponseHeadersToAdd        = 6 // OkHttpResponse.response_headers_to_add
	headerValueOptionHeader       = 1 // HeaderValueOption.header
	headerValueOptionAppendAction = 3 // HeaderValueOption.append_action
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
		b = appendHeaderOption(b, okResponseHeadersToAdd, h)
	}
	return b
}

// headerOptionLen is the length of h's HeaderValueOption.
func headerOptionLen(h decide.Header) int {
	return protowire.SizeTag(headerValueOptionHeader) + protowire.SizeBytes(pbwire.HeaderValueLen(h.Name, h.Value)) +
		protowire.SizeTag(headerValueOptionAppendAction) + protowire.SizeVarint(overwriteIfExistsOrAdd)
}

// headerOptionSize is the size of h's HeaderValueOption as a field of
// OkHttpResponse or DeniedHttpResponse (both fields of a number below 16):
// tag, length and message.
func headerOptionSize(h decide.Header) int {
	return protowire.SizeTag(okResponseHeadersToAdd) + protowire.SizeBytes(headerOptionLen(h))
}

// The field numbers of a denied CheckResponse, as appendDenied writes it.
const (
	checkResponseDenied = 2 // CheckResponse.denied_response
	rpcStatusCode       = 1 // google.rpc.Status.code
	rpcStatusMessage    = 2 // google.rpc.Status.message
	deniedStatus        = 1 // DeniedHttpResponse.status
	deniedHeaders       = 2 // DeniedHttpResponse.headers
	deniedBody          = 3 // DeniedHttpResponse.body
	httpStatusCode      = 1 // type.v3.HttpStatus.code
)

// appendDenied appends the encoding of the denied response to out (not
// admitted), as proto.Marshal encodes response's: the status with the
// verdict's code and the problem's kind, the HTTP status, the headers
// and the problem's Content-Type, and the body.
func appendDenied(b []byte, out *decide.Outcome) []byte {
	c, kind := int64(int32(code(out.Verdict))), out.Kind
	n := 0
	if c != 0 {
		n += protowire.SizeTag(rpcStatusCode) + protowire.SizeVarint(uint64(c))
	}
	if kind != "" {
		n += protowire.SizeTag(rpcStatusMessage) + protowire.SizeBytes(len(kind))
	}
	b = protowire.AppendTag(b, checkResponseStatus, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	if c != 0 {
		b = protowire.AppendTag(b, rpcStatusCode, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(c))
	}
	if kind != "" {
		b = protowire.AppendTag(b, rpcStatusMessage, protowire.BytesType)
		b = protowire.AppendString(b, kind)
	}

	st := int64(int32(out.Status))
	stLen := 0
	if st != 0 {
		stLen = protowire.SizeTag(httpStatusCode) + protowire.SizeVarint(uint64(st))
	}
	ct := decide.Header{Name: []byte("Content-Type"), Value: []byte("application/problem+json")}
	n = protowire.SizeTag(deniedStatus) + protowire.SizeBytes(stLen) + headerOptionSize(ct)
	for _, h := range out.Headers {
		n += headerOptionSize(h)
	}
	if len(out.Body) > 0 {
		n += protowire.SizeTag(deniedBody) + protowire.SizeBytes(len(out.Body))
	}
	b = protowire.AppendTag(b, checkResponseDenied, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = protowire.AppendTag(b, deniedStatus, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(stLen))
	if st != 0 {
		b = protowire.AppendTag(b, httpStatusCode, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(st))
	}
	for _, h := range out.Headers {
		b = appendHeaderOption(b, deniedHeaders, h)
	}
	b = appendHeaderOption(b, deniedHeaders, ct)
	if len(out.Body) > 0 {
		b = protowire.AppendTag(b, deniedBody, protowire.BytesType)
		b = protowire.AppendBytes(b, out.Body)
	}
	return b
}

// appendHeaderOption appends h as field num, a HeaderValueOption that
// overwrites a header of the same name.
func appendHeaderOption(b []byte, num protowire.Number, h decide.Header) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(headerOptionLen(h)))
	b = protowire.AppendTag(b, headerValueOptionHeader, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(pbwire.HeaderValueLen(h.Name, h.Value)))
	b = pbwire.AppendHeaderValue(b, h.Name, h.Value)
	b = protowire.AppendTag(b, headerValueOptionAppendAction, protowire.VarintType)
	return protowire.AppendVarint(b, overwriteIfExistsOrAdd)
}
