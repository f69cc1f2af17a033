package spoa

import (
	"bytes"
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/authlimit/authlimit/rules"
)

// MessageName is the SPOE message the agent decides on
// (haproxy/spoe-authlimit.conf's spoe-message section). A NOTIFY frame may
// carry other messages: they are skipped.
const MessageName = "authlimit"

// The arguments of the message, by name (see the package's documentation);
// others are skipped.
const (
	argSrc     = "src"     // the client address HAProxy sees: IPv4, IPv6, or null
	argMethod  = "method"  // the method: a string
	argURL     = "url"     // the request target (url): a string
	argHost    = "host"    // the Host header (req.hdr(host)): a string, or null
	argHTTPS   = "https"   // whether the client came over TLS (ssl_fc)
	argHeaders = "headers" // every header line (req.hdrs_bin)
)

// request is what the agent reads of the authlimit message: views of the
// frame, valid while it is.
type request struct {
	src    netip.Addr // invalid when HAProxy sent none
	method []byte
	url    []byte
	// uri is the path and query of url, as HAProxy's pathq gives them;
	// url itself when it has no path ("*").
	uri   []byte
	host  []byte
	block []byte // req.hdrs_bin, checked

	hasMethod, hasURL, hasHost, hasBlock, https bool
}

// readRequest reads the authlimit message of a NOTIFY frame's
// LIST-OF-MESSAGES into r. On a malformed list, a missing message, or a
// missing or mistyped argument, it returns the problem's kind and detail
// (see decide.Input.Invalid).
func readRequest(msgs []byte, r *request) (kind, detail string) {
	*r = request{}
	found := false
	for len(msgs) > 0 {
		m, n := readMessage(msgs)
		if n == 0 {
			return "invalid-message", "The SPOE frame's messages are malformed."
		}
		msgs = msgs[n:]
		if string(m.name) != MessageName || found {
			continue
		}
		found = true
		if arg := r.readArgs(m); arg != "" {
			return "invalid-message", fmt.Sprintf("The SPOE message %q has a %s argument of the wrong type (see haproxy/spoe-authlimit.conf).", MessageName, arg)
		}
	}
	switch {
	case !found:
		return "invalid-message", fmt.Sprintf("The SPOE frame has no message %q (see haproxy/spoe-authlimit.conf).", MessageName)
	case !r.hasMethod || !r.hasURL || !r.hasBlock:
		return "invalid-message", fmt.Sprintf("The SPOE message %q lacks its method, url or headers argument (see haproxy/spoe-authlimit.conf).", MessageName)
	}
	r.uri = pathq(r.url)
	return "", ""
}

// pathq is the path and query of a request target, as HAProxy's pathq
// fetch finds them: the target itself in origin form ("/a?b"), from the
// first "/" after the authority in absolute form ("http://h/a?b", as
// HAProxy writes an HTTP/2 request's); a target without a path ("*",
// "http://h") is kept whole, as haproxy/authlimit.lua sends it.
func pathq(target []byte) []byte {
	if len(target) > 0 && target[0] == '/' {
		return target
	}
	scheme, rest, ok := bytes.Cut(target, []byte("://"))
	if !ok || bytes.IndexByte(scheme, '/') >= 0 {
		return target
	}
	if i := bytes.IndexByte(rest, '/'); i >= 0 {
		return rest[i:]
	}
	return target
}

// readArgs reads a message's arguments into r, and returns the name of one
// whose value has a type it cannot take, or "". A null value is an
// argument HAProxy could not fetch: absent.
func (r *request) readArgs(m message) string {
	p := m.args
	for i := 0; i < m.nargs; i++ {
		a, n := readArg(p)
		p = p[n:]
		v := a.v
		if v.typ == dataNull {
			continue
		}
		switch string(a.name) {
		case argSrc:
			switch v.typ {
			case dataIPv4:
				r.src = netip.AddrFrom4([4]byte(v.b))
			case dataIPv6:
				r.src = netip.AddrFrom16([16]byte(v.b)).Unmap()
			default:
				return argSrc
			}
		case argMethod:
			if v.typ != dataString && v.typ != dataBinary {
				return argMethod
			}
			r.method, r.hasMethod = v.b, true
		case argURL:
			if v.typ != dataString && v.typ != dataBinary {
				return argURL
			}
			r.url, r.hasURL = v.b, true
		case argHost:
			if v.typ != dataString && v.typ != dataBinary {
				return argHost
			}
			r.host, r.hasHost = v.b, true
		case argHTTPS:
			if v.typ != dataBool && !v.isInt() {
				return argHTTPS
			}
			r.https = v.n != 0
		case argHeaders:
			if v.typ != dataBinary && v.typ != dataString || !validBlock(v.b) {
				return argHeaders
			}
			r.block, r.hasBlock = v.b, true
		}
	}
	return ""
}

// nextHeader reads the first header of a req.hdrs_bin block (a name and a
// value, each a varint length and its bytes; two empty ones end the
// block): the header and the rest, end at the end, ok false if it is
// malformed.
func nextHeader(b []byte) (name, value, rest []byte, end, ok bool) {
	name, k := readBytes(b)
	if k == 0 {
		return nil, nil, nil, false, false
	}
	value, k2 := readBytes(b[k:])
	if k2 == 0 {
		return nil, nil, nil, false, false
	}
	rest = b[k+k2:]
	if len(name) == 0 {
		return nil, nil, rest, true, len(value) == 0 && len(rest) == 0
	}
	return name, value, rest, false, true
}

// validBlock reports whether b is a whole req.hdrs_bin block: headers with
// names, then the end and nothing after.
func validBlock(b []byte) bool {
	for {
		_, _, rest, end, ok := nextHeader(b)
		switch {
		case !ok:
			return false
		case end:
			return true
		}
		b = rest
	}
}

// headers gives the rules a request as HAProxy asked about it, with the
// meaning /auth gives the request haproxy/authlimit.lua sends for it:
//
//   - X-Forwarded-For, -Method, -Uri, -Host and -Proto are HAProxy's own
//     (the client address, the method, the path and query (see pathq),
//     the Host header, http or https), whatever the client sent under
//     those names;
//   - Content-Length and X-Original-Content-Length are the request's
//     Content-Length header, the body's length as HAProxy forwards it
//     (absent for a chunked body);
//   - the client's other X-Forwarded-* and X-Original-* headers, X-Real-IP,
//     Forwarded and the hop-by-hop headers are absent;
//   - every other header is the client's, every line counted, names
//     compared as /auth compares them (case and '-' or '_' alike), Host
//     included.
type headers struct {
	req   *request
	xff   []byte // the client address as text; empty when HAProxy sent none
	proto []byte
}

var (
	protoHTTP  = []byte("http")
	protoHTTPS = []byte("https")
)

// hidden are the client's headers the rules never see (authlimit.lua
// drops them), besides X-Forwarded-* and X-Original-*.
var hidden = []string{"x-real-ip", "forwarded", "transfer-encoding", "connection", "keep-alive",
	"proxy-connection", "te", "trailer", "upgrade", "expect"}

// Lookup implements rules.Headers.
func (h *headers) Lookup(name string) ([]byte, int) {
	n := view(name)
	switch {
	case rules.SameHeader(n, "x-forwarded-for"):
		return one(h.xff)
	case rules.SameHeader(n, "x-forwarded-method"):
		return h.req.method, 1
	case rules.SameHeader(n, "x-forwarded-uri"):
		return h.req.uri, 1
	case rules.SameHeader(n, "x-forwarded-host"):
		if !h.req.hasHost {
			return nil, 0
		}
		return h.req.host, 1
	case rules.SameHeader(n, "x-forwarded-proto"):
		return h.proto, 1
	case rules.SameHeader(n, "content-length"), rules.SameHeader(n, "x-original-content-length"):
		return h.count("content-length")
	case foldPrefix(n, "x-forwarded-"), foldPrefix(n, "x-original-"):
		return nil, 0
	}
	for _, x := range hidden {
		if rules.SameHeader(n, x) {
			return nil, 0
		}
	}
	return h.count(name)
}

// count looks name up in the client's header lines.
func (h *headers) count(name string) ([]byte, int) {
	var val []byte
	n := 0
	b := h.req.block
	for {
		k, v, rest, end, ok := nextHeader(b)
		if end || !ok {
			break
		}
		if rules.SameHeader(k, name) {
			if n++; n == 1 {
				val = v
			}
		}
		b = rest
	}
	if n != 1 {
		return nil, n
	}
	return val, 1
}

func one(b []byte) ([]byte, int) {
	if len(b) == 0 {
		return nil, 0
	}
	return b, 1
}

// foldPrefix reports whether b starts with prefix, compared as
// rules.SameHeader compares names.
func foldPrefix(b []byte, prefix string) bool {
	return len(b) >= len(prefix) && rules.SameHeader(b[:len(prefix)], prefix)
}

// view is s as bytes, without a copy, for reading only.
func view(s string) []byte {
	if s == "" {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}
