package handler

import (
	"net/netip"
	"strings"
	"testing"
)

var defaultTrusted = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fc00::/7"),
}

func TestClientIP(t *testing.T) {
	r := ipResolver{trusted: defaultTrusted}
	proxy := netip.MustParseAddr("10.0.0.2")
	stranger := netip.MustParseAddr("198.51.100.9")
	hugeXFF := strings.Repeat("10.1.1.1, ", 5000) + "10.0.0.9"
	tests := []struct {
		name   string
		xff    []string
		realIP string
		peer   netip.Addr
		want   string
	}{
		{"no headers: the peer", nil, "", proxy, "10.0.0.2"},
		{"one hop", []string{"203.0.113.7"}, "", proxy, "203.0.113.7"},
		{"client-sent entries left of the real one are ignored", []string{"1.1.1.1, 2.2.2.2, 203.0.113.7"}, "", proxy, "203.0.113.7"},
		{"trusted hops on the right are passed over", []string{"203.0.113.7, 10.0.0.5, 192.168.1.1"}, "", proxy, "203.0.113.7"},
		{"several header lines read as one list", []string{"1.1.1.1", "203.0.113.7, 10.0.0.5"}, "", proxy, "203.0.113.7"},
		{"an untrusted peer's headers are ignored", []string{"203.0.113.7"}, "203.0.113.8", stranger, "198.51.100.9"},
		{"X-Real-IP from a trusted peer without XFF", nil, "203.0.113.8", proxy, "203.0.113.8"},
		{"XFF wins over X-Real-IP", []string{"203.0.113.7"}, "203.0.113.8", proxy, "203.0.113.7"},
		{"an invalid X-Real-IP: the peer", nil, "not-an-ip", proxy, "10.0.0.2"},
		{"garbage left of a trusted hop: that hop", []string{"garbage, 10.0.0.5"}, "", proxy, "10.0.0.5"},
		{"garbage as the only entry: the peer", []string{"garbage"}, "", proxy, "10.0.0.2"},
		{"all hops trusted: the left-most", []string{"10.9.9.9, 10.0.0.5"}, "", proxy, "10.9.9.9"},
		{"empty entries are skipped", []string{" , 203.0.113.7 ,,"}, "", proxy, "203.0.113.7"},
		{"ports are dropped", []string{"203.0.113.7:5555"}, "", proxy, "203.0.113.7"},
		{"bracketed IPv6 with a port", []string{"[2001:db8::1]:443"}, "", proxy, "2001:db8::1"},
		{"bracketed IPv6", []string{"[2001:db8::1]"}, "", proxy, "2001:db8::1"},
		{"IPv4-mapped IPv6 is IPv4", []string{"::ffff:203.0.113.7"}, "", proxy, "203.0.113.7"},
		{"zones are dropped", []string{"fe80::1%eth0"}, "", proxy, "fe80::1"},
		{"a mapped peer is unmapped", nil, "", netip.MustParseAddr("::ffff:10.0.0.2"), "10.0.0.2"},
		{"a huge all-trusted header stops after maxHops", []string{hugeXFF}, "", proxy, "10.1.1.1"},
		{"a huge header ending in a client", []string{hugeXFF + ", 203.0.113.7"}, "", proxy, "203.0.113.7"},
		{"an overlong entry is not an address", []string{strings.Repeat("9", 100) + ", 10.0.0.5"}, "", proxy, "10.0.0.5"},
		{"non-UTF-8 bytes", []string{"\xff\xfe, 10.0.0.5"}, "", proxy, "10.0.0.5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var xff [][]byte
			for _, v := range tc.xff {
				xff = append(xff, []byte(v))
			}
			got := r.clientIP(xff, []byte(tc.realIP), tc.peer)
			if got.String() != tc.want {
				t.Errorf("clientIP(%.60q, %q, %v) = %v, want %s", tc.xff, tc.realIP, tc.peer, got, tc.want)
			}
		})
	}
}

func TestIPKeyGroupsByPrefix(t *testing.T) {
	tests := []struct {
		ip     string
		v4, v6 int
		want   string
	}{
		{"203.0.113.7", 32, 64, "203.0.113.7"},
		{"203.0.113.7", 24, 64, "203.0.113.0/24"},
		{"2001:db8:1:2:3:4:5:6", 32, 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff::1", 32, 64, "2001:db8:1:2::/64"},
		{"2001:db8::1", 32, 128, "2001:db8::1"},
		{"2001:db8:1:2:3:4:5:6", 32, 48, "2001:db8:1::/48"},
	}
	for _, tc := range tests {
		if got := ipKey(netip.MustParseAddr(tc.ip), tc.v4, tc.v6); got != tc.want {
			t.Errorf("ipKey(%s, /%d, /%d) = %q, want %q", tc.ip, tc.v4, tc.v6, got, tc.want)
		}
	}
}

func TestNormalizePath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/login", "/login"},
		{"/login?next=/admin", "/login"},
		{"/login#frag", "/login"},
		{"/LOGIN", "/LOGIN"},
		{"/log%69n", "/login"},
		{"/logi%6E", "/login"},
		{"//login", "/login"},
		{"/a//b///c", "/a/b/c"},
		{"/./login", "/login"},
		{"/x/../login", "/login"},
		{"/../../login", "/login"},
		{"/x/%2e%2e/login", "/login"},
		{"/x%2F..%2Flogin", "/login"},
		{"/login/", "/login/"},
		{"/login/.", "/login/"},
		{"/login/x/..", "/login/"},
		{"", "/"},
		{"?q=1", "/"},
		{"login", "/login"},
		{"http://example.com/login?x", "/login"},
		{"https://example.com", "/"},
		{"/%zz/login", "/%zz/login"},
		{"/%", "/%"},
		{"/a%00b", "/a\x00b"},
		{"/caf\xc3\xa9", "/caf\xc3\xa9"},
	}
	for _, tc := range tests {
		if got := normalizePath([]byte(tc.in)); got != tc.want {
			t.Errorf("normalizePath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNormalizeHost(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Example.COM", "example.com"},
		{"example.com:8080", "example.com"},
		{"example.com.", "example.com"},
		{"a.example.com, proxy.internal", "a.example.com"},
		{"[2001:db8::1]:443", "[2001:db8::1]"},
		{"  spaced.example  ", "spaced.example"},
		{"", ""},
	}
	for _, tc := range tests {
		if got := normalizeHost([]byte(tc.in)); got != tc.want {
			t.Errorf("normalizeHost(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestPathHasPrefix(t *testing.T) {
	tests := []struct {
		path, prefix string
		want         bool
	}{
		{"/login", "/login", true},
		{"/login/step2", "/login", true},
		{"/logins", "/login", false},
		{"/api/v1", "/api/", true},
		{"/api", "/api/", false},
		{"/", "/", true},
		{"/x", "/", true},
	}
	for _, tc := range tests {
		if got := pathHasPrefix(tc.path, tc.prefix); got != tc.want {
			t.Errorf("pathHasPrefix(%q, %q) = %v, want %v", tc.path, tc.prefix, got, tc.want)
		}
	}
}
