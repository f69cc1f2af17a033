package handler

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/authlimit/authlimit/algo"
)

// Rule is one parsed rule of the rule language: which requests it applies
// to, what it counts them by, and the limit it enforces.
type Rule struct {
	// Name is unique among the rules: [a-z0-9_-]+.
	Name string
	// Limit is the enforced limit, decided by the configured store.
	Limit *algo.Rule
	// Key lists the parts the rule counts by.
	Key []KeyPart
	// Methods, Host, PathPrefix and PathRegexp restrict the requests the
	// rule applies to; empty means any.
	Methods    []string
	Host       string // exact, or "*.example.com" for any subdomain
	PathPrefix string
	PathRegexp *regexp.Regexp
	// CostHeader, when set, names the header whose value is the cost.
	CostHeader string
	// DenyOnMissing denies a request that lacks a key part's header,
	// instead of skipping the rule.
	DenyOnMissing bool
	// Shadow rules are decided and counted but never deny.
	Shadow bool
}

// PartKind is what a key part reads from the request.
type PartKind uint8

// The key parts.
const (
	PartIP     PartKind = iota + 1 // the client IP, grouped by prefix
	PartHeader                     // a request header's value
	PartHost                       // the original host
	PartMethod                     // the original method
	PartPath                       // the original path, normalized
	PartGlobal                     // one counter for every request
)

// KeyPart is one part of a rule's key.
type KeyPart struct {
	Kind   PartKind
	Header string // for PartHeader: the header's name
}

func (p KeyPart) String() string {
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

// String writes the rule back in the rule language, defaults filled in.
func (r *Rule) String() string {
	s := r.Limit.Spec()
	var b strings.Builder
	parts := make([]string, len(r.Key))
	for i, p := range r.Key {
		parts[i] = p.String()
	}
	fmt.Fprintf(&b, "name=%s key=%s limit=%d/%s algorithm=%s", r.Name, strings.Join(parts, "+"), s.Limit, formatDuration(s.Window), s.Algorithm)
	if s.Algorithm == algo.TokenBucket || s.Algorithm == algo.LeakyBucket || s.Algorithm == algo.GCRA {
		fmt.Fprintf(&b, " burst=%d", s.Burst)
	}
	if s.Delay > 0 {
		fmt.Fprintf(&b, " delay=%s", formatDuration(s.Delay))
	}
	if r.CostHeader != "" {
		fmt.Fprintf(&b, " cost=header:%s", r.CostHeader)
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
		fmt.Fprintf(&b, " path=~%s", r.PathRegexp)
	}
	if r.DenyOnMissing {
		b.WriteString(" on_missing=deny")
	}
	if r.Shadow {
		b.WriteString(" shadow=true")
	}
	return b.String()
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

// DefaultRules is the rule set when none is configured.
const DefaultRules = "name=default key=ip limit=100/1m"

// maxRules bounds the rule set: a request's rules are decided in one call.
const maxRules = 64

// ParseRules parses the rule language: rules separated by ";" or new lines,
// each a list of space-separated field=value pairs. A line starting with #
// is a comment. Every problem is reported, each naming the rule (by position
// and name) and the field:
//
//	rule 2 "login": limit "5/x": unknown unit "x" (want ms, s, m, h or d)
func ParseRules(text string) ([]*Rule, error) {
	var rules []*Rule
	var errs []error
	names := map[string]int{}
	n := 0
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, src := range strings.Split(line, ";") {
			if strings.TrimSpace(src) == "" {
				continue
			}
			n++
			r, err := parseRule(n, src)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if first, dup := names[r.Name]; dup {
				errs = append(errs, fmt.Errorf("rule %d %q: name: already used by rule %d", n, r.Name, first))
				continue
			}
			names[r.Name] = n
			rules = append(rules, r)
		}
	}
	switch {
	case len(errs) > 0:
		return nil, errors.Join(errs...)
	case n == 0:
		return nil, errors.New("no rules")
	case n > maxRules:
		return nil, fmt.Errorf("%d rules; the maximum is %d", n, maxRules)
	}
	return rules, nil
}

// ruleError names the rule by position and, when it has one, its name.
func ruleError(n int, name string, err error) error {
	if name == "" {
		return fmt.Errorf("rule %d: %w", n, err)
	}
	return fmt.Errorf("rule %d %q: %w", n, name, err)
}

func parseRule(n int, src string) (*Rule, error) {
	fields := map[string]string{}
	var order []string
	var errs []error
	for _, f := range strings.Fields(src) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			errs = append(errs, fmt.Errorf("%q is not field=value", f))
			continue
		}
		if _, dup := fields[k]; dup {
			errs = append(errs, fmt.Errorf("%s: given twice", k))
			continue
		}
		fields[k] = v
		order = append(order, k)
	}
	name := fields["name"]
	fail := func(field string, err error) {
		errs = append(errs, fmt.Errorf("%s %q: %w", field, fields[field], err))
	}

	r := &Rule{Name: name, Key: []KeyPart{{Kind: PartIP}}}
	spec := algo.Spec{Name: name, Algorithm: algo.SlidingWindowCounter}
	if name == "" {
		errs = append(errs, errors.New("name: missing; every rule needs name=<[a-z0-9_-]+>"))
	}
	if _, ok := fields["limit"]; !ok {
		errs = append(errs, errors.New("limit: missing; want limit=<N>/<duration>, such as 100/1m"))
	}
	for _, k := range order {
		v := fields[k]
		var err error
		switch k {
		case "name":
			err = algo.ValidName(v)
		case "key":
			r.Key, err = parseKey(v)
		case "limit":
			spec.Limit, spec.Window, err = parseLimit(v)
		case "algorithm":
			spec.Algorithm, err = algo.ParseAlgorithm(v)
		case "burst":
			spec.Burst, err = parseCount(v)
		case "delay":
			spec.Delay, err = parseDuration(v)
		case "cost":
			if h, ok := strings.CutPrefix(v, "header:"); ok {
				r.CostHeader, err = headerName(h)
			} else {
				spec.Cost, err = parseCount(v)
			}
		case "method":
			r.Methods, err = parseMethods(v)
		case "host":
			r.Host, err = parseHost(v)
		case "path":
			if re, ok := strings.CutPrefix(v, "~"); ok {
				r.PathRegexp, err = regexp.Compile(re)
			} else if !strings.HasPrefix(v, "/") {
				err = errors.New(`want a prefix starting with "/", or ~ and a regular expression`)
			} else {
				r.PathPrefix = v
			}
		case "on_missing":
			switch v {
			case "skip":
			case "deny":
				r.DenyOnMissing = true
			default:
				err = errors.New("want skip or deny")
			}
		case "shadow":
			r.Shadow, err = strconv.ParseBool(v)
			if err != nil {
				err = errors.New("want true or false")
			}
		default:
			errs = append(errs, fmt.Errorf("%s: unknown field (want name, key, limit, algorithm, burst, delay, cost, method, host, path, on_missing or shadow)", k))
		}
		if err != nil {
			fail(k, err)
		}
	}
	if len(errs) == 0 {
		limit, err := algo.NewRule(spec)
		if err != nil {
			for _, e := range unjoin(err) {
				var re *algo.RuleError
				if errors.As(e, &re) {
					errs = append(errs, specError(re, fields))
				} else {
					errs = append(errs, e)
				}
			}
		}
		r.Limit = limit
	}
	if len(errs) > 0 {
		out := make([]error, len(errs))
		for i, e := range errs {
			out[i] = ruleError(n, name, e)
		}
		return nil, errors.Join(out...)
	}
	return r, nil
}

// specError restates an algo.RuleError with the field as the user wrote it:
// the algorithm's window is part of limit=.
func specError(re *algo.RuleError, fields map[string]string) error {
	field := re.Field
	if field == "window" {
		field = "limit"
	}
	if v, ok := fields[field]; ok {
		return fmt.Errorf("%s %q: %w", field, v, re.Err)
	}
	return fmt.Errorf("%s: %w", field, re.Err)
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func parseKey(v string) ([]KeyPart, error) {
	if v == "" {
		return nil, errors.New("empty; want parts joined by +: ip, header:<Name>, host, method, path, global")
	}
	var parts []KeyPart
	seen := map[string]bool{}
	for _, p := range strings.Split(v, "+") {
		var part KeyPart
		switch {
		case p == "ip":
			part.Kind = PartIP
		case p == "host":
			part.Kind = PartHost
		case p == "method":
			part.Kind = PartMethod
		case p == "path":
			part.Kind = PartPath
		case p == "global":
			part.Kind = PartGlobal
		case strings.HasPrefix(p, "header:"):
			name, err := headerName(strings.TrimPrefix(p, "header:"))
			if err != nil {
				return nil, err
			}
			part = KeyPart{Kind: PartHeader, Header: name}
		default:
			return nil, fmt.Errorf("unknown part %q (want ip, header:<Name>, host, method, path or global)", p)
		}
		canon := strings.ToLower(part.String())
		if seen[canon] {
			return nil, fmt.Errorf("part %q given twice", p)
		}
		seen[canon] = true
		parts = append(parts, part)
	}
	if seen["global"] && len(parts) > 1 {
		return nil, errors.New("global counts every request as one: it cannot be combined with other parts")
	}
	return parts, nil
}

// headerName validates an HTTP header name (an RFC 9110 token).
func headerName(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty header name")
	}
	for i := 0; i < len(s); i++ {
		if !isToken(s[i]) {
			return "", fmt.Errorf("header name %q contains %q", s, s[i])
		}
	}
	return s, nil
}

func isToken(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func parseLimit(v string) (int64, time.Duration, error) {
	ns, ws, ok := strings.Cut(v, "/")
	if !ok {
		return 0, 0, errors.New("want <N>/<duration>, such as 100/1m or 10/1s")
	}
	n, err := parseCount(ns)
	if err != nil {
		return 0, 0, err
	}
	w, err := parseDuration(ws)
	if err != nil {
		return 0, 0, err
	}
	return n, w, nil
}

func parseCount(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	if n < 1 {
		return 0, fmt.Errorf("%d is not positive", n)
	}
	return n, nil
}

// parseDuration reads "500ms", "1s", "1m", "24h", "7d", a bare unit ("s"
// is one second), or any Go duration such as "1h30m".
func parseDuration(s string) (time.Duration, error) {
	units := []struct {
		suffix string
		unit   time.Duration
	}{{"ms", time.Millisecond}, {"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}, {"d", 24 * time.Hour}}
	num := strings.TrimRight(s, "abcdefghijklmnopqrstuvwxyzµ")
	unit := s[len(num):]
	if num == "" && unit == "" {
		return 0, errors.New("empty duration")
	}
	for _, u := range units {
		if unit != u.suffix {
			continue
		}
		if num == "" {
			return u.unit, nil
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < 0 {
			break // maybe "1.5h": let time.ParseDuration try
		}
		if n > int64(1<<62)/int64(u.unit) {
			return 0, fmt.Errorf("%s is too long", s)
		}
		return time.Duration(n) * u.unit, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		if unit == "" {
			return 0, fmt.Errorf("missing unit (want ms, s, m, h or d)")
		}
		switch unit {
		case "ns", "us", "µs", "ms", "s", "m", "h", "d":
		default:
			return 0, fmt.Errorf("unknown unit %q (want ms, s, m, h or d)", unit)
		}
		return 0, fmt.Errorf("%q is not a duration", s)
	}
	return d, nil
}

func parseMethods(v string) ([]string, error) {
	var ms []string
	for _, m := range strings.Split(v, ",") {
		if m == "" {
			return nil, errors.New("empty method")
		}
		for i := 0; i < len(m); i++ {
			if !isToken(m[i]) {
				return nil, fmt.Errorf("method %q contains %q", m, m[i])
			}
		}
		ms = append(ms, strings.ToUpper(m))
	}
	return ms, nil
}

func parseHost(v string) (string, error) {
	h := strings.ToLower(v)
	rest := strings.TrimPrefix(h, "*.")
	if rest == "" {
		return "", errors.New("empty host")
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == ':' || c == '[' || c == ']') {
			return "", fmt.Errorf("host %q contains %q", v, c)
		}
	}
	return h, nil
}
