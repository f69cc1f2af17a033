// Package rules is authlimit's rule language: Parse reads a rule set, and a
// Rule tells which requests it applies to (Match), what it counts them by
// (AppendKey) and what one costs (Cost). The request it reads is a Request:
// the proxy's forwarded headers, normalized by the functions of request.go so
// that a client cannot dodge a rule with another spelling of the same thing.
// Every function here takes client-controlled bytes and has a defined answer
// for any input; Match, AppendKey and Cost allocate nothing.
package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/authlimit/authlimit/algo"
)

// Rule is one rule: which requests it applies to, what it counts them by,
// and the limit it enforces.
type Rule struct {
	// Name is unique in the rule set: [a-z0-9_-]+.
	Name string
	// Policy is the enforced limit.
	Policy *algo.Policy
	// Key lists the parts the rule counts by.
	Key []Part
	// Methods, Host, PathPrefix and PathRegexp restrict the requests the
	// rule applies to; empty means any. All are matched as request.go
	// normalizes requests: methods in upper case, hosts in lower case
	// without port or trailing dot, paths in lower case without path
	// parameters. PathRegexp also matches a path whose trailing slash it
	// would match without.
	Methods    []string
	Host       string // exact, or "*.example.com" for any subdomain
	PathPrefix string
	PathRegexp *regexp.Regexp
	// CostHeader, when set, names the header whose value is the cost.
	CostHeader string
	// CostMissing is the cost of a request without the cost header:
	// CostDeny refuses it; zero means the policy's cost.
	CostMissing int64
	// DenyOnMissing denies a request that lacks a key part's header,
	// instead of skipping the rule.
	DenyOnMissing bool
	// Shadow rules are decided and counted but never deny.
	Shadow bool
	// TierHeader, when set, names the header whose value picks one of
	// Tiers (see Select).
	TierHeader string
	// Tiers and Overrides give some requests another limit than Policy:
	// see tier.go.
	Tiers     []Tier
	Overrides []Override

	policies   []*algo.Policy // see Policies; empty without tiers or overrides
	overrides  map[string]int // an override's key: its index in policies
	warnings   []string       // see Warnings
	host       []byte         // Host without "*."
	wildcard   bool
	pathPrefix []byte
	methods    [][]byte
}

// CostDeny as a Rule's CostMissing refuses a request without the cost
// header.
const CostDeny = -1

// PartKind is what a key part reads from the request.
type PartKind uint8

// The key parts.
const (
	PartIP     PartKind = iota + 1 // the client IP, grouped by prefix
	PartHeader                     // a request header's value
	PartHost                       // the original host, normalized
	PartMethod                     // the original method
	PartPath                       // the original path, normalized
	PartGlobal                     // one counter for every request
)

// Part is one part of a rule's key.
type Part struct {
	Kind   PartKind
	Header string // for PartHeader: the header's name
}

func (p Part) String() string {
	switch p.Kind {
	case PartIP:
		return "ip"
	case PartHeader:
		return "header:" + p.Header
	case PartHost:
		return "host"
	case PartMethod:
		return "method"
	case PartPath:
		return "path"
	case PartGlobal:
		return "global"
	}
	return "?"
}

// Match reports whether the rule applies to q.
func (r *Rule) Match(q *Request) bool {
	if len(r.methods) > 0 && !r.matchMethod(q) {
		return false
	}
	if r.host != nil {
		if r.wildcard {
			n := len(q.Host) - len(r.host)
			if n < 2 || q.Host[n-1] != '.' || !bytes.Equal(q.Host[n:], r.host) {
				return false
			}
		} else if !bytes.Equal(q.Host, r.host) {
			return false
		}
	}
	if r.pathPrefix != nil && !pathHasPrefix(q.Path, r.pathPrefix) {
		return false
	}
	if r.PathRegexp != nil && !matchPath(r.PathRegexp, q.Path) {
		return false
	}
	return true
}

// matchPath matches a regular expression against the path, and against the
// path without its trailing slash: backends (Express, Rails, ASP.NET Core,
// Spring) route "/upload/" and "/upload" to one handler, so
// "^/upload$" must cover both, as path= prefixes do.
func matchPath(re *regexp.Regexp, path []byte) bool {
	if re.Match(path) {
		return true
	}
	n := len(path)
	return n > 1 && path[n-1] == '/' && re.Match(path[:n-1])
}

// methodOverrideHeaders name the method a POST stands for in backends that
// honour them (Express's method-override, Rack::MethodOverride, ASP.NET
// Core's HttpMethodOverride, Google's APIs). On a POST, a rule for the
// method one of them names applies too.
var methodOverrideHeaders = [...]string{"X-HTTP-Method-Override", "X-Method-Override", "X-HTTP-Method"}

var (
	methodGET  = []byte("GET")
	methodHEAD = []byte("HEAD")
	methodPOST = []byte("POST")
)

// matchMethod reports whether the rule applies to q's method, or to the
// method a backend would route q by: a rule for GET applies to HEAD, which
// backends (and nginx's limit_except) answer as a GET; a POST is also the
// method its override headers name. A request repeating an override
// header falls under every method, since backends differ in the copy
// they read. Limiting a request under more rules than its backend routes
// it by costs the client some quota; fewer would let it dodge a rule.
func (r *Rule) matchMethod(q *Request) bool {
	if r.hasMethod(q.Method) {
		return true
	}
	if !bytes.Equal(q.Method, methodPOST) || q.Header == nil {
		return false
	}
	for _, name := range methodOverrideHeaders {
		v, n := q.Header.Lookup(name)
		if n > 1 {
			return true
		}
		for len(v) > 0 {
			item := v
			if i := bytes.IndexByte(v, ','); i >= 0 {
				item, v = v[:i], v[i+1:]
			} else {
				v = nil
			}
			if r.hasMethodFold(bytes.TrimSpace(item)) {
				return true
			}
		}
	}
	return false
}

// hasMethod reports whether the rule lists m, an upper-case method, or GET
// when m is HEAD.
func (r *Rule) hasMethod(m []byte) bool {
	head := bytes.Equal(m, methodHEAD)
	for _, rm := range r.methods {
		if bytes.Equal(rm, m) || head && bytes.Equal(rm, methodGET) {
			return true
		}
	}
	return false
}

// hasMethodFold is hasMethod for a method in any case.
func (r *Rule) hasMethodFold(m []byte) bool {
	if len(m) == 0 || len(m) > maxMethod {
		return false
	}
	var buf [maxMethod]byte
	return r.hasMethod(AppendMethod(buf[:0], m))
}

// pathHasPrefix matches whole segments: "/login" covers "/login" and
// "/login/x" but not "/logins"; a prefix ending in "/" is a plain prefix.
func pathHasPrefix(path, prefix []byte) bool {
	if !bytes.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || prefix[len(prefix)-1] == '/' || path[len(prefix)] == '/'
}

// KeyStatus says whether a key could be built, and if not, why.
type KeyStatus uint8

// The key statuses.
const (
	// KeyOK: the key is built.
	KeyOK KeyStatus = iota
	// KeyMissing: a header the key needs is absent or empty.
	KeyMissing
	// KeyRepeated: a header the key needs appears more than once. A
	// proxy forwards every copy, and a backend reads one of them: were
	// they all counted as one key, a client could add a copy of its own
	// to get a fresh quota for the value the backend sees.
	KeyRepeated
)

// AppendKey appends the rule's key for q to dst: a single part's value as it
// is, several parts each prefixed with their length, so that no two
// different requests share a key. On a status other than KeyOK it also
// returns the header at fault, and dst unchanged.
func (r *Rule) AppendKey(dst []byte, q *Request) ([]byte, KeyStatus, string) {
	start := len(dst)
	for _, p := range r.Key {
		var v []byte
		switch p.Kind {
		case PartIP:
			v = q.ClientKey
		case PartHeader:
			val, n := q.Header.Lookup(p.Header)
			switch {
			case n > 1:
				return dst[:start], KeyRepeated, p.Header
			case n == 0 || len(val) == 0:
				return dst[:start], KeyMissing, p.Header
			}
			v = val
		case PartHost:
			v = q.Host
		case PartMethod:
			v = q.Method
		case PartPath:
			v = q.Path
		case PartGlobal:
			v = globalKey
		}
		if len(r.Key) > 1 {
			dst = strconv.AppendInt(dst, int64(len(v)), 10)
			dst = append(dst, ':')
			dst = append(dst, v...)
			dst = append(dst, '|')
		} else {
			dst = append(dst, v...)
		}
	}
	return dst, KeyOK, ""
}

var globalKey = []byte("*")

// CostStatus says whether a request's cost could be read, and if not, why.
type CostStatus uint8

// The cost statuses.
const (
	// CostOK: the cost is known; zero means the request counts nothing
	// (an empty body), and the rule is left out of its decision.
	CostOK CostStatus = iota
	// CostMissing: the cost header is absent or empty and the rule refuses
	// such requests (cost_missing=deny).
	CostMissing
	// CostInvalid: the cost header is not a whole number from 0 to 2^50.
	CostInvalid
	// CostRepeated: the cost header appears more than once.
	CostRepeated
)

// Cost returns what q costs under the rule: its cost header's value, or,
// when the rule has none, the policy's own cost (returned as 0 for the
// store to fill in, as algo.Request.Cost means).
func (r *Rule) Cost(q *Request) (int64, CostStatus) {
	if r.CostHeader == "" {
		return 0, CostOK
	}
	val, n := q.Header.Lookup(r.CostHeader)
	switch {
	case n > 1:
		return 0, CostRepeated
	case n == 0 || len(val) == 0:
		switch r.CostMissing {
		case CostDeny:
			return 0, CostMissing
		case 0:
			return r.Policy.Spec().Cost, CostOK
		}
		return r.CostMissing, CostOK
	}
	cost, ok := parseCost(val)
	if !ok {
		return 0, CostInvalid
	}
	return cost, CostOK
}

// parseCost reads a whole number from 0 to algo.MaxLimit: ASCII digits only,
// at most 16 of them, no sign, no spaces.
func parseCost(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 16 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, n <= algo.MaxLimit
}

// String writes the rule as Text does, but with each override's key as a
// short hash of it ("key=sha256:" and 12 hex digits, as in the override's
// policy name): override keys may be credentials (an API key), and String
// is what -check, GET /v1/config and the logs show.
func (r *Rule) String() string { return r.write(true) }

// Text writes the rule back in the rule language, defaults filled in and
// values as they are matched, followed by its tiers and overrides, each
// after a ";", override keys as they are: it parses back to the same rule.
// It is for hashing a rule set, never for showing (see String).
func (r *Rule) Text() string { return r.write(false) }

// KeyHash is how String shows an override's key: "sha256:" and the first
// 12 hex digits of the key's SHA-256.
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:6])
}

func (r *Rule) write(hideKeys bool) string {
	s := r.Policy.Spec()
	var b strings.Builder
	parts := make([]string, len(r.Key))
	for i, p := range r.Key {
		parts[i] = p.String()
	}
	fmt.Fprintf(&b, "name=%s key=%s limit=%d/%s algorithm=%s", r.Name, strings.Join(parts, "+"), s.Limit, formatDuration(s.Window), s.Algorithm)
	if s.Algorithm.UsesBurst() {
		fmt.Fprintf(&b, " burst=%d", s.Burst)
	}
	if s.Delay > 0 {
		fmt.Fprintf(&b, " delay=%s", formatDuration(s.Delay))
	}
	if r.CostHeader != "" {
		fmt.Fprintf(&b, " cost=header:%s", r.CostHeader)
		switch r.CostMissing {
		case CostDeny:
			b.WriteString(" cost_missing=deny")
		case 0:
		default:
			fmt.Fprintf(&b, " cost_missing=%d", r.CostMissing)
		}
	} else if s.Cost != 1 {
		fmt.Fprintf(&b, " cost=%d", s.Cost)
	}
	if len(r.Methods) > 0 {
		fmt.Fprintf(&b, " method=%s", strings.Join(r.Methods, ","))
	}
	if r.Host != "" {
		fmt.Fprintf(&b, " host=%s", r.Host)
	}
	if r.PathPrefix != "" {
		fmt.Fprintf(&b, " path=%s", r.PathPrefix)
	}
	if r.PathRegexp != nil {
		fmt.Fprintf(&b, " path=~%s", strings.TrimPrefix(r.PathRegexp.String(), "(?i)"))
	}
	if r.DenyOnMissing {
		b.WriteString(" on_missing=deny")
	}
	if r.Shadow {
		b.WriteString(" shadow=true")
	}
	if r.TierHeader != "" {
		fmt.Fprintf(&b, " tier=header:%s", r.TierHeader)
	}
	for _, t := range r.Tiers {
		fmt.Fprintf(&b, "; tier rule=%s name=%s%s", r.Name, t.Name, variantLimit(t.Policy))
	}
	for _, o := range r.Overrides {
		key := o.Key
		if hideKeys {
			key = KeyHash(key)
		}
		fmt.Fprintf(&b, "; override rule=%s key=%s%s", r.Name, key, variantLimit(o.Policy))
	}
	return b.String()
}

// variantLimit writes a tier's or override's limit= and burst=.
func variantLimit(p *algo.Policy) string {
	s := p.Spec()
	out := fmt.Sprintf(" limit=%d/%s", s.Limit, formatDuration(s.Window))
	if s.Algorithm.UsesBurst() && s.Burst != s.Limit {
		out += fmt.Sprintf(" burst=%d", s.Burst)
	}
	return out
}

func formatDuration(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d%time.Millisecond == 0:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	}
	return d.String()
}
