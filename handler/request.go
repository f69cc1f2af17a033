package handler

import (
	"bytes"
	"net/netip"
	"strings"
)

// This file reads what the proxy forwards about the original request: the
// client's address, the method, the path and the host. Every function here
// takes client-controlled bytes and has a defined answer for any input.

// maxHops bounds how many X-Forwarded-For entries are examined, from the
// right, so a huge header costs bounded work.
const maxHops = 32

// ipResolver finds the client's address behind trusted proxies.
type ipResolver struct {
	trusted []netip.Prefix
}

func (r *ipResolver) isTrusted(a netip.Addr) bool { return contains(r.trusted, a) }

// clientIP returns the client's address. The chain of hops is the
// X-Forwarded-For entries, left to right, followed by the TCP peer. Walking
// from the right, every hop that is a trusted proxy is passed over; the
// first that is not is the client, because a trusted proxy appended it and
// only entries to its left are client-controlled. If the walk reaches an
// entry that is not an IP address, or runs past maxHops, the client is the
// last hop passed over (a trusted address, at worst the peer). X-Real-IP is
// used only when there is no X-Forwarded-For and the peer is trusted.
func (r *ipResolver) clientIP(xff [][]byte, realIP []byte, peer netip.Addr) netip.Addr {
	peer = peer.Unmap()
	if !r.isTrusted(peer) {
		return peer
	}
	if len(xff) == 0 {
		if a, ok := parseIP(realIP); ok {
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
			a, ok := parseIP(entry)
			if hops++; !ok || hops > maxHops {
				return client
			}
			client = a
			if !r.isTrusted(a) {
				return a
			}
		}
	}
	return client
}

// parseIP reads an address as proxies write it: "203.0.113.7",
// "2001:db8::1", "[2001:db8::1]", with or without a port. Zones are dropped
// and IPv4-mapped IPv6 addresses become IPv4.
func parseIP(b []byte) (netip.Addr, bool) {
	if len(b) == 0 || len(b) > 64 {
		return netip.Addr{}, false
	}
	s := string(b)
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err2 := netip.ParseAddrPort(s)
		if err2 != nil {
			if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
				a, err = netip.ParseAddr(s[1 : len(s)-1])
			}
			if err != nil {
				return netip.Addr{}, false
			}
		} else {
			a = ap.Addr()
		}
	}
	return a.WithZone("").Unmap(), true
}

// ipKey groups an address the way the ip key part counts it: IPv4 by
// v4bits, IPv6 by v6bits (a /64 is one subscriber).
func ipKey(a netip.Addr, v4bits, v6bits int) string {
	bits := v6bits
	if a.Is4() {
		bits = v4bits
	}
	if bits >= a.BitLen() {
		return a.String()
	}
	p, _ := a.Prefix(bits)
	return p.String()
}

// normalizePath turns the original request URI into the path rules match
// on, the way nginx and most backends resolve it, so that a client cannot
// dodge a path rule with another spelling of the same path:
//
//   - an absolute URI ("http://host/p") gives its path;
//   - the query and fragment are dropped;
//   - percent-escapes are decoded ("/log%69n" is "/login"); an invalid
//     escape is kept as it is;
//   - runs of slashes become one, and "." and ".." segments are resolved
//     ("/a/../login" is "/login", and ".." never climbs above "/");
//   - anything that does not start with "/" gets one.
func normalizePath(uri []byte) string {
	if i := bytes.IndexAny(uri, "?#"); i >= 0 {
		uri = uri[:i]
	}
	if i := bytes.Index(uri, []byte("://")); i >= 0 && bytes.IndexByte(uri[:i], '/') < 0 {
		rest := uri[i+3:]
		if j := bytes.IndexByte(rest, '/'); j >= 0 {
			uri = rest[j:]
		} else {
			uri = nil
		}
	}
	decoded := make([]byte, 0, len(uri)+1)
	for i := 0; i < len(uri); i++ {
		c := uri[i]
		if c == '%' && i+2 < len(uri) && isHex(uri[i+1]) && isHex(uri[i+2]) {
			decoded = append(decoded, unhex(uri[i+1])<<4|unhex(uri[i+2]))
			i += 2
			continue
		}
		decoded = append(decoded, c)
	}
	segs := make([]string, 0, 8)
	for _, seg := range strings.Split(string(decoded), "/") {
		switch seg {
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			segs = append(segs, seg)
		}
	}
	path := "/" + strings.Join(segs, "/")
	// A trailing slash is part of the path ("/login/" may differ from
	// "/login" to a backend); keep it when there is one.
	if len(segs) > 0 && len(decoded) > 0 && (decoded[len(decoded)-1] == '/' || bytes.HasSuffix(decoded, []byte("/.")) || bytes.HasSuffix(decoded, []byte("/.."))) {
		path += "/"
	}
	return path
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

// normalizeHost reads a Host or X-Forwarded-Host value: the first of a
// comma-separated list, lower case, without a port or a trailing dot.
func normalizeHost(b []byte) string {
	if i := bytes.IndexByte(b, ','); i >= 0 {
		b = b[:i]
	}
	h := strings.ToLower(string(bytes.TrimSpace(b)))
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			return h[:i+1]
		}
		return h
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.IndexByte(h, ':') == i {
		h = h[:i]
	}
	return strings.TrimSuffix(h, ".")
}
