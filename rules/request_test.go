package rules

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
	r := Proxies{Trusted: defaultTrusted}
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
			got := r.ClientIP(xff, []byte(tc.realIP), tc.peer)
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
		if got := string(AppendClientKey(nil, netip.MustParseAddr(tc.ip), tc.v4, tc.v6)); got != tc.want {
			t.Errorf("AppendClientKey(%s, /%d, /%d) = %q, want %q", tc.ip, tc.v4, tc.v6, got, tc.want)
		}
	}
}

func TestAppendPath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/login", "/login"},
		{"/login?next=/admin", "/login"},
		{"/login#frag", "/login"},
		{"/LOGIN", "/login"},
		{"/Log%49n", "/login"},
		{"/login;a=1", "/login"},
		{"/login;a=1/x", "/login/x"},
		{"/admin/..;/login", "/login"},
		{"/x/.;a/login", "/x/login"},
		{"/;x/login", "/login"},
		{"/login%3Bjsessionid=1", "/login"},
		{"\\login", "/login"},
		{"/x\\..\\login", "/login"},
		{"/a/b/c/../../../../login", "/login"},
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
		{"/CAF\xc3\x89", "/caf\xc3\x89"},
	}
	for _, tc := range tests {
		if got := string(AppendPath([]byte("prefix"), []byte(tc.in))); got != "prefix"+tc.want {
			t.Errorf("AppendPath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestAppendHost(t *testing.T) {
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
		if got := string(AppendHost(nil, []byte(tc.in))); got != tc.want {
			t.Errorf("AppendHost(%q) = %q, want %q", tc.in, got, tc.want)
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
		if got := pathHasPrefix([]byte(tc.path), []byte(tc.prefix)); got != tc.want {
			t.Errorf("pathHasPrefix(%q, %q) = %v, want %v", tc.path, tc.prefix, got, tc.want)
		}
	}
}

func TestSplitURL(t *testing.T) {
	tests := []struct {
		in, host, uri string
		ok            bool
	}{
		{"https://api.example.com/login?x=1", "api.example.com", "/login?x=1", true},
		{"http://API.example.com:8080/a/b", "API.example.com:8080", "/a/b", true},
		{"http://user:pw@host/x", "host", "/x", true},
		{"http://host", "host", "/", true},
		{"http://host?q", "host", "/", true},
		{"http://host#f", "host", "/", true},
		// ingress-nginx writes $scheme://$http_host$request_uri: a Host
		// header may hold "?" or "#" (not "/"), which end the host but
		// never move the path.
		{"http://api.example.com?/login", "api.example.com", "/login", true},
		{"http://api.example.com#/login?x", "api.example.com", "/login?x", true},
		{"http://api.example.com?x/login", "api.example.com", "/login", true},
		{"http://evil@api.example.com/x", "api.example.com", "/x", true},
		{"http://?/login", "", "", false},
		{"http://[2001:db8::1]:443/x", "[2001:db8::1]:443", "/x", true},
		{"/relative/path", "", "", false},
		{"http:///nohost", "", "", false},
		{"", "", "", false},
		{"garbage", "", "", false},
	}
	for _, tc := range tests {
		host, uri, ok := SplitURL([]byte(tc.in))
		if ok != tc.ok || ok && (string(host) != tc.host || string(uri) != tc.uri) {
			t.Errorf("SplitURL(%q) = %q, %q, %v; want %q, %q, %v", tc.in, host, uri, ok, tc.host, tc.uri, tc.ok)
		}
	}
}

func TestParseIP(t *testing.T) {
	tests := []struct{ in, want string }{
		{"203.0.113.7", "203.0.113.7"},
		{"203.0.113.7:80", "203.0.113.7"},
		{"[2001:db8::1]:443", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"2001:db8::1", "2001:db8::1"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
		{"fe80::1%eth0", "fe80::1"},
		{"203.0.113.7:port", ""},
		{"[2001:db8::1]x", ""},
		{"[2001:db8::1", ""},
		{"", ""},
		{"1.2.3", ""},
	}
	for _, tc := range tests {
		a, ok := ParseIP([]byte(tc.in))
		got := ""
		if ok {
			got = a.String()
		}
		if got != tc.want {
			t.Errorf("ParseIP(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCountHeader(t *testing.T) {
	tests := []struct {
		raw, name string
		want      int
	}{
		{"User-Agent: a\r\nUser-Agent: b\r\n\r\n", "User-Agent", 2},
		{"user-agent: a\r\nUSER-AGENT: b\r\n\r\n", "User-Agent", 2},
		{"User-Agent: a\r\n\r\n", "User-Agent", 1},
		{"User-Agent:\r\nUser-Agent: b\r\n\r\n", "User-Agent", 2},
		{"Host: x\r\n\r\n", "User-Agent", 0},
		{"", "User-Agent", 0},
		{"X-Api-Key-2: a\r\nX-Api-Key: b\r\n\r\n", "X-Api-Key", 1},
		{"X-Note: X-Api-Key: a\r\nX-Api-Key: b\r\n\r\n", "X-Api-Key", 1},
		{"X-Note: a\r\n X-Api-Key: folded\r\nX-Api-Key: b\r\n\r\n", "X-Api-Key", 1},
		{"Cookie: a=1\nCookie: b=2\n\n", "Cookie", 2},
		{"Content-Type: a\r\nContent-Type: b", "Content-Type", 2},
		{"Content-Typ: a\r\n", "Content-Type", 0},
		// '-' and '_' are one: CGI-style backends (WSGI, PHP-FPM, Rack)
		// read both as HTTP_X_API_KEY.
		{"X_Api_Key: a\r\n\r\n", "X-Api-Key", 1},
		{"x_api-KEY: a\r\nX-Api-Key: b\r\n\r\n", "X-Api-Key", 2},
		{"X-Api-Key: a\r\n\r\n", "X_Api_Key", 1},
		{"X_Api_Key: a\r\nX.Api.Key: b\r\n\r\n", "X-Api-Key", 1},
		{"XApiKey: a\r\n\r\n", "X-Api-Key", 0},
	}
	for _, tc := range tests {
		if got := CountHeader([]byte(tc.raw), tc.name); got != tc.want {
			t.Errorf("CountHeader(%q, %q) = %d, want %d", tc.raw, tc.name, got, tc.want)
		}
	}
}

func TestLookupHeader(t *testing.T) {
	tests := []struct {
		raw, name string
		parsed    []string // the server's parsed values of name itself
		want      string
		n         int
	}{
		{"X-Api-Key: k1\r\n\r\n", "X-Api-Key", []string{"k1"}, "k1", 1},
		{"X_Api_Key: victim\r\n\r\n", "X-Api-Key", nil, "victim", 1},
		{"x_API_key:\t victim \t\r\n\r\n", "X-Api-Key", nil, "victim", 1},
		{"X_Api_Key:\r\n\r\n", "X-Api-Key", nil, "", 1},
		{"X_Api_Key: victim", "X-Api-Key", nil, "victim", 1},
		{"X_Api_Key: victim\nHost: x\n\n", "X-Api-Key", nil, "victim", 1},
		{"X_Api_Key: victim\r\nX-Api-Key: r1\r\n\r\n", "X-Api-Key", []string{"r1"}, "", 2},
		{"X-Api-Key: a\r\nX-Api-Key: b\r\n\r\n", "X-Api-Key", []string{"a", "b"}, "", 2},
		{"Host: x\r\n\r\n", "X-Api-Key", nil, "", 0},
		// Without a raw block (a request built in memory), the parsed
		// values alone.
		{"", "X-Api-Key", []string{"k1"}, "k1", 1},
		{"", "X-Api-Key", []string{"a", "b"}, "", 2},
		{"", "X-Api-Key", nil, "", 0},
		// A header the server keeps one value of, sent twice.
		{"User-Agent: a\r\nUser-Agent: b\r\n\r\n", "User-Agent", []string{"b"}, "", 2},
	}
	for _, tc := range tests {
		var parsed [][]byte
		for _, v := range tc.parsed {
			parsed = append(parsed, []byte(v))
		}
		v, n := LookupHeader([]byte(tc.raw), tc.name, parsed)
		if n != tc.n || n == 1 && string(v) != tc.want {
			t.Errorf("LookupHeader(%q, %q, %q) = %q, %d; want %q, %d", tc.raw, tc.name, tc.parsed, v, n, tc.want, tc.n)
		}
	}
}
