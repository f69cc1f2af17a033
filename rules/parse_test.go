package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
)

func TestParseRulesReadsEveryField(t *testing.T) {
	rules, err := Parse(`
# per client, then stricter on login
name=per-ip key=ip limit=100/1m
name=login key=ip+header:X-Api-Key limit=5/1m algorithm=gcra burst=2 method=post,PUT host=*.example.com path=/login on_missing=deny
name=upload key=header:X-User-Id limit=1048576/1h algorithm=token_bucket cost=header:Content-Length path=~^/upload/[0-9]+$ shadow=true;name=smooth key=global limit=10/s algorithm=leaky_bucket burst=1 delay=500ms; name=sms-day key=header:X-Phone limit=10/1d algorithm=sliding_window_log cost=2
`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rules), 5; got != want {
		t.Fatalf("%d rules, want %d", got, want)
	}
	login := rules[1]
	spec := login.Policy.Spec()
	if login.Name != "login" || spec.Algorithm != algo.GCRA || spec.Limit != 5 || spec.Window != time.Minute || spec.Burst != 2 {
		t.Errorf("login = %s", login)
	}
	if got := []string{login.Key[0].String(), login.Key[1].String()}; got[0] != "ip" || got[1] != "header:X-Api-Key" {
		t.Errorf("login key = %v", got)
	}
	if strings.Join(login.Methods, ",") != "POST,PUT" || login.Host != "*.example.com" || login.PathPrefix != "/login" || !login.DenyOnMissing {
		t.Errorf("login matchers = %+v", login)
	}
	upload := rules[2]
	if upload.CostHeader != "Content-Length" || upload.PathRegexp == nil || !upload.Shadow || !upload.PathRegexp.MatchString("/upload/42") {
		t.Errorf("upload = %s", upload)
	}
	smooth := rules[3].Policy.Spec()
	if smooth.Window != time.Second || smooth.Delay != 500*time.Millisecond || rules[3].Key[0].Kind != PartGlobal {
		t.Errorf("smooth = %s", rules[3])
	}
	if got := rules[4].Policy.Spec(); got.Window != 24*time.Hour || got.Cost != 2 {
		t.Errorf("sms-day = %s", rules[4])
	}
	if got := rules[0].Policy.Spec().Algorithm; got != algo.SlidingWindowCounter {
		t.Errorf("default algorithm = %v, want sliding_window_counter", got)
	}
}

// TestRuleStringRoundTrips: what -check prints parses back to the same rule.
func TestRuleStringRoundTrips(t *testing.T) {
	src := "name=a key=ip+header:X-Key limit=3/500ms algorithm=token_bucket burst=7 cost=header:X-Cost method=GET host=api.example.com path=/v1 on_missing=deny shadow=true; " +
		"name=b key=path limit=5/90m algorithm=leaky_bucket burst=2 delay=250ms cost=2 path=~^/x$; name=c key=global limit=1/1d cost=header:X-Len cost_missing=deny; name=d limit=9/1s cost=header:X-Len cost_missing=4"
	rules, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		again, err := Parse(r.Text())
		if err != nil {
			t.Fatalf("Parse(%q): %v", r.Text(), err)
		}
		if got := again[0].Text(); got != r.Text() {
			t.Errorf("round trip:\n got %s\nwant %s", got, r.Text())
		}
	}
}

func TestParseRulesErrorsNameRuleAndField(t *testing.T) {
	tests := []struct {
		src  string
		want []string
	}{
		{`name=login limit=5/x`, []string{`rule 1 "login": limit "5/x": unknown unit "x"`}},
		{`name=a limit=1/1m; name=login limit=5/x`, []string{`rule 2 "login": limit "5/x": unknown unit "x"`}},
		{`limit=5/1m`, []string{`rule 1: name: missing`}},
		{`name=a`, []string{`rule 1 "a": limit: missing`}},
		{`name=Login limit=1/1m`, []string{`rule 1 "Login": name "Login"`}},
		{`name=a limit=0/1m`, []string{`limit "0/1m": 0 is not positive`}},
		{`name=a limit=10`, []string{`limit "10": want <N>/<duration>`}},
		{`name=a limit=10/`, []string{`limit "10/": empty duration`}},
		{`name=a limit=10/100`, []string{`limit "10/100": missing unit`}},
		{`name=a limit=abc/1m`, []string{`"abc" is not a whole number`}},
		{`name=a limit=10/1ns`, []string{`limit "10/1ns": 1ns is shorter than the minimum 1ms`}},
		{`name=a limit=10/3650d`, []string{`limit "10/3650d"`, "longer than the maximum"}},
		{`name=a limit=4611686018427387904/1m`, []string{"above the maximum"}},
		{`name=a limit=1/1m algorithm=leaky`, []string{`algorithm "leaky": unknown algorithm "leaky"`}},
		{`name=a limit=1/1m burst=3`, []string{`burst "3": sliding_window_counter has no burst`}},
		{`name=a limit=1/1m algorithm=gcra delay=1s`, []string{`delay "1s": gcra cannot delay`}},
		{`name=a limit=1/1m cost=0`, []string{`cost "0": 0 is not positive`}},
		{`name=a limit=1/1m cost=header:`, []string{`cost "header:": empty header name`}},
		{`name=a limit=1/1m key=ip+cookie`, []string{`key "ip+cookie": unknown part "cookie"`}},
		{`name=a limit=1/1m key=ip+ip`, []string{`part "ip" given twice`}},
		{`name=a limit=1/1m key=global+ip`, []string{"cannot be combined"}},
		{`name=a limit=1/1m key=header:Bad(Name)`, []string{`contains '('`}},
		{`name=a limit=1/1m path=login`, []string{`path "login": want a prefix starting with "/"`}},
		{`name=a limit=1/1m path=~[`, []string{`path "~[": error parsing regexp`}},
		{`name=a limit=1/1m on_missing=maybe`, []string{`on_missing "maybe": want skip or deny`}},
		{`name=a limit=1/1m shadow=yesplease`, []string{`shadow "yesplease": want true or false`}},
		{`name=a limit=1/1m colour=blue`, []string{`colour: unknown field`}},
		{`name=a limt=1/1m`, []string{`limt: unknown field (did you mean limit?)`}},
		{`name=a limit=1/1m algoritm=gcra`, []string{`algoritm: unknown field (did you mean algorithm?)`}},
		{`name=a limit=1/1m limit=2/1m`, []string{`limit: given twice`}},
		{`name=a limit=1/1m oops`, []string{`"oops" is not field=value`}},
		{`name=a limit=1/1m method=GE T`, []string{`"T" is not field=value`}},
		{`name=a limit=1/1m host=bad/host`, []string{`host "bad/host"`}},
		{`name=a limit=1/1m; name=a limit=2/1m`, []string{`rule 2 "a": name: already used by rule 1`}},
		{``, []string{"no rules"}},
		{`# only a comment`, []string{"no rules"}},
		{`name=a limit=10/1m cost=20`, []string{`rule 1 "a": cost "20": 20 is more than the policy ever admits at once (10)`}},
		{`name=a limit=10/1m algorithm=token_bucket burst=3 cost=4`, []string{`cost "4": 4 is more than`}},
		{`name=a limit=1/366d algorithm=token_bucket burst=1125899906842624`, []string{`burst "1125899906842624"`, "to refill"}},
		{`name=a limit=1/1m cost_missing=5`, []string{`cost_missing: only with cost=header:<Name>`}},
		{`name=a limit=10/1m cost=header:X-Len cost_missing=maybe`, []string{`cost_missing "maybe": want deny, or the cost to charge`}},
		{`name=a limit=10/1m cost=header:X-Len cost_missing=11`, []string{`cost_missing "11": 11 is more than the rule ever admits at once (10)`}},
		{`name=a limit=1/1m host=api.example.com:8080`, []string{`host "api.example.com:8080": requests are matched by host without a port: write host=api.example.com`}},
		{`name=a limit=1/1m host=[2001:db8::1]:8080`, []string{`host "[2001:db8::1]:8080": requests are matched by host without a port: write host=[2001:db8::1]`}},
		{`name=a limit=1/1m host=2001:db8::zz`, []string{`host "2001:db8::zz": not a host name or an IPv6 address`}},
		{`name=a limit=1/1m host=[2001:db8::1`, []string{`host "[2001:db8::1": want an IPv6 address in brackets`}},
		{`name=a limit=1/1m host=[api.example.com]`, []string{`host "[api.example.com]": want an IPv6 address in brackets`}},
		{`name=a limit=1/1m host=*.2001:db8::1`, []string{`host "*.2001:db8::1": *. needs a domain name`}},
		{`name=a limit=1/1m path=/login?x=1`, []string{`path "/login?x=1": a path prefix has no query or fragment`}},
		{`name=x limit=0/0s burst=-1 algorithm=nope`, []string{`limit "0/0s"`, `burst "-1"`, `algorithm "nope"`}},
		// Never match, never act: mistakes.
		{`name=s limit=1/1m path=~^/search\?q=x`, []string{`rule 1 "s": path "~^/search\\?q=x": `, "query", "path=~^/search"}},
		{`name=s limit=1/1m path=~^/a(#top|/b)$`, []string{`path "~^/a(#top|/b)$": `, "fragment"}},
		{`name=s limit=1/1m path=~^/search[?]`, []string{`path "~^/search[?]": `, "query"}},
		{`name=s limit=1/1m path=~^/(?:v1/)?search\?q=x`, []string{"such as path=~^/(?:v1/)?search (no rule"}},
		{`name=l limit=1/1m path=~(?-i)^/Login$`, []string{`rule 1 "l": path "~(?-i)^/Login$": `, "lower case", `"L"`, "(?-i)"}},
		{`name=l limit=1/1m path=~^/a/(?-i:[A-Z]+)$`, []string{`path "~^/a/(?-i:[A-Z]+)$": `, "lower case"}},
		{`name=m limit=1/1m on_missing=deny`, []string{`rule 1 "m": on_missing "deny": `, "header:", "key=ip+header:"}},
		{`name=m limit=1/1m key=ip+host on_missing=deny`, []string{`on_missing "deny": `}},
	}
	for _, tc := range tests {
		_, err := Parse(tc.src)
		if err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", tc.src)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Parse(%q) error:\n%v\ndoes not say %q", tc.src, err, w)
			}
		}
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"1m", time.Minute}, {"m", time.Minute}, {"s", time.Second}, {"500ms", 500 * time.Millisecond},
		{"24h", 24 * time.Hour}, {"7d", 7 * 24 * time.Hour}, {"1h30m", 90 * time.Minute}, {"1.5s", 1500 * time.Millisecond},
	}
	for _, tc := range tests {
		got, err := parseDuration(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if _, err := parseDuration("99999999999999999d"); err == nil {
		t.Error("parseDuration of an overflowing duration succeeded")
	}
}

// TestRuleValuesAreNormalizedAsRequests: a host= or path= value is read as
// requests are, so a rule matches what it says.
func TestRuleValuesAreNormalizedAsRequests(t *testing.T) {
	tests := []struct{ src, host, path string }{
		{"host=API.Example.COM.", "api.example.com", ""},
		{"host=*.Example.com.", "*.example.com", ""},
		// Requests keep an IPv6 literal's brackets (Host: [2001:db8::1]:443).
		{"host=2001:DB8::1", "[2001:db8::1]", ""},
		{"host=[2001:db8::1]", "[2001:db8::1]", ""},
		{"host=::ffff:192.0.2.1", "[::ffff:192.0.2.1]", ""},
		{"host=192.0.2.1", "192.0.2.1", ""},
		{"path=/log%69n", "", "/login"},
		{"path=/a/../admin", "", "/admin"},
		{"path=/LOGIN/", "", "/login/"},
		{"path=//x/./y\\z", "", "/x/y/z"},
	}
	for _, tc := range tests {
		rules, err := Parse("name=a limit=1/1m " + tc.src)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.src, err)
			continue
		}
		if rules[0].Host != tc.host || rules[0].PathPrefix != tc.path {
			t.Errorf("Parse(%q): host %q path %q, want %q %q", tc.src, rules[0].Host, rules[0].PathPrefix, tc.host, tc.path)
		}
	}
}

// TestIPv6HostRuleMatches: host= with an IPv6 literal, bracketed or not,
// matches requests for that literal, which keep their brackets.
func TestIPv6HostRuleMatches(t *testing.T) {
	for _, src := range []string{"host=2001:db8::1", "host=[2001:db8::1]", "host=2001:DB8::1"} {
		r := mustParse(t, "name=v6 limit=2/1m "+src)[0]
		for host, want := range map[string]bool{"[2001:db8::1]:8443": true, "[2001:DB8::1]": true, "[2001:db8::2]": false, "2001:db8::1.example.com": false} {
			if got := r.Match(request("GET", "/", host, nil)); got != want {
				t.Errorf("rule %s: Match(host %q) = %v, want %v", src, host, got, want)
			}
		}
	}
}

func TestKeyPartsOneHeaderInAnySpelling(t *testing.T) {
	if _, err := Parse("name=k key=header:X-Api-Key+header:x_api_key limit=1/1m"); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("X-Api-Key and x_api_key as two key parts: %v, want given twice", err)
	}
}

// TestParseWarnsOfRulesThatWorkOnlyInSomeSetups: a rule that is valid but
// does nothing behind the usual proxies parses, with a warning naming the
// rule and the field and saying what to use instead.
func TestParseWarnsOfRulesThatWorkOnlyInSomeSetups(t *testing.T) {
	tests := []struct {
		src  string
		want []string // nil: no warning
	}{
		{"name=h key=header:Host limit=1/1m", []string{`rule 1 "h": key "header:Host": `, "nginx", "key=host"}},
		{"name=a limit=1/1m; name=h key=ip+header:host limit=1/1m", []string{`rule 2 "h": key "ip+header:host": `, "key=host"}},
		{"name=c limit=100/1m cost=header:Content-Length", []string{`rule 1 "c": cost "header:Content-Length": `, "nginx", "X-Original-Content-Length"}},
		{"name=c limit=100/1m cost=header:content_length", []string{`cost "header:content_length": `, "X-Original-Content-Length"}},
		{"name=ok key=host+header:X-Api-Key limit=100/1m cost=header:X-Original-Content-Length on_missing=deny path=~^/a(?-i:/b)$", nil},
		{"name=ok limit=1/1m path=~^/search[^?]*$", nil},
	}
	for _, tc := range tests {
		rs, err := Parse(tc.src)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.src, err)
			continue
		}
		var ws []string
		for _, r := range rs {
			ws = append(ws, r.Warnings()...)
		}
		if tc.want == nil {
			if len(ws) > 0 {
				t.Errorf("Parse(%q) warns %q, want nothing", tc.src, ws)
			}
			continue
		}
		if len(ws) != 1 {
			t.Errorf("Parse(%q) warns %q, want one warning", tc.src, ws)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(ws[0], w) {
				t.Errorf("Parse(%q) warning %q does not say %q", tc.src, ws[0], w)
			}
		}
	}
}

// TestEveryMistakeOfARuleAtOnce: a field that does not parse hides none
// of the rule's other mistakes, and reports none that only its missing
// value would make.
func TestEveryMistakeOfARuleAtOnce(t *testing.T) {
	tests := []struct {
		src      string
		want     []string
		unwanted []string
	}{
		{"name=a limit=5/1m algorithm=leaky_bucket delay=2h burst=0",
			[]string{`burst "0": 0 is not positive`, `delay "2h": 2h0m0s is longer than the maximum`}, nil},
		{"name=a limit=5/1m algorithm=fixed_window burst=x delay=5s",
			[]string{`burst "x"`, `delay "5s": fixed_window cannot delay`}, nil},
		{"name=a limit=oops on_missing=deny",
			[]string{`limit "oops"`, `on_missing "deny": the key "ip" has no header: part`}, nil},
		{"name=a limit=5/1m cost_missing=3 shadow=maybe",
			[]string{`shadow "maybe"`, "cost_missing: only with cost=header:<Name>"}, nil},
		{"name=Bad limit=5/1m algorithm=gcra delay=1s",
			[]string{`name "Bad"`, `delay "1s": gcra cannot delay`}, nil},
		{"name=a limit=5/1m algorithm=token_bucket burst=10 cost=20 key=bogus",
			[]string{`key "bogus"`, `cost "20": 20 is more than the policy ever admits at once (10)`}, nil},
		// What the bad field's value would decide is not guessed at.
		{"name=a limit=oops cost=99", []string{`limit "oops"`}, []string{"cost"}},
		{"name=a limit=5/1m burst=many cost=99 algorithm=token_bucket", []string{`burst "many"`}, []string{`cost "99"`}},
		{"name=a limit=5/1m algorithm=nope burst=3", []string{`algorithm "nope"`}, []string{"burst"}},
		{"name=a key=bogus limit=5/1m on_missing=deny", []string{`key "bogus"`}, []string{"on_missing"}},
	}
	for _, tc := range tests {
		_, err := Parse(tc.src)
		if err == nil {
			t.Errorf("Parse(%q) accepted", tc.src)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Parse(%q):\n%v\nwant a mistake containing %q", tc.src, err, w)
			}
		}
		for _, u := range tc.unwanted {
			if strings.Contains(err.Error(), u) {
				t.Errorf("Parse(%q):\n%v\nwant no mistake of %q", tc.src, err, u)
			}
		}
	}
}
