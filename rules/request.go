package rules

import (
	"bytes"
	"net/netip"
	"unsafe"
)

// This file reads what the proxy forwards about the original request: the
// client's address, the method, the path and the host, each normalized the
// way common backends read them, so that a request reaches every rule that
// a backend would route it under. Every function takes client-controlled
// bytes, has a defined answer for any input, and appends to a caller's
// buffer instead of allocating.

// Request is what the rules see of one request, normalized.
type Request struct {
	Method    []byte // upper case: AppendMethod
	Path      []byte // normalized: AppendPath
	Host      []byte // normalized: AppendHost
	ClientKey []byte // the client IP as the ip key part counts it: AppendClientKey
	Header    Headers
}

// Headers gives a request's headers.
type Headers interface {
	// Lookup returns how many times the named header occurs in the
	// request (names compared without regard to case and with '-' and
	// '_' alike, every line counted, an empty one too) and, when it
	// occurs once, its value.
	// The value is valid until the next call.
	Lookup(name string) (value []byte, n int)
}

// CountHeader counts the lines of a raw header block ("Name: value" lines
// ending in CRLF or LF, as a request carries them, without its request
// line) that give the named header, names compared without regard to case
// and with '-' and '_' alike (see sameHeader).
// A line starting with a space or a tab continues the previous one and is
// not counted. A server's header API may keep one value of a header it
// parses itself (fasthttp does for User-Agent, Content-Type, Host and
// others): the raw block tells how many the client sent.
func CountHeader(raw []byte, name string) int {
	n := 0
	for len(raw) > len(name) {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) > len(name) && line[len(name)] == ':' && SameHeader(line[:len(name)], name) {
			n++
		}
	}
	return n
}

// LookupHeader implements Headers.Lookup for a server that parses headers:
// raw is the request's raw header block (as CountHeader reads it; empty
// for a request built in memory), parsed the server's values of the header
// under name itself. It returns how many times the header occurs, names
// compared as CountHeader compares them, and, when it occurs once, its
// value: parsed's, or, for a line under another spelling (X_Api_Key for
// X-Api-Key), the line's, without the spaces and tabs around it.
func LookupHeader(raw []byte, name string, parsed [][]byte) ([]byte, int) {
	n := len(parsed)
	if len(raw) > 0 {
		n = max(n, CountHeader(raw, name))
	}
	switch {
	case n != 1:
		return nil, n
	case len(parsed) == 1:
		return parsed[0], 1
	}
	for len(raw) > len(name) {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) > len(name) && line[len(name)] == ':' && SameHeader(line[:len(name)], name) {
			return bytes.Trim(line[len(name)+1:], " \t\r"), 1
		}
	}
	return nil, 1
}

// SameHeader reports whether b and s name one header: equal in ASCII
// without regard to case, '-' and '_' alike. CGI-style backends (WSGI,
// PHP-FPM, Rack) read X-Api-Key and X_Api_Key as one variable,
// HTTP_X_API_KEY, and proxies that do not drop names with '_' (Caddy,
// Traefik) forward both.
func SameHeader(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if foldHeaderByte(b[i]) != foldHeaderByte(s[i]) {
			return false
		}
	}
	return true
}

func foldHeaderByte(c byte) byte {
	switch {
	case 'A' <= c && c <= 'Z':
		return c + 'a' - 'A'
	case c == '_':
		return '-'
	}
	return c
}

// maxMethod bounds a method: no real one is longer, and a huge header stays
// cheap.
const maxMethod = 32

// AppendMethod appends the method, in upper case, at most 32 bytes of it.
func AppendMethod(dst, m []byte) []byte {
	if len(m) > maxMethod {
		m = m[:maxMethod]
	}
	for _, c := range m {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

var (
	schemeSep = []byte("://")
	rootPath  = []byte("/")
)

// AppendPath appends the path rules match on, from a request URI, resolved
// the way nginx and common backends resolve it, so that a client cannot
// dodge a path rule with another spelling of the same path:
//
//   - an absolute URI ("http://host/p") gives its path;
//   - the query and fragment are dropped;
//   - percent-escapes are decoded ("/log%69n" is "/login"); an invalid
//     escape is kept as it is;
//   - a backslash is a slash, as IIS and ASP.NET read it;
//   - path parameters are dropped from every segment ("/login;jsessionid=1"
//     and "/admin/..;/x" are "/login" and "/x"), as Tomcat, Jetty and Spring
//     drop them;
//   - runs of slashes become one, and "." and ".." segments are resolved
//     ("/a/../login" is "/login", and ".." never climbs above "/");
//   - letters are in lower case ("/LOGIN" is "/login"), as Express and
//     ASP.NET match routes;
//   - anything that does not start with "/" gets one.
//
// A trailing slash stays ("/login/" may differ from "/login" to a backend);
// path= prefixes match whole segments, so "/login" covers both, and a
// regular expression is matched against the path with and without it.
func AppendPath(dst, uri []byte) []byte {
	if i := bytes.IndexAny(uri, "?#"); i >= 0 {
		uri = uri[:i]
	}
	if i := bytes.Index(uri, schemeSep); i >= 0 && bytes.IndexByte(uri[:i], '/') < 0 {
		rest := uri[i+3:]
		if j := bytes.IndexByte(rest, '/'); j >= 0 {
			uri = rest[j:]
		} else {
			uri = nil
		}
	}
	start := len(dst)
	dst = append(dst, '/')
	for i := 0; i < len(uri); i++ {
		c := uri[i]
		if c == '%' && i+2 < len(uri) && isHex(uri[i+1]) && isHex(uri[i+2]) {
			c = unhex(uri[i+1])<<4 | unhex(uri[i+2])
			i += 2
		}
		switch {
		case c == '\\':
			c = '/'
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	// Resolve the segments in place: what is written never overtakes what
	// is read, since no segment grows.
	in := dst[start+1:]
	w, segs, trailing := start+1, 0, false
	for {
		j := bytes.IndexByte(in, '/')
		seg := in
		if j >= 0 {
			seg = in[:j]
		}
		if k := bytes.IndexByte(seg, ';'); k >= 0 {
			seg = seg[:k]
		}
		switch {
		case len(seg) == 0 || len(seg) == 1 && seg[0] == '.':
			trailing = true
		case len(seg) == 2 && seg[0] == '.' && seg[1] == '.':
			if segs > 0 {
				segs--
				if p := bytes.LastIndexByte(dst[start+1:w], '/'); p >= 0 {
					w = start + 1 + p
				} else {
					w = start + 1
				}
			}
			trailing = true
		default:
			if segs > 0 {
				dst[w] = '/'
				w++
			}
			w += copy(dst[w:], seg)
			segs++
			trailing = false
		}
		if j < 0 {
			break
		}
		in = in[j+1:]
	}
	dst = dst[:w]
	if segs > 0 && trailing {
		dst = append(dst, '/')
	}
	return dst
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// AppendHost appends a Host or X-Forwarded-Host value as rules match it: the
// first of a comma-separated list, in lower case, without a port or a
// trailing dot; an IPv6 literal keeps its brackets.
func AppendHost(dst, b []byte) []byte {
	if i := bytes.IndexByte(b, ','); i >= 0 {
		b = b[:i]
	}
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		if i := bytes.IndexByte(b, ']'); i > 0 {
			b = b[:i+1]
		}
		return appendLower(dst, b)
	}
	if i := bytes.LastIndexByte(b, ':'); i >= 0 && bytes.IndexByte(b, ':') == i {
		b = b[:i]
	}
	b = bytes.TrimSuffix(b, []byte("."))
	return appendLower(dst, b)
}

func appendLower(dst, b []byte) []byte {
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// SplitURL splits an absolute URL, as ingress-nginx sends it in
// X-Original-URL ("https://api.example.com:8443/login?x=1"), into its host
// (with any port; without user information) and its request URI (from the
// first "/" on; "/" if there is none). It reports false for anything else,
// and for a URL without a host.
//
// ingress-nginx writes the client's Host header into the URL
// ($scheme://$http_host$request_uri). nginx refuses a Host with a "/", but
// not one with a "?" or a "#", so the path starts at the first "/": a Host
// header of "api.example.com?" cannot turn "/login" into a query. A "?" or
// a "#" before that "/" ends the host.
func SplitURL(u []byte) (host, uri []byte, ok bool) {
	i := bytes.Index(u, schemeSep)
	if i <= 0 || bytes.ContainsAny(u[:i], "/?#") {
		return nil, nil, false
	}
	rest := u[i+3:]
	host, uri = rest, rootPath
	if end := bytes.IndexByte(rest, '/'); end >= 0 {
		host, uri = rest[:end], rest[end:]
	}
	if end := bytes.IndexAny(host, "?#"); end >= 0 {
		host = host[:end]
	}
	if at := bytes.LastIndexByte(host, '@'); at >= 0 {
		host = host[at+1:]
	}
	return host, uri, len(host) > 0
}

// AppendClientKey appends the client's address as the ip key part counts
// it: IPv4 grouped by v4bits, IPv6 by v6bits (a subscriber holds a whole
// /64, so counting single addresses would give one client 2^64 quotas).
func AppendClientKey(dst []byte, a netip.Addr, v4bits, v6bits int) []byte {
	bits := v6bits
	if a.Is4() {
		bits = v4bits
	}
	if bits >= a.BitLen() {
		return a.AppendTo(dst)
	}
	p, _ := a.Prefix(bits)
	return p.AppendTo(dst)
}

// maxHops bounds how many X-Forwarded-For entries are examined, from the
// right, so a huge header costs bounded work.
const maxHops = 32

// Proxies finds the client's address behind trusted proxies.
type Proxies struct {
	// Trusted are the proxies' addresses. An empty list trusts no peer:
	// forwarded headers are never believed.
	Trusted []netip.Prefix
}

// Trusts reports whether a is a trusted proxy.
func (p *Proxies) Trusts(a netip.Addr) bool {
	for _, t := range p.Trusted {
		if t.Contains(a) {
			return true
		}
	}
	return false
}

// ClientIP returns the client's address. The chain of hops is the
// X-Forwarded-For entries, left to right, followed by the TCP peer. Walking
// from the right, every hop that is a trusted proxy is passed over; the
// first that is not is the client, because a trusted proxy appended it and
// only entries to its left are client-controlled. If the walk reaches an
// entry that is not an IP address, or runs past maxHops, the client is the
// last hop passed over (a trusted address, at worst the peer). X-Real-IP is
// used only when there is no X-Forwarded-For and the peer is trusted.
func (p *Proxies) ClientIP(xff [][]byte, realIP []byte, peer netip.Addr) netip.Addr {
	peer = peer.Unmap()
	if !p.Trusts(peer) {
		return peer
	}
	if len(xff) == 0 {
		if a, ok := ParseIP(realIP); ok {
			return a
		}
		return peer
	}
	client, hops := peer, 0
	for h := len(xff) - 1; h >= 0; h-- {
		v := xff[h]
		for len(v) > 0 {
			var entry []byte
			if i := bytes.LastIndexByte(v, ','); i >= 0 {
				entry, v = v[i+1:], v[:i]
			} else {
				entry, v = v, nil
			}
			entry = bytes.TrimSpace(entry)
			if len(entry) == 0 {
				continue // "a,,b" or a trailing comma: no hop
			}
			a, ok := ParseIP(entry)
			if hops++; !ok || hops > maxHops {
				return client
			}
			client = a
			if !p.Trusts(a) {
				return a
			}
		}
	}
	return client
}

// ParseIP reads an address as proxies write it: "203.0.113.7",
// "2001:db8::1", "[2001:db8::1]", with or without a port. Zones are dropped
// and IPv4-mapped IPv6 addresses become IPv4.
func ParseIP(b []byte) (netip.Addr, bool) {
	if len(b) == 0 || len(b) > 64 {
		return netip.Addr{}, false
	}
	if b[0] == '[' {
		end := bytes.IndexByte(b, ']')
		if end < 0 || end+1 < len(b) && (b[end+1] != ':' || !digits(b[end+2:])) {
			return netip.Addr{}, false
		}
		b = b[1:end]
	} else if i := bytes.LastIndexByte(b, ':'); i >= 0 && bytes.IndexByte(b, ':') == i {
		// One colon: an IPv4 address with a port.
		if !digits(b[i+1:]) {
			return netip.Addr{}, false
		}
		b = b[:i]
	}
	// The string aliases b only for the parse: the zone, the one part of
	// the result that would keep it, is dropped, and so is any error.
	a, err := netip.ParseAddr(unsafe.String(unsafe.SliceData(b), len(b)))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

func digits(b []byte) bool {
	if len(b) == 0 || len(b) > 5 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
