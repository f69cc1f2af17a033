package envoyconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/internal/race"
)

func parse(t *testing.T, files ...string) *Config {
	t.Helper()
	var fs []File
	for i, f := range files {
		fs = append(fs, File{Name: "f" + string(rune('1'+i)) + ".yaml", Data: []byte(f)})
	}
	c, err := Parse(fs)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func entries(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{kv[i], kv[i+1]})
	}
	return es
}

// describe names the limits Match finds: "rpu/unit" each, or "unlimited".
func describe(ls []*Limit) string {
	var parts []string
	for _, l := range ls {
		switch {
		case l.Unlimited:
			parts = append(parts, "unlimited")
		default:
			s := strings.TrimPrefix(l.Key, "") + " " + itoa(l.RequestsPerUnit) + "/" + l.Unit.String()
			if l.Shadow {
				s += " shadow"
			}
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, ", ")
}

func itoa(n uint32) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

const messaging = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 21
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit:
          requests_per_unit: 10
          unit: SECOND
  - key: ldap
    rate_limit:
      unlimited: true
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: api
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: token_bucket, burst: 100}
`

func TestMatch(t *testing.T) {
	c := parse(t, messaging)
	for _, tc := range []struct {
		name, domain string
		entries      []Entry
		want         string
	}{
		{"nested key without value", "messaging", entries("message_type", "marketing", "to_number", "2061111111"), "messaging.message_type_marketing.to_number 5/day"},
		{"top key without value", "messaging", entries("to_number", "2061111111"), "messaging.to_number 100/day"},
		{"exact value before key", "messaging", entries("remote_address", "50.0.0.5"), "messaging.remote_address_50.0.0.5 0/second"},
		{"key when the value differs", "messaging", entries("remote_address", "50.0.0.1"), "messaging.remote_address 10/second"},
		{"middle wildcard", "messaging", entries("path", "/api/123/action"), "messaging.path_/api/*/action 20/minute"},
		{"middle wildcard, other suffix", "messaging", entries("path", "/api/123/other"), ""},
		{"trailing wildcard", "messaging", entries("key1", "valueXYZ"), "messaging.key1_value* 21/minute"},
		{"trailing wildcard, empty rest", "messaging", entries("key1", "value"), "messaging.key1_value* 21/minute"},
		{"wildcard miss", "messaging", entries("key1", "valu"), ""},
		{"shadow", "messaging", entries("service", "auth", "user", "user-a"), "messaging.service.user_user-a 10/second shadow"},
		{"unlimited", "messaging", entries("ldap", "x"), "unlimited"},
		{"two limits on one descriptor", "messaging", entries("api", "k"), "messaging.api 60/minute, messaging.api 1000/hour"},
		{"longer than the path", "messaging", entries("to_number", "1", "extra", "2"), ""},
		{"shorter than the path", "messaging", entries("message_type", "marketing"), ""},
		{"unknown key", "messaging", entries("nope", "1"), ""},
		{"unknown domain", "nope", entries("to_number", "1"), ""},
		{"no entries", "messaging", nil, ""},
		{"case matters", "messaging", entries("To_number", "1"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ls, _ := c.Match(tc.domain, tc.entries, nil)
			if got := describe(ls); got != tc.want {
				t.Errorf("Match(%q, %v) = %q, want %q", tc.domain, tc.entries, got, tc.want)
			}
		})
	}
}

func TestMatchKeys(t *testing.T) {
	c := parse(t, messaging)
	key := func(d string, e []Entry) string {
		ls, k := c.Match(d, e, []byte("prefix"))
		if len(ls) == 0 {
			t.Fatalf("Match(%q, %v) found nothing", d, e)
		}
		if !strings.HasPrefix(string(k), "prefix") {
			t.Fatalf("Match dropped the bytes it appends to: %q", k)
		}
		return string(k)
	}
	a := key("messaging", entries("to_number", "1"))
	if b := key("messaging", entries("to_number", "2")); a == b {
		t.Errorf("two values of a key without value share the key %q", a)
	}
	if b := key("messaging", entries("key1", "value1")); b == key("messaging", entries("key1", "value2")) {
		t.Errorf("two values of a wildcard share a counter without share_threshold")
	}
	if a, b := key("messaging", entries("files", "files/a.pdf")), key("messaging", entries("files", "files/b.csv")); a != b {
		t.Errorf("share_threshold: %q and %q differ", a, b)
	}
	// Length prefixes keep ("a_b","c") and ("a","b_c") apart.
	c2 := parse(t, "domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	_, k1 := c2.Match("d", entries("a_b", "c"), nil)
	_, k2 := c2.Match("d", entries("a", "b_c"), nil)
	if string(k1) == string(k2) {
		t.Errorf("(a_b, c) and (a, b_c) share the key %q", k1)
	}
	if _, k := c.Match("messaging", entries("nope", "1"), []byte("prefix")); string(k) != "prefix" {
		t.Errorf("Match without a limit left %q, want the bytes given", k)
	}
}

func TestPolicies(t *testing.T) {
	c := parse(t, messaging)
	names := map[string]bool{}
	for _, p := range c.Policies() {
		if err := algo.ValidName(p.Name()); err != nil {
			t.Errorf("policy name %q: %v", p.Name(), err)
		}
		if names[p.Name()] {
			t.Errorf("policy name %q twice", p.Name())
		}
		names[p.Name()] = true
	}
	if got, want := len(c.Policies()), 9; got != want {
		t.Errorf("%d policies, want %d (unlimited and 0 per unit have none)", got, want)
	}
	// The same configuration gives the same names; another limit value
	// too, so counts carry over.
	again := parse(t, strings.ReplaceAll(messaging, "requests_per_unit: 100", "requests_per_unit: 200"))
	for i, p := range c.Policies() {
		if q := again.Policies()[i]; q.Name() != p.Name() {
			t.Errorf("policy %d: %q, then %q", i, p.Name(), q.Name())
		}
	}
	ls, _ := c.Match("messaging", entries("api", "k"), nil)
	if s := ls[1].Policy.Spec(); s.Algorithm != algo.TokenBucket || s.Burst != 100 || s.Limit != 1000 {
		t.Errorf("second api limit %+v, want token_bucket 1000/h burst 100", s)
	}
	if s := ls[0].Policy.Spec(); s.Algorithm != algo.FixedWindow {
		t.Errorf("default algorithm %v, want fixed_window", s.Algorithm)
	}
	long := parse(t, "domain: "+strings.Repeat("D", 100)+"\ndescriptors:\n  - key: "+strings.Repeat("k.", 60)+"\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if err := algo.ValidName(long.Policies()[0].Name()); err != nil {
		t.Errorf("long path: %v", err)
	}
}

// TestLabel: a limit goes by its rate_limit.name when it has one, else by
// its policy's generated name; names of any printable ASCII but a quote
// or a backslash are taken as written.
func TestLabel(t *testing.T) {
	c := parse(t, `domain: d
descriptors:
  - key: named
    rate_limit: {name: "Per-User limit #1 (v2)", unit: minute, requests_per_unit: 5}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: none
    rate_limit: {name: zero, unit: minute, requests_per_unit: 0}
`)
	named, _ := c.Match("d", entries("named", "x"), nil)
	plain, _ := c.Match("d", entries("plain", "x"), nil)
	none, _ := c.Match("d", entries("none", "x"), nil)
	if len(named) != 1 || len(plain) != 1 || len(none) != 1 {
		t.Fatalf("matched %d, %d, %d limits, want one each", len(named), len(plain), len(none))
	}
	if got, want := named[0].Label(), "Per-User limit #1 (v2)"; got != want {
		t.Errorf("named limit's Label = %q, want %q", got, want)
	}
	if got, want := plain[0].Label(), plain[0].Policy.Name(); got != want || !strings.HasPrefix(got, "rls_d_plain_") {
		t.Errorf("unnamed limit's Label = %q, want its policy's name %q", got, want)
	}
	if named[0].Policy.Name() == named[0].Label() || !strings.HasPrefix(named[0].Policy.Name(), "rls_d_named_") {
		t.Errorf("named limit's policy is %q: its counts must stay under the generated name", named[0].Policy.Name())
	}
	if got := none[0].Label(); got != "" {
		t.Errorf("a limit without a policy has Label %q, want none", got)
	}
}

func TestOverride(t *testing.T) {
	c := parse(t, messaging)
	a, err := c.Override(5, Minute)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := c.Override(5, Minute); a != b {
		t.Errorf("the same override twice gave two limits")
	}
	if z, _ := c.Override(0, Minute); !z.DeniesAll() || z.Policy != nil {
		t.Errorf("override of 0: %+v, want one that denies all", z)
	}
	if _, err := c.Override(5, 0); err == nil {
		t.Errorf("Override with unit 0: no error")
	}
	for i := 0; i < MaxOverrides; i++ {
		_, err = c.Override(uint32(100+i), Second)
	}
	if err == nil || !strings.Contains(err.Error(), "more than 1024 distinct limit overrides") {
		t.Errorf("override past the bound: %v", err)
	}
	if _, err := c.Override(5, Minute); err != nil {
		t.Errorf("a known override past the bound: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		want  []string
	}{
		{"empty file", []string{""}, []string{`f1.yaml: domain: missing: the file is empty`}},
		{"not yaml", []string{"domain: [x"}, []string{`f1.yaml: not YAML: yaml: line 1: did not find expected ',' or ']'`}},
		{"empty domain", []string{"domain: ''\n"}, []string{`f1.yaml:1: domain: empty`}},
		{"duplicate domain", []string{"domain: a\n", "domain: a\n"}, []string{`f2.yaml:1: domain "a": domain: also configured in f1.yaml: each domain lives in one file`}},
		{"misspelt root key", []string{"domain: a\ndescriptor:\n  - key: k\n"}, []string{`f1.yaml:2: domain "a": descriptor: unknown field (did you mean "descriptors"?)`}},
		{"misspelt rate_limit field", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      request_per_unit: 5\n"}, []string{
			`f1.yaml:6: domain "a": descriptor "k": rate_limit.request_per_unit: unknown field (did you mean "requests_per_unit"?)`}},
		{"unknown field far from any", []string{"domain: a\ndescriptors:\n  - key: k\n    zzzzzzzzzz: 1\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": zzzzzzzzzz: unknown field (want key, value, rate_limit, descriptors, shadow_mode, detailed_metric, value_to_metric, share_threshold, quota_mode, metadata)`}},
		{"bad unit", []string{"domain: a\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - key: s\n        rate_limit: {unit: minutes, requests_per_unit: 5}\n"}, []string{
			`f1.yaml:7: domain "a": descriptor "k_v.s": rate_limit.unit: "minutes" is not a unit (did you mean "minute"?) (want second, minute, hour, day, week, month, year)`}},
		{"missing unit", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 5}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.unit: missing (want second, minute, hour, day, week, month, year)`}},
		{"unit with unlimited", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.unit: not with unlimited: true`}},
		{"negative requests", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.requests_per_unit: "-1" is not a whole number from 0 to 4294967295`}},
		{"empty key", []string{"domain: a\ndescriptors:\n  - key: ''\n"}, []string{`f1.yaml:3: domain "a": key: empty`}},
		{"missing key", []string{"domain: a\ndescriptors:\n  - value: v\n"}, []string{`f1.yaml:3: domain "a": key: missing: every descriptor has a key`}},
		{"replaces itself", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      name: n\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: n}]\n"}, []string{
			`f1.yaml:8: domain "a": descriptor "k": rate_limit.replaces.name: "n" is this limit's own name`}},
		{"empty replaces", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: ''}]\n"}, []string{
			`f1.yaml:7: domain "a": descriptor "k": rate_limit.replaces.name: missing or empty`}},
		{"bad algorithm", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_buket}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.algorithm: "token_buket" is not an algorithm (did you mean "token_bucket"?) (want fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra)`}},
		{"burst on fixed_window", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.burst: fixed_window has no burst; only token_bucket, leaky_bucket and gcra do`}},
		{"share_threshold without wildcard", []string{"domain: a\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n"}, []string{
			`f1.yaml:5: domain "a": descriptor "k_v": share_threshold: only for a value with a wildcard ('*')`}},
		{"bad quota_mode", []string{"domain: a\ndescriptors:\n  - key: k\n    quota_mode: sometimes\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": quota_mode: "sometimes" is not true or false`}},
		{"metadata not a mapping", []string{"domain: a\ndescriptors:\n  - key: k\n    metadata: [a, b]\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": metadata: want a mapping`}},
		{"bad bool", []string{"domain: a\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": shadow_mode: "maybe" is not true or false`}},
		{"unlimited and a limit", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}, []string{
			`f1.yaml:6: domain "a": descriptor "k": rate_limit.unlimited: an unlimited descriptor cannot also have a limit (it is listed more than once)`}},
		{"every mistake at once", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: sec, requests_per_unit: 1}\n  - key: j\n    rate_limt: {}\n", "domain: b\nfoo: 1\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.unit: "sec" is not a unit (want second, minute, hour, day, week, month, year)`,
			`f1.yaml:6: domain "a": descriptor "j": rate_limt: unknown field (did you mean "rate_limit"?)`,
			`f2.yaml:2: domain "b": foo: unknown field (want domain, descriptors)`}},
		{"two documents", []string{"domain: a\n---\ndomain: b\n"}, []string{`f1.yaml:2: a second YAML document: a file holds one domain`}},
		{"descriptors not a list", []string{"domain: a\ndescriptors: {key: k}\n"}, []string{`f1.yaml:2: domain "a": descriptors: want a list of descriptors`}},
		{"name twice", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: per_user, unit: second, requests_per_unit: 1}\n",
			"domain: b\ndescriptors:\n  - key: j\n    rate_limit: {name: per_user, unit: second, requests_per_unit: 1}\n"}, []string{
			`f2.yaml:4: domain "b": descriptor "j": rate_limit.name: "per_user" is also the name of the limit at f1.yaml:4, domain "a", descriptor "k": names label the metrics, so each limit needs its own`}},
		{"name with a quote", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: 'a\"b', unit: second, requests_per_unit: 1}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.name: "a\"b": want 1 to 64 printable ASCII characters, no quote, backslash or space at either end (the name labels the limit's metrics and names it in the RateLimit headers)`}},
		{"name too long", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: " + strings.Repeat("n", 65) + ", unit: second, requests_per_unit: 1}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.name: "` + strings.Repeat("n", 65) + `": want 1 to 64 printable ASCII characters, no quote, backslash or space at either end (the name labels the limit's metrics and names it in the RateLimit headers)`}},
		{"name override", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: override, unit: second, requests_per_unit: 1}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.name: "override" is the name every limit Envoy sends with a descriptor goes by: give this limit another`}},
		{"name of another limit", []string{"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: rls_a_j_5b264f31, unit: second, requests_per_unit: 1}\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}, []string{
			`f1.yaml:4: domain "a": descriptor "k": rate_limit.name: "rls_a_j_5b264f31" is the generated name of the limit a.j: give this limit another`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fs []File
			for i, f := range tc.files {
				fs = append(fs, File{Name: "f" + string(rune('1'+i)) + ".yaml", Data: []byte(f)})
			}
			_, err := Parse(fs)
			if err == nil {
				t.Fatalf("Parse: no error, want %q", tc.want)
			}
			if got, want := err.Error(), strings.Join(tc.want, "\n"); got != want {
				t.Errorf("Parse:\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("..data/b.yml", "domain: b\n")
	write("notes.txt", "not yaml at all: [")
	write("sub/c.yaml", "domain: c\n")
	// A ConfigMap mount: the file is a link into ..data.
	if err := os.Symlink(filepath.Join("..data", "b.yml"), filepath.Join(dir, "b.yml")); err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got, want := strings.Join(c.Domains(), ","), "a,b"; got != want {
		t.Errorf("domains %q, want %q", got, want)
	}
	if _, err := Load(filepath.Join(dir, "sub")); err != nil {
		t.Errorf("Load of one directory with one file: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("Load of a missing path: no error")
	}
	empty := t.TempDir()
	if _, err := Load(empty); err == nil || !strings.Contains(err.Error(), "no .yaml or .yml file") {
		t.Errorf("Load of an empty directory: %v", err)
	}
}

func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		want           bool
	}{
		{"k_value*", "k_value", true},
		{"k_value*", "k_valueXYZ", true},
		{"k_value*", "k_valu", false},
		{"k_*", "k_", true},
		{"k_a*a", "k_a", false}, // the prefix and the suffix may not overlap
		{"k_a*a", "k_aa", true},
		{"k_/api/*/action", "k_/api/1/action", true},
		{"k_/api/*/action", "k_/api//action", true},
		{"k_/api/*/action", "k_/api/1/other", false},
		{"k_/a/*/r/*/x", "k_/a/1/r/2/x", true},
		{"k_/a/*/r/*/x", "k_/a/1/x/2/r", false},
		{"k_a**b", "k_ab", true},
		{"k_a*b*c", "k_acb", false},
	} {
		w := wildcard{key: tc.pattern, parts: strings.Split(tc.pattern, "*")}
		if got := w.match([]byte(tc.value)); got != tc.want {
			t.Errorf("%q matches %q: %v, want %v", tc.pattern, tc.value, got, tc.want)
		}
	}
}

func TestMatchAllocates(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector changes allocation counts")
	}
	c := parse(t, messaging)
	es := entries("message_type", "marketing", "to_number", "2061111111")
	key := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { c.Match("messaging", es, key[:0]) }); n != 0 {
		t.Errorf("Match allocates %v times, want 0", n)
	}
}

// TestAnchors: YAML anchors, aliases and merge keys work as they do in
// envoyproxy/ratelimit, which reads its files with a YAML library.
func TestAnchors(t *testing.T) {
	c := parse(t, `
domain: anchors
descriptors:
  - key: a
    rate_limit: &per_minute {unit: minute, requests_per_unit: 7}
  - key: b
    rate_limit: *per_minute
  - key: c
    rate_limit:
      <<: *per_minute
      requests_per_unit: 8
  - &shared
    key: d
    rate_limit: {unit: hour, requests_per_unit: 9}
`)
	for _, tc := range []struct{ key, want string }{
		{"a", "anchors.a 7/minute"},
		{"b", "anchors.b 7/minute"},
		{"c", "anchors.c 8/minute"},
		{"d", "anchors.d 9/hour"},
	} {
		if ls, _ := c.Match("anchors", entries(tc.key, "x"), nil); describe(ls) != tc.want {
			t.Errorf("%s: %q, want %q", tc.key, describe(ls), tc.want)
		}
	}
	_, err := Parse([]File{{Name: "f.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      <<: {unit: second, requests_pr_unit: 1}\n")}})
	if want := `f.yaml:5: domain "a": descriptor "k": rate_limit.requests_pr_unit: unknown field (did you mean "requests_per_unit"?)`; err == nil || err.Error() != want {
		t.Errorf("a misspelt merged field: %v, want %s", err, want)
	}
}

// TestQuotaModeAndMetadata: a descriptor's quota_mode and metadata reach
// its limits, as envoyproxy/ratelimit's example configuration has them.
func TestQuotaModeAndMetadata(t *testing.T) {
	c, err := Parse([]File{{Name: "q.yaml", Data: []byte(`
domain: q
descriptors:
  - {key: plain, rate_limit: {unit: minute, requests_per_unit: 1}}
  - key: service
    value: service_1
    quota_mode: true
    metadata: {service_with_quota: {name: service_1, weight: 3, tags: [a, b]}}
    rate_limit: {unit: minute, requests_per_unit: 1}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := c.Match("q", []Entry{{Key: "service", Value: "service_1"}}, nil)
	if len(ls) != 1 || !ls[0].Quota {
		t.Fatalf("service_1: %+v, want one quota limit", ls)
	}
	got, err := protojson.Marshal(ls[0].Metadata)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"service_with_quota":{"name":"service_1","tags":["a","b"],"weight":3}}`; strings.ReplaceAll(string(got), " ", "") != want {
		t.Errorf("service_1's metadata %s, want %s", got, want)
	}
	ls, _ = c.Match("q", []Entry{{Key: "plain", Value: "x"}}, nil)
	if len(ls) != 1 || ls[0].Quota || ls[0].Metadata != nil {
		t.Errorf("plain: %+v, want neither quota nor metadata", ls)
	}
}
