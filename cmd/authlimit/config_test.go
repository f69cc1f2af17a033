package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/rules"
)

// checkEnv runs authlimit -check on env and returns everything it said:
// the error, stdout and stderr.
func checkEnv(t *testing.T, env map[string]string) (said string, err error) {
	t.Helper()
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	var out, errOut bytes.Buffer
	err = run(context.Background(), []string{"-check"}, environ, &out, &errOut)
	said = out.String() + errOut.String()
	if err != nil {
		said += err.Error()
	}
	return said, err
}

// configErrors returns the problems loadConfig found, by variable.
func configErrors(err error) map[string][]string {
	out := map[string][]string{}
	if err == nil {
		return out
	}
	for _, e := range unjoin(err) {
		var ce *ConfigError
		if errors.As(e, &ce) {
			out[ce.Var] = append(out[ce.Var], ce.Err.Error())
		} else {
			out[""] = append(out[""], e.Error())
		}
	}
	return out
}

// TestConfigErrorsNameTheVariable: every mistake fails -check with a
// usage error (exit 2) naming the variable.
func TestConfigErrorsNameTheVariable(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		variable string
		want     string
	}{
		// Finding 9: set but empty is not "the defaults".
		{"trusted proxies set but empty", map[string]string{"AUTHLIMIT_TRUSTED_PROXIES": ""}, "AUTHLIMIT_TRUSTED_PROXIES", "set but empty: unset it for the default (127.0.0.0/8,"},
		{"trusted proxies blank", map[string]string{"AUTHLIMIT_TRUSTED_PROXIES": " "}, "AUTHLIMIT_TRUSTED_PROXIES", "or none to trust no proxy"},
		{"trusted proxies none among others", map[string]string{"AUTHLIMIT_TRUSTED_PROXIES": "none,10.0.0.0/8"}, "AUTHLIMIT_TRUSTED_PROXIES", `"none" is not a CIDR`},
		// Finding 11: ports beyond 65535.
		{"listen port too large", map[string]string{"AUTHLIMIT_LISTEN": "127.0.0.1:99999"}, "AUTHLIMIT_LISTEN", `port "99999" is not a number from 0 to 65535`},
		{"listen port too large, any address", map[string]string{"AUTHLIMIT_LISTEN": ":65536"}, "AUTHLIMIT_LISTEN", `port "65536"`},
		{"listen port negative", map[string]string{"AUTHLIMIT_LISTEN": "127.0.0.1:-1"}, "AUTHLIMIT_LISTEN", `port "-1"`},
		{"listen port by name", map[string]string{"AUTHLIMIT_LISTEN": "127.0.0.1:http"}, "AUTHLIMIT_LISTEN", `port "http"`},
		{"listen without a port", map[string]string{"AUTHLIMIT_LISTEN": "127.0.0.1"}, "AUTHLIMIT_LISTEN", "is not host:port or unix:<path>"},
		{"listen on unix: without a path", map[string]string{"AUTHLIMIT_LISTEN": "unix:"}, "AUTHLIMIT_LISTEN", "needs a socket path"},
		{"pprof port too large", map[string]string{"AUTHLIMIT_PPROF_LISTEN": "127.0.0.1:99999"}, "AUTHLIMIT_PPROF_LISTEN", `port "99999"`},
		// Finding 8: a mapped prefix shorter than /96 is not IPv4.
		{"block a mapped prefix beyond ::ffff:0:0/96", map[string]string{"AUTHLIMIT_BLOCK_CIDRS": "::ffff:0:0/95"}, "AUTHLIMIT_BLOCK_CIDRS", "reaches beyond the IPv4-mapped addresses"},
		{"allow a mapped prefix beyond ::ffff:0:0/96", map[string]string{"AUTHLIMIT_ALLOW_CIDRS": "::ffff:0:0/80"}, "AUTHLIMIT_ALLOW_CIDRS", "reaches beyond"},
		{"trust a mapped prefix beyond ::ffff:0:0/96", map[string]string{"AUTHLIMIT_TRUSTED_PROXIES": "::ffff:0:0/64"}, "AUTHLIMIT_TRUSTED_PROXIES", "reaches beyond"},
		// Finding 10: a Redis URL that does not parse.
		{"redis URL without a scheme", map[string]string{"AUTHLIMIT_REDIS_URL": "localhost:6379"}, "AUTHLIMIT_REDIS_URL", "not a URL"},
		{"redis URL of another scheme", map[string]string{"AUTHLIMIT_REDIS_URL": "http://localhost:6379"}, "AUTHLIMIT_REDIS_URL", "invalid URL scheme"},
		{"redis URL with a '#' in the password", map[string]string{"AUTHLIMIT_REDIS_URL": "redis://user:sec#ret@localhost:6379"}, "AUTHLIMIT_REDIS_URL", "redis://***@localhost:6379: its user information (all between :// and the last @) does not parse: percent-encode"},
		{"redis URL with a bad database", map[string]string{"AUTHLIMIT_REDIS_URL": "redis://localhost:6379/x"}, "AUTHLIMIT_REDIS_URL", "invalid database number"},
		// Recovery within 2 s of Redis answering needs a probe at least
		// once a second.
		{"breaker max backoff above 1s", map[string]string{"AUTHLIMIT_BREAKER_MAX_BACKOFF": "2s"}, "AUTHLIMIT_BREAKER_MAX_BACKOFF", "2s is not between 1ms and 1s: an open circuit waits up to this long between probes"},
		{"breaker max backoff zero", map[string]string{"AUTHLIMIT_BREAKER_MAX_BACKOFF": "0s"}, "AUTHLIMIT_BREAKER_MAX_BACKOFF", "0s is not between 1ms and 1s"},
		{"grpc peers not CIDRs", map[string]string{"AUTHLIMIT_GRPC_LISTEN": ":8081", "AUTHLIMIT_GRPC_TRUSTED_PEERS": "10.0.0.0/8,gateway"}, "AUTHLIMIT_GRPC_TRUSTED_PEERS", `"gateway" is not a CIDR or an IP address`},
		{"grpc with no proxy trusted and no peers", map[string]string{"AUTHLIMIT_GRPC_LISTEN": ":8081", "AUTHLIMIT_TRUSTED_PROXIES": "none"}, "AUTHLIMIT_GRPC_TRUSTED_PEERS", "unset, and AUTHLIMIT_TRUSTED_PROXIES trusts no one: no peer could call the gRPC port"},
		{"buffered bytes below 1 MiB", map[string]string{"AUTHLIMIT_MAX_BUFFERED_BYTES": "65536"}, "AUTHLIMIT_MAX_BUFFERED_BYTES", "65536 is less than 1048576 (1 MiB, and 4 requests of AUTHLIMIT_MAX_HEADER_BYTES)"},
		{"buffered bytes below 4 header blocks", map[string]string{"AUTHLIMIT_MAX_BUFFERED_BYTES": "2000000", "AUTHLIMIT_MAX_HEADER_BYTES": "1048576"}, "AUTHLIMIT_MAX_BUFFERED_BYTES", "2000000 is less than 4194304"},
		{"buffered bytes not a number", map[string]string{"AUTHLIMIT_MAX_BUFFERED_BYTES": "32MiB"}, "AUTHLIMIT_MAX_BUFFERED_BYTES", `"32MiB" is not`},
		{"breaker backoff above max backoff", map[string]string{"AUTHLIMIT_BREAKER_BACKOFF": "800ms"}, "AUTHLIMIT_BREAKER_BACKOFF", "800ms is more than AUTHLIMIT_BREAKER_MAX_BACKOFF (500ms)"},
		{"breaker backoff above max backoff, both set", map[string]string{"AUTHLIMIT_BREAKER_BACKOFF": "300ms", "AUTHLIMIT_BREAKER_MAX_BACKOFF": "200ms"}, "AUTHLIMIT_BREAKER_BACKOFF", "300ms is more than AUTHLIMIT_BREAKER_MAX_BACKOFF (200ms)"},
		{"breaker backoff above 1s", map[string]string{"AUTHLIMIT_BREAKER_BACKOFF": "5s"}, "AUTHLIMIT_BREAKER_BACKOFF", "5s is not between 1ms and 1s"},
		{"breaker backoff zero", map[string]string{"AUTHLIMIT_BREAKER_BACKOFF": "0s"}, "AUTHLIMIT_BREAKER_BACKOFF", "0s is not between 1ms and 1s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			said, err := checkEnv(t, tc.env)
			var u usageError
			if !errors.As(err, &u) {
				t.Fatalf("-check with %v = %v, want a usage error (exit 2)", tc.env, err)
			}
			if !strings.Contains(said, tc.variable+": ") {
				t.Errorf("-check with %v does not name %s:\n%s", tc.env, tc.variable, said)
			}
			_, err = loadConfig(tc.env)
			problems := configErrors(err)[tc.variable]
			if !strings.Contains(strings.Join(problems, "\n"), tc.want) {
				t.Errorf("loadConfig(%v): %s problems %q, want one saying %q (all: %v)", tc.env, tc.variable, problems, tc.want, err)
			}
		})
	}
}

// TestConfigBreakerBackoffs: backoffs up to the 1s bound, the first no
// longer than the last, are valid.
func TestConfigBreakerBackoffs(t *testing.T) {
	for _, env := range []map[string]string{
		{"AUTHLIMIT_BREAKER_MAX_BACKOFF": "1s"},
		{"AUTHLIMIT_BREAKER_BACKOFF": "1s", "AUTHLIMIT_BREAKER_MAX_BACKOFF": "1s"},
		{"AUTHLIMIT_BREAKER_BACKOFF": "1ms", "AUTHLIMIT_BREAKER_MAX_BACKOFF": "1ms"},
	} {
		if _, err := loadConfig(env); err != nil {
			t.Errorf("loadConfig(%v): %v, want valid", env, err)
		}
	}
}

// TestCheckHeaders: -check names the headers authlimit reads, and with
// AUTHLIMIT_URL_HEADER set, not the uri and host headers it then ignores.
func TestCheckHeaders(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"defaults", map[string]string{}, "headers          method X-Forwarded-Method, uri X-Forwarded-Uri, host X-Forwarded-Host\n"},
		{"url header", map[string]string{"AUTHLIMIT_URL_HEADER": "X-Original-URL", "AUTHLIMIT_METHOD_HEADER": "X-Original-Method"}, "headers          url X-Original-URL (host and uri), method X-Original-Method\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			said, err := checkEnv(t, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(said, tc.want) {
				t.Errorf("-check with %v does not say %q:\n%s", tc.env, tc.want, said)
			}
		})
	}
}

// TestMappedPrefixesAreUnmapped: an IPv4-mapped prefix in any list is read
// as the IPv4 prefix it maps (finding 8), so it matches IPv4 clients.
func TestMappedPrefixesAreUnmapped(t *testing.T) {
	want := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("198.51.100.7/32")}
	for _, v := range []string{"TRUSTED_PROXIES", "ALLOW_CIDRS", "BLOCK_CIDRS"} {
		s, err := loadConfig(map[string]string{envPrefix + v: "::ffff:203.0.113.0/120, ::ffff:198.51.100.7"})
		if err != nil {
			t.Fatalf("AUTHLIMIT_%s: %v", v, err)
		}
		got := map[string][]netip.Prefix{"TRUSTED_PROXIES": s.trusted, "ALLOW_CIDRS": s.allow, "BLOCK_CIDRS": s.block}[v]
		if !reflect.DeepEqual(got, want) {
			t.Errorf("AUTHLIMIT_%s=::ffff:203.0.113.0/120, ::ffff:198.51.100.7 reads as %v, want %v", v, got, want)
		}
	}
}

// TestMappedPrefixesMatchIPv4Clients: the same, end to end.
func TestMappedPrefixesMatchIPv4Clients(t *testing.T) {
	t.Run("block", func(t *testing.T) {
		app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=a limit=100/1m", "AUTHLIMIT_BLOCK_CIDRS": "::ffff:203.0.113.0/120"})
		r := app.do(t, authFrom("203.0.113.5"))
		wantStatus(t, r, 429, "a client in a mapped block-listed prefix")
		if p := r.problem(t); p.Type != "urn:authlimit:blocked" {
			t.Errorf("problem type = %q, want urn:authlimit:blocked", p.Type)
		}
	})
	t.Run("allow", func(t *testing.T) {
		app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=a limit=1/1m", "AUTHLIMIT_ALLOW_CIDRS": "::ffff:203.0.113.0/120"})
		for i := 0; i < 3; i++ {
			r := app.do(t, authFrom("203.0.113.5"))
			wantStatus(t, r, 200, "a client in a mapped allow-listed prefix")
			if r.header("X-RateLimit-Limit") != "" {
				t.Errorf("allow-listed answer has rate-limit headers: %v", r.headers)
			}
		}
	})
	t.Run("trusted proxies", func(t *testing.T) {
		// Through a proxy in the mapped prefix, each forwarded client has
		// its own quota; were the proxy not trusted, the proxy would be
		// the client and the second request denied.
		app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=a limit=1/1m", "AUTHLIMIT_TRUSTED_PROXIES": "::ffff:203.0.113.0/120"})
		for _, client := range []string{"198.51.100.7", "198.51.100.8"} {
			r := authFrom(client)
			r.peer = "203.0.113.5"
			wantStatus(t, app.do(t, r), 200, "client "+client+" through a proxy in a mapped trusted prefix")
		}
	})
}

// TestTrustedProxiesNone: none trusts no proxy (finding 9): even a
// loopback peer's forwarded headers are not believed.
func TestTrustedProxiesNone(t *testing.T) {
	s, err := loadConfig(map[string]string{"AUTHLIMIT_TRUSTED_PROXIES": "none"})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.trusted) != 0 {
		t.Errorf("AUTHLIMIT_TRUSTED_PROXIES=none trusts %v, want nothing", s.trusted)
	}
	if !strings.Contains(s.describe(), "trusted proxies  none") {
		t.Errorf("-check does not say that no proxy is trusted:\n%s", s.describe())
	}
	app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=a limit=1/1m", "AUTHLIMIT_TRUSTED_PROXIES": "none"})
	wantStatus(t, app.do(t, authFrom("198.51.100.7")), 200, "first")
	wantStatus(t, app.do(t, authFrom("198.51.100.8")), 429, "second: the peer is the client, whatever it forwards")
}

// TestRedisURLNeverShowsCredentials: whatever the user information of
// AUTHLIMIT_REDIS_URL holds, and whether the URL parses or not, no piece
// of it shows in -check's output, its errors, or the logs (finding 10).
// The user names and passwords are made of letters that nothing else
// authlimit says contains, so that even a one-letter password is found.
func TestRedisURLNeverShowsCredentials(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port) // nothing listens: authlimit logs the failure
	tests := []struct {
		name     string
		userinfo string // as written in the URL
		secret   string // the letters that must never show
		valid    bool
	}{
		{"one-letter pieces around #", "J:Q#Z", "JQZ", false},
		{"two-letter pieces around #", "JK:QZ#ZQ", "JKQZ", false},
		{"one-letter password ending in #", "JK:Q#", "JKQ", false},
		{"password starting with #", "J:#Q", "JQ", false},
		{"no user, one-letter pieces around #", ":Q#Z", "QZ", false},
		{"digits and # read as a port", "JK:12#Q", "JKQ", false},
		{"password with %", "JK:Q%Z", "JKQZ", false},
		{"password with % and no hex digits", "JK:Q%ZZ", "JKQZ", false},
		{"password with /", "JK:Q/Z", "JKQZ", false},
		{"digits and / read as a port", "JK:9/Q", "JKQ", false},
		{"password with ?", "JK:Q?Z", "JKQZ", false},
		{"password with #, @, / and %", "JK:Q#@/%Z", "JKQZ", false},
		{"one-letter password", "J:Q", "JQ", true},
		{"two-letter password", "JK:QZ", "JKQZ", true},
		{"password with @", "JK:Q@Z", "JKQZ", true},
		{"escaped #", "JK:Q%23Z", "JKQZ", true},
		{"escaped @, / and %", "J:Q%40%2F%25Z", "JQZ", true},
		{"user only", "JK", "JK", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host := "localhost:6379"
			if tc.valid {
				host = addr
			}
			url := "redis://" + tc.userinfo + "@" + host + "/0"
			env := map[string]string{"AUTHLIMIT_REDIS_URL": url, "AUTHLIMIT_RULES": "name=a limit=1/1m"}
			said, err := checkEnv(t, env)
			if tc.valid != (err == nil) {
				t.Fatalf("-check with AUTHLIMIT_REDIS_URL=%s: %v, want valid %v", url, err, tc.valid)
			}
			if err != nil && !strings.Contains(said, "AUTHLIMIT_REDIS_URL: redis://***@") {
				t.Errorf("-check does not name AUTHLIMIT_REDIS_URL with its credentials hidden:\n%s", said)
			}
			if tc.valid {
				if !strings.Contains(said, "redis standalone redis://***@"+host) {
					t.Errorf("-check does not show the store with its credentials hidden:\n%s", said)
				}
				said += startLogs(t, env)
			}
			if i := strings.IndexAny(said, tc.secret); i >= 0 {
				t.Errorf("AUTHLIMIT_REDIS_URL=%s: %q shows in:\n%s", url, said[i], said)
			}
		})
	}
}

// startLogs builds authlimit from env and returns what it logged.
func startLogs(t *testing.T, env map[string]string) string {
	t.Helper()
	s, err := loadConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	noTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{} // its "Z" is no credential
		}
		return a
	}
	a, err := newApp(context.Background(), s, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: noTime})))
	if err != nil {
		return logs.String() + err.Error()
	}
	a.close()
	return logs.String()
}

// configDoc is the configuration reference: its tables list every
// variable with its default.
const configDoc = "../../docs/configuration.md"

// TestDocsDocumentEveryVariable: the configuration reference's tables and
// config agree: the same variables, with the same defaults.
func TestDocsDocumentEveryVariable(t *testing.T) {
	readme, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]string{} // variable → default as the tables show it
	cell := regexp.MustCompile("`(" + envPrefix + "[A-Z0-9_]+)`")
	for _, line := range strings.Split(string(readme), "\n") {
		if !strings.HasPrefix(line, "| `"+envPrefix) {
			continue
		}
		cells := strings.Split(line, " | ")
		if len(cells) < 3 {
			t.Errorf("%s: row %q has no default column", configDoc, line)
			continue
		}
		def := cells[1]
		if d, ok := strings.CutPrefix(def, "`"); ok && strings.HasSuffix(d, "`") {
			def = strings.TrimSuffix(d, "`")
		} else if def == "unset" {
			def = ""
		}
		for _, m := range cell.FindAllStringSubmatch(cells[0], -1) {
			documented[m[1]] = def
		}
	}
	var mismatches []string
	fields := map[string]bool{}
	for _, f := range envFields() {
		name := envPrefix + f.key
		fields[name] = true
		want := f.def
		if f.key == "RULES" {
			want = rules.Default // applied by loadConfig, so that it can say so
		}
		got, ok := documented[name]
		switch {
		case !ok:
			mismatches = append(mismatches, name+" is in no table")
		case got != want:
			shown := "unset"
			if got != "" {
				shown = "`" + got + "`"
			}
			wantShown := "unset"
			if want != "" {
				wantShown = "`" + want + "`"
			}
			mismatches = append(mismatches, name+": the table says the default is "+shown+", config has "+wantShown)
		}
	}
	for name := range documented {
		if !fields[name] {
			mismatches = append(mismatches, name+" is in a table, but config has no such variable")
		}
	}
	if len(mismatches) > 0 {
		sort.Strings(mismatches)
		t.Errorf("%s and config disagree:\n  %s", configDoc, strings.Join(mismatches, "\n  "))
	}
}

// TestMemoryMaxKeysDefault: AUTHLIMIT_MEMORY_MAX_KEYS defaults to the
// memory store's own bound, which is kept in algo alone.
func TestMemoryMaxKeysDefault(t *testing.T) {
	s, err := loadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.MemoryMaxKeys, algo.DefaultMemoryMaxKeys; got != want {
		t.Errorf("default AUTHLIMIT_MEMORY_MAX_KEYS = %d, want algo.DefaultMemoryMaxKeys (%d)", got, want)
	}
	for _, f := range envFields() {
		if f.key == "MEMORY_MAX_KEYS" && f.def != strconv.Itoa(algo.DefaultMemoryMaxKeys) {
			t.Errorf("the default of AUTHLIMIT_MEMORY_MAX_KEYS reads as %q, want %d", f.def, algo.DefaultMemoryMaxKeys)
		}
	}
	if _, err := loadConfig(map[string]string{"AUTHLIMIT_MEMORY_MAX_KEYS": ""}); !strings.Contains(fmt.Sprint(err), "AUTHLIMIT_MEMORY_MAX_KEYS: set but empty: unset it for the default (1048576)") {
		t.Errorf("AUTHLIMIT_MEMORY_MAX_KEYS set but empty: %v", err)
	}
	s, err = loadConfig(map[string]string{"AUTHLIMIT_MEMORY_MAX_KEYS": "1000"})
	if err != nil || s.MemoryMaxKeys != 1000 {
		t.Errorf("AUTHLIMIT_MEMORY_MAX_KEYS=1000: %v, %v", s, err)
	}
}

// TestCheckRulesThatNeverWork: -check refuses a rule that can never match
// or never act, naming the variable, the rule and the field, and warns of
// one that works only behind some proxies, saying what to use instead.
func TestCheckRulesThatNeverWork(t *testing.T) {
	for _, tc := range []struct{ rules, want string }{
		{`name=search limit=1/1m path=~^/search\?q=x`, `AUTHLIMIT_RULES: rule 1 "search": path "~^/search\\?q=x": paths are matched without their query`},
		{`name=login limit=1/1m path=~(?-i)^/Login$`, `AUTHLIMIT_RULES: rule 1 "login": path "~(?-i)^/Login$": paths are matched in lower case`},
		{`name=a limit=1/1m; name=m key=ip limit=1/1m on_missing=deny`, `AUTHLIMIT_RULES: rule 2 "m": on_missing "deny": the key "ip" has no header: part`},
		{`name=api key=header:K limit=1/1m tier=header:X-Plan`, `AUTHLIMIT_RULES: rule 1 "api": tier "header:X-Plan": no tier names this rule`},
		{`name=api key=header:K limit=1/1m; tier rule=api name=pro limit=2/1m`, `AUTHLIMIT_RULES: tier 1 "pro" of rule "api": rule "api": the rule reads no tier`},
		{`name=api key=header:K limit=1/1m; override rule=api key=k1 limit=2/1x`, `AUTHLIMIT_RULES: override 1 of rule "api": limit "2/1x": unknown unit "x"`},
	} {
		said, err := checkEnv(t, map[string]string{"AUTHLIMIT_RULES": tc.rules})
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(said, tc.want) {
			t.Errorf("-check with %q = %v, want a usage error saying %q:\n%s", tc.rules, err, tc.want, said)
		}
	}
	for _, tc := range []struct{ rules, want string }{
		{`name=h key=header:Host limit=1/1m`, `AUTHLIMIT_RULES: rule 1 "h": key "header:Host": behind nginx auth_request`},
		{`name=up limit=1000/1m cost=header:Content-Length`, `AUTHLIMIT_RULES: rule 1 "up": cost "header:Content-Length": nginx clears Content-Length`},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"-check"}, []string{"AUTHLIMIT_RULES=" + tc.rules}, &out, io.Discard); err != nil {
			t.Errorf("-check with %q: %v, want success with a warning", tc.rules, err)
			continue
		}
		if !strings.Contains(out.String(), "  warnings:\n    "+tc.want) {
			t.Errorf("-check with %q does not warn %q:\n%s", tc.rules, tc.want, out.String())
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-check"}, []string{"AUTHLIMIT_RULES=name=h key=host limit=1/1m"}, &out, io.Discard); err != nil || strings.Contains(out.String(), "warnings") {
		t.Errorf("-check with key=host: %v, want success without warnings:\n%s", err, out.String())
	}
	// The start logs the warnings too.
	app := startApp(t, map[string]string{"AUTHLIMIT_RULES": "name=h key=header:Host limit=1/1m"})
	if logs := app.logs.String(); !strings.Contains(logs, "configuration warning") || !strings.Contains(logs, `key \"header:Host\": behind nginx`) {
		t.Errorf("the start does not log the warning:\n%s", logs)
	}
}

// TestMaxConns: AUTHLIMIT_MAX_CONNS is a positive number of connections;
// unset, the cap is the open file limit less a reserve.
func TestMaxConns(t *testing.T) {
	for _, v := range []string{"0", "-5", "many"} {
		_, err := loadConfig(map[string]string{"AUTHLIMIT_MAX_CONNS": v})
		if err == nil || !strings.Contains(err.Error(), "AUTHLIMIT_MAX_CONNS") {
			t.Errorf("AUTHLIMIT_MAX_CONNS=%s: %v; want an error naming the variable", v, err)
		}
	}
	s, err := loadConfig(map[string]string{"AUTHLIMIT_MAX_CONNS": "500"})
	if err != nil {
		t.Fatal(err)
	}
	s.limitConns(256)
	if s.maxConns != 500 {
		t.Errorf("AUTHLIMIT_MAX_CONNS=500 under a limit of 256: cap %d, want 500 as set", s.maxConns)
	}
	for _, tc := range []struct {
		limit uint64
		want  int
	}{{0, 0}, {1, 1}, {100, 50}, {128, 64}, {256, 192}, {1024, 922}, {1 << 20, 943719}} {
		s, err := loadConfig(map[string]string{})
		if err != nil {
			t.Fatal(err)
		}
		s.limitConns(tc.limit)
		if s.maxConns != tc.want {
			t.Errorf("open file limit %d: cap %d, want %d", tc.limit, s.maxConns, tc.want)
		}
		if tc.limit > 0 && !strings.Contains(s.describe(), fmt.Sprintf("max conns        %d (the open file limit %d", tc.want, tc.limit)) {
			t.Errorf("describe() does not give the cap %d:\n%s", tc.want, s.describe())
		}
	}
}

// TestRedisTLSDialerBoundsTheHandshake: over rediss://, in every mode, the
// client's dialer is one whose handshake ends at the dial's context's
// deadline: against a server that accepts and never answers, a dial with
// 100ms left fails well before the dial timeout (1s at least). Over
// redis:// go-redis's own dialer, which honours the context, is kept.
func TestRedisTLSDialerBoundsTheHandshake(t *testing.T) {
	silent := redistest.Silent(t)
	for _, mode := range []string{"standalone", "cluster", "sentinel"} {
		t.Run(mode, func(t *testing.T) {
			env := map[string]string{
				"AUTHLIMIT_REDIS_URL":     "rediss://" + silent,
				"AUTHLIMIT_REDIS_MODE":    mode,
				"AUTHLIMIT_REDIS_TIMEOUT": "50ms",
			}
			if mode == "sentinel" {
				env["AUTHLIMIT_REDIS_MASTER"] = "mymaster"
			}
			s, err := loadConfig(env)
			if err != nil {
				t.Fatal(err)
			}
			dialers := map[string]func(context.Context, string, string) (net.Conn, error){"universal": s.redisOptions.Dialer}
			if s.redisPlain != nil {
				dialers["plain"] = s.redisPlain.Dialer
			}
			for name, dial := range dialers {
				if dial == nil {
					t.Errorf("%s options: no dialer of authlimit's; go-redis's TLS dialing ignores the context", name)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				start := time.Now()
				c, err := dial(ctx, "tcp", silent)
				took := time.Since(start)
				cancel()
				if err == nil {
					_ = c.Close()
					t.Errorf("%s options: dial of a silent server succeeded", name)
				}
				if took > 700*time.Millisecond {
					t.Errorf("%s options: dial of a silent server took %v, want about the context's 100ms", name, took)
				}
			}
		})
	}
	s, err := loadConfig(map[string]string{"AUTHLIMIT_REDIS_URL": "redis://" + silent})
	if err != nil {
		t.Fatal(err)
	}
	if s.redisOptions.Dialer != nil || s.redisPlain.Dialer != nil {
		t.Errorf("redis:// got a dialer of authlimit's; go-redis's own serves plain TCP")
	}
}
