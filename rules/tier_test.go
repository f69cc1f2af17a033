package rules

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
)

const tiered = `
name=api key=header:X-Api-Key limit=100/1m tier=header:X-Plan
tier rule=api name=pro limit=1000/1m
tier rule=api name=free limit=10/1h
override rule=api key=k-acme limit=5000/1m
name=tb key=host limit=10/1s algorithm=token_bucket burst=5 tier=header:X-Size; tier rule=tb name=big limit=100/1s burst=300; override rule=tb key=API.Example.com. limit=7/1s
`

func TestParseTiersAndOverrides(t *testing.T) {
	rs := mustParse(t, tiered)
	if got, want := len(rs), 2; got != want {
		t.Fatalf("%d rules, want %d: tiers and overrides are no rules of their own", got, want)
	}
	api, tb := rs[0], rs[1]
	if api.TierHeader != "X-Plan" || len(api.Tiers) != 2 || len(api.Overrides) != 1 {
		t.Fatalf("api = %s", api)
	}
	tests := []struct {
		p            *algo.Policy
		name         string
		limit, burst int64
		window       time.Duration
		alg          algo.Algorithm
	}{
		{api.Policies()[0], "api", 100, 100, time.Minute, algo.SlidingWindowCounter},
		{api.Policies()[1], "api--pro", 1000, 1000, time.Minute, algo.SlidingWindowCounter},
		{api.Policies()[2], "api--free", 10, 10, time.Hour, algo.SlidingWindowCounter},
		{api.Policies()[3], "api--key-", 5000, 5000, time.Minute, algo.SlidingWindowCounter},
		{tb.Policies()[0], "tb", 10, 5, time.Second, algo.TokenBucket},
		// A tier's burst is its own, or its own limit: never the rule's.
		{tb.Policies()[1], "tb--big", 100, 300, time.Second, algo.TokenBucket},
		{tb.Policies()[2], "tb--key-", 7, 7, time.Second, algo.TokenBucket},
	}
	for _, tt := range tests {
		s := tt.p.Spec()
		if !strings.HasPrefix(s.Name, tt.name) || s.Limit != tt.limit || s.Burst != tt.burst || s.Window != tt.window || s.Algorithm != tt.alg {
			t.Errorf("policy %s = %+v, want name %s…, limit %d, burst %d, window %v, %s", tt.p.Name(), s, tt.name, tt.limit, tt.burst, tt.window, tt.alg)
		}
	}
	if got, want := tb.Overrides[0].Key, "api.example.com"; got != want {
		t.Errorf("host override key = %q, want %q, as requests' hosts are normalized", got, want)
	}
	// An override's policy name is stable: a reload keeps its counts.
	again := mustParse(t, tiered)
	for i, p := range api.Policies() {
		if got := again[0].Policies()[i].Name(); got != p.Name() {
			t.Errorf("policy %d named %q after a reparse, was %q", i, got, p.Name())
		}
	}
	if a, b := api.Overrides[0].Policy.Name(), mustParse(t, strings.Replace(tiered, "k-acme", "k-other", 1))[0].Overrides[0].Policy.Name(); a == b {
		t.Errorf("two override keys share the policy name %q", a)
	}
}

func TestTierAndOverrideTextRoundTrips(t *testing.T) {
	for _, r := range mustParse(t, tiered) {
		again, err := Parse(r.Text())
		if err != nil {
			t.Fatalf("Parse(%q): %v", r.Text(), err)
		}
		if got := again[0].Text(); got != r.Text() {
			t.Errorf("round trip:\n got %s\nwant %s", got, r.Text())
		}
	}
}

// rawHeaders is a Headers over a raw header block, as /auth reads them:
// any spelling of a name, every line counted.
type rawHeaders []byte

func (h rawHeaders) Lookup(name string) ([]byte, int) {
	return LookupHeader(h, name, nil)
}

func TestSelect(t *testing.T) {
	api := mustParse(t, tiered)[0]
	const own, pro, free, acme = 0, 1, 2, 3
	tests := []struct {
		name    string
		key     string
		headers string
		trusted bool
		want    int
		status  TierStatus
	}{
		{"no tier header", "k1", "", true, own, TierOK},
		{"pro from a trusted proxy", "k1", "X-Plan: pro\r\n", true, pro, TierOK},
		{"any case", "k1", "x-plan: PRO\r\n", true, pro, TierOK},
		{"underscore spelling", "k1", "X_Plan: free\r\n", true, free, TierOK},
		{"from a peer that is no trusted proxy", "k1", "X-Plan: pro\r\n", false, own, TierOK},
		{"unknown tier", "k1", "X-Plan: platinum\r\n", true, own, TierOK},
		{"empty tier", "k1", "X-Plan: \r\n", true, own, TierOK},
		{"a tier name longer than any", "k1", "X-Plan: " + strings.Repeat("p", 65) + "\r\n", true, own, TierOK},
		{"repeated", "k1", "X-Plan: pro\r\nX-Plan: pro\r\n", true, own, TierRepeated},
		{"repeated under two spellings", "k1", "X-Plan: free\r\nX_Plan: pro\r\n", true, own, TierRepeated},
		{"repeated from a peer that is no trusted proxy", "k1", "X-Plan: pro\r\nX-Plan: pro\r\n", false, own, TierOK},
		{"override", "k-acme", "", false, acme, TierOK},
		{"override over a tier", "k-acme", "X-Plan: free\r\n", true, acme, TierOK},
		{"override over a repeated tier", "k-acme", "X-Plan: free\r\nX-Plan: pro\r\n", true, acme, TierOK},
		{"an override is exact", "K-ACME", "", true, own, TierOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := request("GET", "/", "example.com", nil)
			q.Header = rawHeaders(tt.headers)
			got, status := api.Select(q, []byte(tt.key), tt.trusted)
			if got != tt.want || status != tt.status {
				t.Errorf("Select(%q, %q, trusted %v) = %d, %d; want %d, %d", tt.key, tt.headers, tt.trusted, got, status, tt.want, tt.status)
			}
		})
	}
}

func TestSelectWithoutTiersIsTheRule(t *testing.T) {
	r := mustParse(t, "name=a key=header:X-Api-Key limit=1/1m")[0]
	q := request("GET", "/", "example.com", nil)
	q.Header = rawHeaders("X-Plan: pro\r\n")
	if got, status := r.Select(q, []byte("k"), true); got != 0 || status != TierOK {
		t.Errorf("Select = %d, %d; want 0, TierOK", got, status)
	}
	if got := r.Policies(); len(got) != 1 || got[0] != r.Policy {
		t.Errorf("Policies() = %v, want the rule's own", got)
	}
}

func TestSelectAllocatesNothing(t *testing.T) {
	api := mustParse(t, tiered)[0]
	q := request("GET", "/", "example.com", nil)
	q.Header = rawHeaders("X-Plan: Pro\r\n")
	key := []byte("k-acme")
	other := []byte("k1")
	if n := testing.AllocsPerRun(100, func() {
		api.Select(q, key, true)
		api.Select(q, other, true)
	}); n != 0 {
		t.Errorf("Select allocates %v times", n)
	}
}

// TestParseTierAndOverrideErrors: every mistake names the entry (tier or
// override, its position, its rule) and the field, all at once; an
// override's key is never repeated in a message.
func TestParseTierAndOverrideErrors(t *testing.T) {
	const api = "name=api key=header:X-Api-Key limit=100/1m tier=header:X-Plan; tier rule=api name=pro limit=1000/1m; "
	tests := []struct {
		src  string
		want string
	}{
		{"name=api limit=100/1m tier=X-Plan",
			`rule 1 "api": tier "X-Plan": want header:<Name>, the header a proxy sets to the client's tier`},
		{"name=api limit=100/1m tier=header:X(Plan; tier rule=api name=pro limit=1/1m",
			`rule 1 "api": tier "header:X(Plan": header name "X(Plan" contains '('`},
		{"name=api limit=100/1m tier=header:X-Plan",
			`rule 1 "api": tier "header:X-Plan": no tier names this rule, so every request gets the rule's own limit: add tier rule=api name=<tier> limit=<N>/<duration>, or remove tier=`},
		{"name=api limit=100/1m; tier rule=api name=pro limit=1/1m",
			`tier 1 "pro" of rule "api": rule "api": the rule reads no tier: add tier=header:<Name> to it, naming the header a proxy sets`},
		{"name=api limit=100/1m; tier rule=apx name=pro limit=1/1m",
			`tier 1 "pro" of rule "apx": rule "apx": no rule has that name (did you mean "api"?)`},
		{"name=api limit=100/1m; override rule=zzzzz key=k limit=1/1m",
			`override 1 of rule "zzzzz": rule "zzzzz": no rule has that name`},
		{api + "tier rule=api name=Pro limit=1/1m",
			`tier 2 "Pro" of rule "api": name "Pro": "Pro" contains 'P'; want [a-z0-9_-]+`},
		{api + "tier rule=api name=gold limit=1/x burst=0 colour=red",
			"tier 2 \"gold\" of rule \"api\": limit \"1/x\": unknown unit \"x\" (want ms, s, m, h or d)\n" +
				"tier 2 \"gold\" of rule \"api\": burst \"0\": 0 is not positive\n" +
				`tier 2 "gold" of rule "api": colour: unknown field (want rule, name, limit or burst)`},
		{api + "tier name=gold",
			"tier 2 \"gold\": rule: missing; every tier names its rule: rule=<name>\n" +
				`tier 2 "gold": limit: missing; want limit=<N>/<duration>, such as 1000/1m`},
		{api + "tier rule=api limit=1/1m limit=2/1m",
			"tier 2 of rule \"api\": limit: given twice\n" +
				`tier 2 of rule "api": name: missing; want name=<[a-z0-9_-]+>, the value of the rule's tier header`},
		{api + "tier rule=api name=pro limit=2/1m",
			`tier 2 "pro" of rule "api": name "pro": already given by tier 1`},
		{api + "tier rule=api name=gold limit=1/1m burst=5",
			`tier 2 "gold" of rule "api": burst "5": sliding_window_counter has no burst; only token_bucket, leaky_bucket and gcra do`},
		{api + "tier rule=api name=gold limit=0/1ns",
			`tier 2 "gold" of rule "api": limit "0/1ns": 0 is not positive`},
		{api + "tier rule=api name=gold limit=1/1ns",
			`tier 2 "gold" of rule "api": limit "1/1ns": 1ns is shorter than the minimum 1ms`},
		{api + "tier rule=api name=gold oops",
			"tier 2 \"gold\" of rule \"api\": \"oops\" is not field=value\n" +
				`tier 2 "gold" of rule "api": limit: missing; want limit=<N>/<duration>, such as 1000/1m`},
		{"name=api limit=100/1m; override rule=api key=secret-1 limit=1/1m",
			`override 1 of rule "api": key: rule "api" counts by ip: an override names one value of a key of one part, header:<Name> or host`},
		{"name=api key=header:A+header:B limit=100/1m; override rule=api key=secret-1 limit=1/1m",
			`override 1 of rule "api": key: rule "api" counts by header:A+header:B: an override names one value of a key of one part, header:<Name> or host`},
		{api + "override rule=api key=secret-1 limit=1/1m; override rule=api key=secret-1 limit=2/1m",
			`override 2 of rule "api": key: the same key as override 1`},
		{api + "override rule=api key= limit=1/1m",
			`override 1 of rule "api": key: empty; want the key's value, such as an API key`},
		{api + "override rule=api name=x limit=1/1m",
			"override 1 of rule \"api\": name: unknown field (want rule, key, limit or burst)\n" +
				`override 1 of rule "api": key: missing; want key=<value>, the value of the rule's key it applies to`},
		{"name=h key=host limit=100/1m; override rule=h key=api.example.com:8080 limit=1/1m",
			`override 1 of rule "h": key: want a host name, as the rule counts it`},
		{"name=api key=header:K limit=100/1m cost=50; override rule=api key=secret-1 limit=10/1m",
			`override 1 of rule "api": limit "10/1m": the rule's cost: 50 is more than the policy ever admits at once (10): every request would be denied`},
		{"name=api key=header:K limit=100/1m cost=header:X-C cost_missing=50; override rule=api key=secret-1 limit=10/1m",
			`override 1 of rule "api": limit "10/1m": the rule's cost_missing 50 is more than this limit ever admits at once (10): every such request would be denied`},
		{"name=api--pro limit=1/1m; name=api limit=100/1m tier=header:X-Plan; tier rule=api name=pro limit=1/1m",
			`tier "pro" of rule "api": keeps its counts under the name "api--pro", which rule 1 "api--pro" has: rename one`},
	}
	for _, tt := range tests {
		_, err := Parse(tt.src)
		if err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", tt.src)
			continue
		}
		if got := err.Error(); got != tt.want {
			t.Errorf("Parse(%q) error:\n%s\nwant:\n%s", tt.src, got, tt.want)
		}
		if strings.Contains(err.Error(), "secret-1") {
			t.Errorf("Parse(%q) error repeats the override's key: %v", tt.src, err)
		}
	}
}

func TestTooManyTiersAndOverrides(t *testing.T) {
	var b strings.Builder
	b.WriteString("name=api key=header:K limit=100/1m\n")
	for i := 0; i <= maxVariants; i++ {
		b.WriteString("override rule=api key=k")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString(string(rune('a' + i%26)))
		b.WriteString(" limit=1/1m\n")
	}
	_, err := Parse(b.String())
	if err == nil || !strings.Contains(err.Error(), "4097 tiers and overrides; the maximum is 4096") {
		t.Errorf("Parse of %d overrides: %v, want the maximum named", maxVariants+1, err)
	}
}

// TestStringHidesOverrideKeys: String, which -check, GET /v1/config and
// the logs show, writes an override's key as a short hash of it; Text
// writes it whole and parses back to the same rule.
func TestStringHidesOverrideKeys(t *testing.T) {
	const secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
	rs, err := Parse("name=api key=header:X-Api-Key limit=10/1m; override rule=api key=" + secret + " limit=100/1m")
	if err != nil {
		t.Fatal(err)
	}
	shown := rs[0].String()
	if strings.Contains(shown, secret) || strings.Contains(shown, "sk_live") {
		t.Errorf("String shows the override key: %s", shown)
	}
	hash := KeyHash(secret)
	if !strings.Contains(shown, "key="+hash+" limit=100/1m") || len(hash) != len("sha256:")+12 {
		t.Errorf("String = %s, want the key as %s", shown, hash)
	}
	if p := rs[0].Overrides[0].Policy.Name(); !strings.HasSuffix(p, strings.TrimPrefix(hash, "sha256:")) || strings.Contains(p, secret) {
		t.Errorf("the override's policy name %q, want one ending in the key's hash", p)
	}
	if text := rs[0].Text(); !strings.Contains(text, "key="+secret+" ") {
		t.Errorf("Text = %s, want the key whole", text)
	}
	if fmt.Sprint(rs[0]) != shown {
		t.Errorf("fmt prints %s, want String's %s", fmt.Sprint(rs[0]), shown)
	}
}
