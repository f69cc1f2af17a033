package rules

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"
)

// The seed corpora live in testdata/fuzz (run as tests by go test); `make
// fuzz` fuzzes each target.

func FuzzParse(f *testing.F) {
	f.Add("name=default key=ip limit=100/1m")
	f.Add("name=a key=ip+header:X-Api-Key limit=5/1m algorithm=gcra burst=2 method=POST path=/login; name=b limit=1/d")
	f.Add("name=x limit=0/0s burst=-1 algorithm=nope\n# c\nname=y limit=1/1m path=~[")
	f.Add("name=api key=header:X-Api-Key limit=2/1m tier=header:X-Plan\ntier rule=api name=pro limit=4/1m\noverride rule=api key=k-1 limit=6/1m")
	f.Add("name=h key=host limit=2/1m algorithm=gcra tier=header:T; tier rule=h name=a limit=4/1m burst=9; override rule=h key=A.Example.com. limit=6/1m")
	f.Fuzz(func(t *testing.T, src string) {
		rules, err := Parse(src)
		if err != nil {
			if rules != nil {
				t.Fatalf("Parse(%q) returned rules with an error", src)
			}
			if !utf8.ValidString(err.Error()) && utf8.ValidString(src) {
				t.Fatalf("Parse(%q) error is not UTF-8", src)
			}
			return
		}
		// A valid rule set prints as a rule set that parses to the
		// same thing.
		for _, r := range rules {
			again, err := Parse(r.Text())
			if err != nil {
				t.Fatalf("Parse(%q) = %v; its Text %q does not parse: %v", src, r, r.Text(), err)
			}
			if again[0].Text() != r.Text() {
				t.Fatalf("round trip of %q: %q then %q", src, r.Text(), again[0].Text())
			}
		}
	})
}

func FuzzClientIP(f *testing.F) {
	f.Add("203.0.113.7, 10.0.0.5", "", byte(0))
	f.Add("[2001:db8::1]:443,garbage,,", "198.51.100.1", byte(1))
	f.Add("", "10.0.0.1", byte(2))
	f.Fuzz(func(t *testing.T, xff, realIP string, peerPick byte) {
		peers := []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("198.51.100.9"), netip.MustParseAddr("::1")}
		peer := peers[int(peerPick)%len(peers)]
		r := Proxies{Trusted: defaultTrusted}
		var hdrs [][]byte
		if xff != "" {
			hdrs = bytes.Split([]byte(xff), []byte("\n"))
		}
		got := r.ClientIP(hdrs, []byte(realIP), peer)
		if !got.IsValid() {
			t.Fatalf("clientIP(%q, %q, %v) is not an address", xff, realIP, peer)
		}
		if got == peer {
			return
		}
		// Any other answer must come from the headers, and only if
		// the peer is a trusted proxy.
		if !r.Trusts(peer) {
			t.Fatalf("clientIP(%q, %q, %v) = %v: believed an untrusted peer", xff, realIP, peer, got)
		}
		found := false
		for _, e := range append(strings.FieldsFunc(xff, func(c rune) bool { return c == ',' || c == '\n' }), realIP) {
			if a, ok := ParseIP([]byte(strings.TrimSpace(e))); ok && a == got {
				found = true
			}
		}
		if !found {
			t.Fatalf("clientIP(%q, %q, %v) = %v, which is not in the headers", xff, realIP, peer, got)
		}
	})
}

func FuzzAppendPath(f *testing.F) {
	f.Add("/login?next=/admin")
	f.Add("/x/%2e%2e/log%69n//")
	f.Add("http://host/a/../b/./c/")
	f.Fuzz(func(t *testing.T, uri string) {
		p := string(AppendPath(nil, []byte(uri)))
		if !strings.HasPrefix(p, "/") {
			t.Fatalf("AppendPath(%q) = %q: no leading slash", uri, p)
		}
		if strings.Contains(p, "//") {
			t.Fatalf("AppendPath(%q) = %q: empty segment", uri, p)
		}
		for _, seg := range strings.Split(p, "/") {
			if seg == "." || seg == ".." || strings.ContainsAny(seg, ";\\") {
				t.Fatalf("AppendPath(%q) = %q: a dot segment, a parameter or a backslash", uri, p)
			}
		}
		if strings.IndexFunc(p, func(r rune) bool { return 'A' <= r && r <= 'Z' }) >= 0 {
			t.Fatalf("AppendPath(%q) = %q: not in lower case", uri, p)
		}
		// A regular-expression rule applies to a path with or without
		// its trailing slash alike, as backends route them.
		if p != "/" {
			bare := strings.TrimSuffix(p, "/")
			want := slashRule.Match(request("GET", bare, "", nil))
			for _, q := range []string{uri, bare + "/"} {
				if got := slashRule.Match(request("GET", q, "", nil)); got != want {
					t.Fatalf("path=~%s matches %q: %v, but %q: %v", slashRule.PathRegexp, q, got, bare, want)
				}
			}
		}
	})
}

// slashRule is the regular-expression rule FuzzAppendPath matches paths
// with.
var slashRule = func() *Rule {
	rs, err := Parse("name=up limit=1/1m path=~^/a[^/]*/[0-9]+$")
	if err != nil {
		panic(err)
	}
	return rs[0]
}()

// FuzzHeaderName: a header is found under any spelling of its name that
// differs in case or in '-' against '_', counted as CountHeader counts it,
// and its value is within its line, without the spaces, tabs and carriage
// return around it.
func FuzzHeaderName(f *testing.F) {
	f.Add("X_Api_Key: victim\r\nX-Api-Key: r1\r\n\r\n", "X-Api-Key")
	f.Add("x_api-KEY:\t a \r\n folded\r\nHost: h\n\n", "X-API_key")
	f.Add("User-Agent: a\r\nuser_agent: b", "User-Agent")
	f.Fuzz(func(t *testing.T, raw, name string) {
		if name == "" {
			return
		}
		n := CountHeader([]byte(raw), name)
		other := strings.Map(func(r rune) rune {
			switch {
			case r == '-':
				return '_'
			case r == '_':
				return '-'
			case 'a' <= r && r <= 'z':
				return r - 'a' + 'A'
			case 'A' <= r && r <= 'Z':
				return r - 'A' + 'a'
			}
			return r
		}, name)
		if got := CountHeader([]byte(raw), other); got != n {
			t.Fatalf("CountHeader(%q, %q) = %d, but %d under %q", raw, name, n, got, other)
		}
		v, got := LookupHeader([]byte(raw), name, nil)
		if got != n {
			t.Fatalf("LookupHeader(%q, %q) counts %d, CountHeader %d", raw, name, got, n)
		}
		if n == 1 && (strings.Contains(string(v), "\n") || strings.Trim(string(v), " \t\r") != string(v)) {
			t.Fatalf("LookupHeader(%q, %q) = %q: a line feed, or spaces, tabs or a carriage return around it", raw, name, v)
		}
	})
}
