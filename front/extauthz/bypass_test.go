package extauthz

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// The bypass corpus, decided through /auth and through Check: the spellings
// a client tries to get around a limit with (e2e/bypass_test.go,
// e2e/bypass_names_test.go), the seed corpora of the fuzz tests of /auth
// and of the path rules, and the handler's header tests. /auth's answer is
// the reference; Check must give the same status, headers and body, step
// by step, with raw headers and with Envoy's joined ones.

// bypassCases are the bypass tests' requests, each step's status as /auth
// answers it.
var bypassCases = []sameCase{
	{name: "repeated key header", rules: "name=apikey key=header:X-Api-Key limit=3/1h path=/api", steps: []step{
		{path: "/api", headers: []string{"X-Api-Key", "k1"}, want: 200}, {path: "/api", headers: []string{"X-Api-Key", "k1"}, want: 200},
		{path: "/api", headers: []string{"X-Api-Key", "k1"}, want: 200},
		{path: "/api", headers: []string{"X-Api-Key", "k1", "X-Api-Key", "r0"}, want: 429},
		{path: "/api", headers: []string{"X-Api-Key", "k1", "X-Api-Key", "r1"}, want: 429},
		{path: "/api", headers: []string{"X-Api-Key", "k1"}, want: 429},
		{path: "/api", headers: []string{"X-Api-Key", "k2", "X-Api-Key", "k3"}, want: 429},
		{path: "/api", headers: []string{"X-Api-Key", "k2"}, want: 200},
	}},
	{name: "repeated headers a server parses itself", rules: "name=ua key=header:User-Agent limit=1/1m path=/ua; name=ct key=header:Content-Type limit=1/1m path=/ct;" +
		"name=cookie key=header:Cookie limit=1/1m path=/cookie; name=ae key=header:Accept-Encoding limit=1/1m path=/ae; name=via key=header:Via limit=1/1m path=/via", steps: repeatedSteps()},
	{name: "repeated cost header", rules: "name=cost key=ip limit=10/1m cost=header:X-Cost path=/cost", steps: []step{
		{path: "/cost", headers: []string{"X-Cost", "5", "X-Cost", "1"}, want: 429}, {path: "/cost", headers: []string{"X-Cost", "10"}, want: 200},
		{path: "/cost", headers: []string{"X-Cost", "1"}, want: 429},
	}},
	{name: "underscore and case spellings", rules: "name=apikey key=header:X-Api-Key limit=2/1m path=/api; name=c key=ip limit=5/1m cost=header:X-Cost path=/cost", steps: []step{
		{path: "/api", headers: []string{"X_Api_Key", "victim"}, want: 200}, {path: "/api", headers: []string{"x_api_key", "victim"}, want: 200},
		{path: "/api", headers: []string{"X-Api-Key", "victim"}, want: 429}, {path: "/api", headers: []string{"X-API-KEY", "victim"}, want: 429},
		{path: "/api", headers: []string{"X_Api-Key", "victim"}, want: 429},
		{path: "/api", headers: []string{"X_Api_Key", "victim", "X-Api-Key", "fresh0"}, want: 429},
		{path: "/api", headers: []string{"X-Api-Key", "fresh1", "x_api_key", "victim"}, want: 429},
		{path: "/api", headers: []string{"X-Api_Key", "victim", "X_Api-Key", "fresh2"}, want: 429},
		{path: "/api", headers: []string{"X-Api-Key", "other"}, want: 200},
		{path: "/cost", headers: []string{"X_Cost", "5", "X-Cost", "1"}, want: 429}, {path: "/cost", headers: []string{"X_Cost", "5"}, want: 200},
		{path: "/cost", headers: []string{"X-Cost", "1"}, want: 429},
	}},
	{name: "path spellings", rules: "name=login key=ip limit=2/1m path=/login", steps: pathSteps(
		[]string{"/login;a=1", "/LOGIN", "/Login/", "/login;jsessionid=x/", "/LoGiN;x=1?q=2", "/%4Cogin", "/x/..;/login", "/login;/step2"})},
	{name: "regular expression and a trailing slash", rules: "name=up key=ip limit=2/1m path=~^/api/v[0-9]+/upload$", steps: []step{
		{path: "/api/v1/upload/", want: 200}, {path: "/api/v1/upload/.", want: 200}, {path: "/api/v1/upload", want: 429},
		{path: "/api/v1/upload/", want: 429}, {path: "/API/v1/upload//", want: 429}, {path: "/api/v1/upload/x", want: 200},
	}},
	{name: "HEAD and method overrides", rules: "name=get key=ip limit=2/1m method=GET path=/get; name=del key=ip limit=1/1m method=DELETE path=/del", steps: []step{
		{method: "HEAD", path: "/get", want: 200}, {method: "HEAD", path: "/get", want: 200}, {path: "/get", want: 429}, {method: "HEAD", path: "/get", want: 429},
		{method: "POST", path: "/del", headers: []string{"X-HTTP-Method-Override", "DELETE"}, want: 200}, {method: "DELETE", path: "/del", want: 429},
		{method: "POST", path: "/del", headers: []string{"X-HTTP-Method-Override", "delete"}, want: 429},
		{method: "POST", path: "/del", headers: []string{"X-Method-Override", "delete"}, want: 429},
		{method: "POST", path: "/del", headers: []string{"X-HTTP-Method", "delete"}, want: 429},
		{method: "POST", path: "/del", headers: []string{"X_HTTP_Method_Override", "delete"}, want: 429},
		{method: "POST", path: "/del", want: 200},
	}},
	{name: "a method override listing methods", rules: "name=del key=ip limit=1/1m method=DELETE path=/del", rawOnly: true, steps: []step{
		{method: "POST", path: "/del", headers: []string{"X-Method-Override", "patch, Put"}, want: 200},
		{method: "POST", path: "/del", headers: []string{"X-Method-Override", "patch, Delete"}, want: 200},
		{method: "POST", path: "/del", headers: []string{"X-Method-Override", "DELETE"}, want: 429},
	}},
	{name: "forwarding headers", rules: "name=per-ip key=ip limit=2/1m; name=h key=host limit=1/1m path=/h", steps: []step{
		{want: 200}, {spoof: "198.18.0.1", want: 200}, {spoof: "198.18.0.2", want: 429}, {proxied: true, spoof: "198.18.0.3", want: 429},
		{headers: []string{"X_Forwarded_For", "198.18.0.4"}, want: 429}, {headers: []string{"X-Real-IP", "198.18.0.5"}, want: 429},
		{headers: []string{"X_Real_IP", "198.18.0.6", "X-Real-Ip", "198.18.0.7"}, want: 429},
		{client: "203.0.113.20", path: "/h", headers: []string{"X-Forwarded-Host", "elsewhere.example"}, want: 200},
		{client: "203.0.113.21", path: "/h", headers: []string{"X_Forwarded_Host", "r1.example"}, want: 429},
		{client: "203.0.113.22", path: "/h", host: "API.Example.com:80", want: 429},
	}},
}

// repeatedSteps are the bypass test's repeats of the headers a server
// parses itself, and of list-valued ones.
func repeatedSteps() []step {
	var steps []step
	for _, tc := range []struct{ path, header string }{
		{"/ua", "User-Agent"}, {"/ct", "Content-Type"}, {"/cookie", "Cookie"}, {"/ae", "Accept-Encoding"}, {"/via", "Via"},
	} {
		victim := "victim"
		if tc.header == "Cookie" {
			victim = "session=victim"
		}
		steps = append(steps, step{path: tc.path, headers: []string{tc.header, victim}, want: 200},
			step{path: tc.path, headers: []string{tc.header, victim}, want: 429})
		for i := 0; i < 2; i++ {
			other := fmt.Sprintf("r%d", i)
			if tc.header == "Cookie" {
				other = "x=" + other
			}
			steps = append(steps, step{path: tc.path, headers: []string{tc.header, victim, tc.header, other}, want: 429},
				step{path: tc.path, headers: []string{tc.header, other, tc.header, victim}, want: 429})
		}
		steps = append(steps, step{path: tc.path, headers: []string{tc.header, "fresh", tc.header, ""}, want: 429})
	}
	return steps
}

// pathSteps: each spelling, from a client of its own, spends the login
// quota and is limited by it.
func pathSteps(spellings []string) []step {
	var steps []step
	for i, path := range spellings {
		client := fmt.Sprintf("203.0.113.%d", 100+i)
		steps = append(steps, step{client: client, path: path, want: 200}, step{client: client, path: path, want: 200},
			step{client: client, path: "/login", want: 429}, step{client: client, path: path, want: 429},
			step{client: client, path: "/logins", want: 200})
	}
	return steps
}

// corpus reads the seed corpus of a fuzz target: each entry's values, in
// order. Entries a proxy could not forward (not UTF-8, control bytes) are
// left out: neither front ever sees them.
func corpus(t *testing.T, dir string) [][]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("the seed corpus %s: %v, %d files", dir, err, len(files))
	}
	var entries [][]string
entries:
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var values []string
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			line := sc.Text()
			if line == "go test fuzz v1" || line == "" {
				continue
			}
			q, ok := strings.CutPrefix(line, "string(")
			if !ok {
				t.Fatalf("%s: %q is not a string value", f, line)
			}
			v, err := strconv.Unquote(strings.TrimSuffix(q, ")"))
			if err != nil {
				t.Fatalf("%s: %q: %v", f, line, err)
			}
			if !forwardable(v) {
				continue entries
			}
			values = append(values, v)
		}
		entries = append(entries, values)
	}
	return entries
}

// forwardable reports whether a proxy forwards v in a header value: UTF-8
// (a gRPC string), without control bytes, not padded with spaces.
func forwardable(v string) bool {
	if !utf8.ValidString(v) || strings.TrimSpace(v) != v {
		return false
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// TestBypassCorpusAgrees decides the bypass corpus through /auth and
// through Check (see checkAnswersAsAuth).
func TestBypassCorpusAgrees(t *testing.T) {
	cases := append([]sameCase{}, bypassCases...)

	// FuzzAuth's seeds, under its rules: the forwarded X-Forwarded-For,
	// X-Real-IP, URI, method and host, X-Api-Key and X-Cost.
	auth := sameCase{name: "FuzzAuth seeds", rules: "name=per-ip limit=3/1m; name=login key=ip+header:X-Api-Key limit=2/1m path=/login on_missing=deny;" +
		"name=cost key=header:X-Api-Key limit=10/1m algorithm=token_bucket cost=header:X-Cost host=*.example.com"}
	for _, e := range corpus(t, "../../handler/testdata/fuzz/FuzzAuth") {
		if len(e) != 7 || e[3] == "" || strings.ContainsAny(e[0], " ") {
			continue // Envoy always has a method; a proxy writes X-Forwarded-For without spaces
		}
		s := step{spoof: e[0], path: e[2], method: e[3], host: e[4]}
		for i, name := range []string{"X-Real-IP", "", "", "", "X-Api-Key", "X-Cost"} {
			if name != "" && e[i+1] != "" {
				s.headers = append(s.headers, name, e[i+1])
			}
		}
		auth.steps = append(auth.steps, s)
	}
	// The path rules' seeds.
	paths := sameCase{name: "FuzzAppendPath seeds", rules: "name=p key=path limit=1/1m"}
	for _, e := range corpus(t, "../../rules/testdata/fuzz/FuzzAppendPath") {
		for _, p := range e {
			paths.steps = append(paths.steps, step{path: p}, step{path: p})
		}
	}
	if len(auth.steps) == 0 || len(paths.steps) == 0 {
		t.Fatalf("%d and %d steps from the seed corpora", len(auth.steps), len(paths.steps))
	}
	checkAnswersAsAuth(t, append(cases, auth, paths))
}
