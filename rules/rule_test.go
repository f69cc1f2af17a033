package rules

import (
	"net/http"
	"net/textproto"
	"testing"
)

// headers is a Headers over an http.Header.
type headers http.Header

func (h headers) Lookup(name string) ([]byte, int) {
	vals := h[textproto.CanonicalMIMEHeaderKey(name)]
	if len(vals) == 0 {
		return nil, 0
	}
	return []byte(vals[0]), len(vals)
}

func request(method, uri, host string, h headers) *Request {
	return &Request{
		Method:    AppendMethod(nil, []byte(method)),
		Path:      AppendPath(nil, []byte(uri)),
		Host:      AppendHost(nil, []byte(host)),
		ClientKey: []byte("203.0.113.7"),
		Header:    h,
	}
}

func mustParse(t *testing.T, src string) []*Rule {
	t.Helper()
	rules, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// TestMatchWhereBackendsRoute: a path rule applies wherever a common
// backend would route the request to its path: other cases, path
// parameters, escapes, backslashes and dot segments do not escape it.
func TestMatchWhereBackendsRoute(t *testing.T) {
	login := mustParse(t, "name=login limit=2/1m path=/login method=POST")[0]
	regex := mustParse(t, "name=up limit=2/1m path=~^/upload/[0-9]+$")[0]
	slash := mustParse(t, "name=s limit=2/1m path=~^/a/$")[0]
	root := mustParse(t, "name=r limit=2/1m path=~^/$")[0]
	host := mustParse(t, "name=h limit=2/1m host=api.example.com")[0]
	wild := mustParse(t, "name=w limit=2/1m host=*.example.com")[0]
	tests := []struct {
		rule   *Rule
		method string
		uri    string
		host   string
		want   bool
	}{
		{login, "POST", "/login", "", true},
		{login, "post", "/LOGIN", "", true},
		{login, "POST", "/login;a=1", "", true},
		{login, "POST", "/Login;JSESSIONID=x/step2", "", true},
		{login, "POST", "/%6Cogin", "", true},
		{login, "POST", "/x/..;/login", "", true},
		{login, "POST", "\\login", "", true},
		{login, "POST", "/login/", "", true},
		{login, "POST", "/logins", "", false},
		{login, "GET", "/login", "", false},
		{regex, "GET", "/UPLOAD/42", "", true},
		{regex, "GET", "/upload/42;x", "", true},
		{regex, "GET", "/upload/x", "", false},
		{regex, "GET", "/upload/42/", "", true},
		{regex, "GET", "/upload/42/.", "", true},
		{regex, "GET", "/Upload/42//", "", true},
		{regex, "GET", "/upload/42/x", "", false},
		{slash, "GET", "/a/", "", true},
		{slash, "GET", "/a", "", false},
		{root, "GET", "/", "", true},
		{root, "GET", "//", "", true},
		{root, "GET", "/x/", "", false},
		{host, "GET", "/", "API.example.com:8443", true},
		{host, "GET", "/", "api.example.com.", true},
		{host, "GET", "/", "api.example.com, other", true},
		{host, "GET", "/", "www.example.com", false},
		{wild, "GET", "/", "a.b.example.com", true},
		{wild, "GET", "/", "example.com", false},
		{wild, "GET", "/", "badexample.com", false},
	}
	for _, tc := range tests {
		if got := tc.rule.Match(request(tc.method, tc.uri, tc.host, nil)); got != tc.want {
			t.Errorf("%s.Match(%s %q host %q) = %v, want %v", tc.rule.Name, tc.method, tc.uri, tc.host, got, tc.want)
		}
	}
}

func TestAppendKey(t *testing.T) {
	one := mustParse(t, "name=k key=header:X-Api-Key limit=3/1m")[0]
	two := mustParse(t, "name=k2 key=ip+header:X-Api-Key limit=3/1m")[0]
	paths := mustParse(t, "name=p key=method+path limit=3/1m")[0]
	tests := []struct {
		rule   *Rule
		h      headers
		want   string
		status KeyStatus
	}{
		{one, headers{"X-Api-Key": {"k1"}}, "k1", KeyOK},
		{one, headers{}, "", KeyMissing},
		{one, headers{"X-Api-Key": {""}}, "", KeyMissing},
		{one, headers{"X-Api-Key": {"k1", "r123"}}, "", KeyRepeated},
		{one, headers{"X-Api-Key": {"k1", ""}}, "", KeyRepeated},
		{two, headers{"X-Api-Key": {"k1"}}, "11:203.0.113.7|2:k1|", KeyOK},
		{two, headers{"X-Api-Key": {"k1", "k2"}}, "", KeyRepeated},
		{paths, nil, "3:GET|6:/login|", KeyOK},
	}
	for _, tc := range tests {
		got, status, header := tc.rule.AppendKey([]byte("x"), request("GET", "/Login", "", tc.h))
		if string(got) != "x"+tc.want || status != tc.status {
			t.Errorf("%s.AppendKey(%v) = %q, %v, want %q, %v", tc.rule.Name, tc.h, got, status, "x"+tc.want, tc.status)
		}
		if status != KeyOK && header != "X-Api-Key" {
			t.Errorf("%s.AppendKey(%v) blames header %q", tc.rule.Name, tc.h, header)
		}
	}
}

func TestCost(t *testing.T) {
	rules := mustParse(t, "name=plain limit=10/1m cost=3; name=hdr limit=10/1m cost=header:X-Len; "+
		"name=deny limit=10/1m cost=header:X-Len cost_missing=deny; name=charge limit=10/1m cost=header:X-Len cost_missing=7")
	plain, hdr, deny, charge := rules[0], rules[1], rules[2], rules[3]
	tests := []struct {
		rule   *Rule
		h      headers
		want   int64
		status CostStatus
	}{
		{plain, headers{"X-Len": {"9"}}, 0, CostOK},
		{hdr, headers{"X-Len": {"4"}}, 4, CostOK},
		{hdr, headers{"X-Len": {"0"}}, 0, CostOK},
		{hdr, headers{}, 1, CostOK},
		{hdr, headers{"X-Len": {""}}, 1, CostOK},
		{deny, headers{}, 0, CostMissing},
		{charge, headers{}, 7, CostOK},
		{hdr, headers{"X-Len": {"4", "4"}}, 0, CostRepeated},
		{hdr, headers{"X-Len": {"1125899906842624"}}, 1125899906842624, CostOK},
	}
	for _, bad := range []string{"abc", "-3", "+3", "1.5", "1125899906842625", "99999999999999999999", "4 4", " 4", "\xff", "0x10"} {
		tests = append(tests, struct {
			rule   *Rule
			h      headers
			want   int64
			status CostStatus
		}{hdr, headers{"X-Len": {bad}}, 0, CostInvalid})
	}
	for _, tc := range tests {
		got, status := tc.rule.Cost(request("GET", "/", "", tc.h))
		if got != tc.want || status != tc.status {
			t.Errorf("%s.Cost(%q) = %d, %v; want %d, %v", tc.rule.Name, tc.h, got, status, tc.want, tc.status)
		}
	}
}

// TestMatchMethod: a rule for GET applies to HEAD, which backends answer
// with the GET handler; on a POST, a rule for the method a method-override
// header names applies too, as backends that honour those headers route
// the request by it.
func TestMatchMethod(t *testing.T) {
	rs := mustParse(t, "name=get limit=2/1m method=GET; name=del limit=2/1m method=DELETE,PUT; name=head limit=2/1m method=HEAD; name=post limit=2/1m method=POST")
	get, del, head, post := rs[0], rs[1], rs[2], rs[3]
	tests := []struct {
		rule   *Rule
		method string
		h      headers
		want   bool
	}{
		{get, "GET", nil, true},
		{get, "HEAD", nil, true},
		{get, "head", nil, true},
		{get, "POST", nil, false},
		{head, "GET", nil, false},
		{head, "HEAD", nil, true},
		{del, "DELETE", nil, true},
		{del, "POST", nil, false},
		{del, "POST", headers{"X-Http-Method-Override": {"DELETE"}}, true},
		{del, "POST", headers{"X-Method-Override": {"delete"}}, true},
		{del, "POST", headers{"X-Http-Method": {" PUT "}}, true},
		{del, "POST", headers{"X-Http-Method-Override": {"PATCH"}}, false},
		{del, "POST", headers{"X-Http-Method-Override": {"PATCH"}, "X-Http-Method": {"DELETE"}}, true},
		{del, "POST", headers{"X-Http-Method-Override": {"GET, DELETE"}}, true},
		{del, "POST", headers{"X-Http-Method-Override": {""}}, false},
		// A repeated override header: whichever copy a backend reads,
		// the request falls under the rule.
		{del, "POST", headers{"X-Http-Method-Override": {"PATCH", "PATCH"}}, true},
		{get, "POST", headers{"X-Http-Method-Override": {"HEAD"}}, true},
		{get, "POST", headers{"X-Http-Method-Override": {"GET"}}, true},
		// The real method's rules still apply.
		{post, "POST", headers{"X-Http-Method-Override": {"DELETE"}}, true},
		// Backends honour overrides on POST only.
		{del, "GET", headers{"X-Http-Method-Override": {"DELETE"}}, false},
		{del, "PATCH", headers{"X-Http-Method-Override": {"DELETE"}}, false},
	}
	for _, tc := range tests {
		if got := tc.rule.Match(request(tc.method, "/", "", tc.h)); got != tc.want {
			t.Errorf("%s.Match(%s %v) = %v, want %v", tc.rule.Name, tc.method, tc.h, got, tc.want)
		}
	}
}
