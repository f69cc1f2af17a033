package rules

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"time"

	"github.com/authlimit/authlimit/algo"
)

// Default is the rule set when none is configured.
const Default = "name=default key=ip limit=100/1m"

// Parse parses the rule language: rules separated by ";" or new lines, each
// a list of space-separated field=value pairs. A line starting with # is a
// comment. Every problem is reported, each naming the rule (by position and
// name) and the field:
//
//	rule 2 "login": limit "5/x": unknown unit "x" (want ms, s, m, h or d)
func Parse(text string) ([]*Rule, error) {
	var rules []*Rule
	var errs []error
	var variants []*variant
	names := map[string]int{}
	n := 0
	counts := map[string]int{}
	mentioned := map[string]bool{} // rules that tier entries name
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, src := range strings.Split(line, ";") {
			if strings.TrimSpace(src) == "" {
				continue
			}
			if fs := strings.Fields(src); fs[0] == "tier" || fs[0] == "override" {
				counts[fs[0]]++
				v, err := parseVariant(fs[0], counts[fs[0]], fs[1:])
				if fs[0] == "tier" {
					mentioned[v.rule] = true
				}
				if err != nil {
					errs = append(errs, err)
					continue
				}
				variants = append(variants, v)
				continue
			}
			n++
			r, err := parseRule(n, src)
			if err != nil {
				errs = append(errs, err)
				if name := ruleName(src); name != "" {
					if _, dup := names[name]; !dup {
						names[name] = n
					}
				}
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
	if err := attach(rules, names, variants, mentioned); err != nil {
		errs = append(errs, err)
	}
	switch {
	case len(errs) > 0:
		return nil, errors.Join(errs...)
	case n == 0:
		return nil, errors.New("no rules")
	case n > algo.MaxRules:
		return nil, fmt.Errorf("%d rules; the maximum is %d", n, algo.MaxRules)
	}
	return rules, nil
}

// ruleName returns the name= of a rule's source, if it has one.
func ruleName(src string) string {
	for _, f := range strings.Fields(src) {
		if v, ok := strings.CutPrefix(f, "name="); ok {
			return v
		}
	}
	return ""
}

// ruleError names the rule by position and, when it has one, its name.
func ruleError(n int, name string, err error) error {
	if name == "" {
		return fmt.Errorf("rule %d: %w", n, err)
	}
	return fmt.Errorf("rule %d %q: %w", n, name, err)
}

const fieldNames = "name, key, limit, algorithm, burst, delay, cost, cost_missing, method, host, path, on_missing, shadow or tier"

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
	// bad are the fields missing or whose value did not parse: the checks
	// that need them are left out, and every other check still runs, so
	// that one mistake hides none of the others.
	bad := map[string]bool{}
	fail := func(field string, err error) {
		bad[field] = true
		errs = append(errs, fmt.Errorf("%s %q: %w", field, fields[field], err))
	}

	r := &Rule{Name: name, Key: []Part{{Kind: PartIP}}}
	spec := algo.Spec{Name: name, Algorithm: algo.SlidingWindowCounter}
	if name == "" {
		bad["name"] = true
		errs = append(errs, errors.New("name: missing; every rule needs name=<[a-z0-9_-]+>"))
	}
	if _, ok := fields["limit"]; !ok {
		bad["limit"] = true
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
		case "cost_missing":
			if v == "deny" {
				r.CostMissing = CostDeny
			} else if r.CostMissing, err = parseCount(v); err != nil {
				err = fmt.Errorf("want deny, or the cost to charge (%w)", err)
			}
		case "method":
			r.Methods, err = parseMethods(v)
		case "host":
			r.Host, err = parseHost(v)
		case "path":
			if re, ok := strings.CutPrefix(v, "~"); ok {
				// Paths are matched in lower case (see AppendPath).
				if r.PathRegexp, err = regexp.Compile("(?i)" + re); err == nil {
					err = checkPathRegexp(re)
				}
			} else {
				r.PathPrefix, err = parsePathPrefix(v)
			}
		case "on_missing":
			switch v {
			case "skip":
			case "deny":
				r.DenyOnMissing = true
			default:
				err = errors.New("want skip or deny")
			}
		case "tier":
			if h, ok := strings.CutPrefix(v, "header:"); ok {
				r.TierHeader, err = headerName(h)
			} else {
				err = errors.New("want header:<Name>, the header a proxy sets to the client's tier")
			}
		case "shadow":
			r.Shadow, err = strconv.ParseBool(v)
			if err != nil {
				err = errors.New("want true or false")
			}
		default:
			hint := ""
			if c := Closest(k, strings.Split(strings.NewReplacer(",", "", " or", "").Replace(fieldNames), " ")); c != "" {
				hint = fmt.Sprintf(" (did you mean %s?)", c)
			}
			bad[k] = true
			errs = append(errs, fmt.Errorf("%s: unknown field%s (want %s)", k, hint, fieldNames))
		}
		if err != nil {
			fail(k, err)
		}
	}
	if _, ok := fields["cost_missing"]; ok && r.CostHeader == "" && !bad["cost"] && !bad["cost_missing"] {
		errs = append(errs, errors.New("cost_missing: only with cost=header:<Name>"))
	}
	if r.DenyOnMissing && !hasHeaderPart(r.Key) && !bad["key"] {
		fail("on_missing", fmt.Errorf("the key %q has no header: part, so no part of it can be missing and this does nothing: remove on_missing=, or count by a header as well (key=ip+header:<Name>)", keyString(r.Key)))
	}
	var warnings []string
	warn := func(field string, err error) {
		warnings = append(warnings, ruleError(n, name, fmt.Errorf("%s %q: %w", field, fields[field], err)).Error())
	}
	for _, p := range r.Key {
		if p.Kind == PartHeader && SameHeader([]byte(p.Header), "Host") {
			warn("key", errors.New("behind nginx auth_request the subrequest's Host header is authlimit's upstream name, the same for every request, so all clients would share one counter: use key=host, which reads the original host (X-Forwarded-Host, or the URL header)"))
		}
	}
	if r.CostHeader != "" && SameHeader([]byte(r.CostHeader), "Content-Length") {
		warn("cost", errors.New("nginx clears Content-Length on the auth subrequest, which has no body, so every request would cost cost_missing: use cost=header:X-Original-Content-Length, which nginx/example.conf, nginx/openresty.conf and caddy/Caddyfile set to the body's length"))
	}
	parsed := len(errs) == 0
	p, err := algo.NewPolicy(checkable(spec, bad))
	if err != nil {
		for _, e := range unjoin(err) {
			var se *algo.SpecError
			switch {
			case !errors.As(e, &se):
				errs = append(errs, e)
			case !specNeeds(se.Field, bad):
				errs = append(errs, specError(se, fields))
			}
		}
	}
	if parsed {
		r.Policy = p
		if p != nil && r.CostMissing > p.MaxCost() {
			errs = append(errs, fmt.Errorf("cost_missing %q: %d is more than the rule ever admits at once (%d): every such request would be denied", fields["cost_missing"], r.CostMissing, p.MaxCost()))
		}
	}
	if len(errs) > 0 {
		out := make([]error, len(errs))
		for i, e := range errs {
			out[i] = ruleError(n, name, e)
		}
		return nil, errors.Join(out...)
	}
	r.compile()
	r.warnings = warnings
	return r, nil
}

// Warnings lists what is valid in the rule but does nothing behind the
// usual proxies, each naming the rule and the field and saying what to
// use instead.
func (r *Rule) Warnings() []string { return r.warnings }

func hasHeaderPart(parts []Part) bool {
	for _, p := range parts {
		if p.Kind == PartHeader {
			return true
		}
	}
	return false
}

func keyString(parts []Part) string {
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = p.String()
	}
	return strings.Join(s, "+")
}

// checkPathRegexp refuses a path= regular expression (re, as written) that
// can never match some part of a path as AppendPath normalizes it: a "?"
// or a "#" (the query and the fragment are dropped before matching), or,
// where it is case-sensitive, a capital letter (paths are in lower case).
func checkPathRegexp(re string) error {
	tree, err := syntax.Parse("(?i)"+re, syntax.Perl)
	if err != nil {
		return err // regexp.Compile has said it already
	}
	var query, upper rune
	var walk func(*syntax.Regexp)
	walk = func(t *syntax.Regexp) {
		switch t.Op {
		case syntax.OpLiteral:
			for _, c := range t.Rune {
				switch {
				case c == '?' || c == '#':
					query = cmp.Or(query, c)
				case 'A' <= c && c <= 'Z' && t.Flags&syntax.FoldCase == 0:
					upper = cmp.Or(upper, c)
				}
			}
		case syntax.OpCharClass:
			if c, ok := onlyRunes(t.Rune, func(c rune) bool { return c == '?' || c == '#' }); ok {
				query = cmp.Or(query, c)
			}
			if c, ok := onlyRunes(t.Rune, func(c rune) bool { return 'A' <= c && c <= 'Z' }); ok {
				upper = cmp.Or(upper, c)
			}
		}
		for _, s := range t.Sub {
			walk(s)
		}
	}
	walk(tree)
	switch {
	case query != 0:
		// Suggest what precedes the first "\?", "[?" or "#", if that
		// is an expression of its own.
		alone, first := "", len(re)
		for _, lit := range []string{`\?`, "[?", "#"} {
			if i := strings.Index(re, lit); i >= 0 {
				first = min(first, i)
			}
		}
		if prefix := re[:first]; prefix != "" && prefix != "^" && first < len(re) {
			if _, err := regexp.Compile(prefix); err == nil {
				alone = ", such as path=~" + prefix
			}
		}
		return fmt.Errorf("paths are matched without their query or fragment, so %q here never matches: match the path alone%s (no rule reads the query)", string(query), alone)
	case upper != 0:
		return fmt.Errorf("paths are matched in lower case, so %q in a case-sensitive part never matches: write it in lower case, or drop (?-i)", string(upper))
	}
	return nil
}

// onlyRunes reports whether the character class ranges (lo, hi pairs) hold
// something and nothing but runes for which in is true, and if so the
// first.
func onlyRunes(ranges []rune, in func(rune) bool) (rune, bool) {
	if len(ranges) == 0 {
		return 0, false
	}
	for i := 0; i+1 < len(ranges); i += 2 {
		if ranges[i+1]-ranges[i] > 64 {
			return 0, false
		}
		for c := ranges[i]; c <= ranges[i+1]; c++ {
			if !in(c) {
				return 0, false
			}
		}
	}
	return ranges[0], true
}

// compile derives the byte forms Match compares with.
func (r *Rule) compile() {
	for _, m := range r.Methods {
		r.methods = append(r.methods, []byte(m))
	}
	if r.Host != "" {
		h, wild := strings.CutPrefix(r.Host, "*.")
		r.host, r.wildcard = []byte(h), wild
	}
	if r.PathPrefix != "" {
		r.pathPrefix = []byte(r.PathPrefix)
	}
}

// specError restates an algo.SpecError with the field as the user wrote it:
// the policy's window is part of limit=.
// checkable is spec with each bad field's value replaced by one that
// passes every check alone and with the others: algo.NewPolicy then
// reports the mistakes of the fields that parsed, and none of the bad
// ones' (see specNeeds).
func checkable(spec algo.Spec, bad map[string]bool) algo.Spec {
	if bad["name"] {
		spec.Name = "x"
	}
	if bad["limit"] {
		// The largest limit in the shortest window: no burst, delay or
		// cost is too much for it, and it refills at once.
		spec.Limit, spec.Window = algo.MaxLimit, algo.MinWindow
	}
	if bad["algorithm"] {
		// The algorithm that takes a burst and a delay.
		spec.Algorithm = algo.LeakyBucket
	}
	if bad["burst"] {
		spec.Burst = 0
	}
	if bad["delay"] {
		spec.Delay = 0
	}
	if bad["cost"] {
		spec.Cost = 0
	}
	return spec
}

// specNeeds reports whether algo.NewPolicy's check of field needs a bad
// field: then checkable's stand-in decided it, not the rule. The cost is
// checked against what the policy admits at most, which every other field
// of the policy shapes.
func specNeeds(field string, bad map[string]bool) bool {
	switch field {
	case "window":
		return bad["limit"]
	case "cost":
		return bad["cost"] || bad["limit"] || bad["algorithm"] || bad["burst"] || bad["delay"]
	}
	return bad[field]
}

func specError(se *algo.SpecError, fields map[string]string) error {
	field := se.Field
	if field == "window" {
		field = "limit"
	}
	if v, ok := fields[field]; ok {
		return fmt.Errorf("%s %q: %w", field, v, se.Err)
	}
	return fmt.Errorf("%s: %w", field, se.Err)
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func parseKey(v string) ([]Part, error) {
	if v == "" {
		return nil, errors.New("empty; want parts joined by +: ip, header:<Name>, host, method, path, global")
	}
	var parts []Part
	seen := map[string]bool{}
	for _, p := range strings.Split(v, "+") {
		var part Part
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
			part = Part{Kind: PartHeader, Header: name}
		default:
			return nil, fmt.Errorf("unknown part %q (want ip, header:<Name>, host, method, path or global)", p)
		}
		// Header names are one in any case and with '_' for '-'.
		canon := strings.ReplaceAll(strings.ToLower(part.String()), "_", "-")
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
		if len(m) > maxMethod {
			return nil, fmt.Errorf("method %q is longer than %d bytes", m, maxMethod)
		}
		ms = append(ms, strings.ToUpper(m))
	}
	return ms, nil
}

// parseHost reads a host= value: a name or address, or "*." and a name for
// any subdomain, normalized as AppendHost normalizes requests' hosts. A port
// is refused: requests' hosts lose theirs, so it could never match. An IPv6
// literal gets the brackets requests' hosts keep ("2001:db8::1" becomes
// "[2001:db8::1]"); like them, it is compared as written, in lower case.
func parseHost(v string) (string, error) {
	rest, wild := strings.CutPrefix(strings.ToLower(v), "*.")
	if rest == "" {
		return "", errors.New("empty host")
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == ':' || c == '[' || c == ']') {
			return "", fmt.Errorf("host %q contains %q", v, c)
		}
	}
	switch {
	case strings.HasPrefix(rest, "["):
		end := strings.IndexByte(rest, ']')
		if end < 0 || !isIPv6(rest[1:end]) {
			return "", errors.New("want an IPv6 address in brackets, such as [2001:db8::1]")
		}
	case strings.Count(rest, ":") > 1:
		if !isIPv6(rest) {
			return "", errors.New("not a host name or an IPv6 address")
		}
		rest = "[" + rest + "]"
	}
	if wild && strings.HasPrefix(rest, "[") {
		return "", errors.New("*. needs a domain name")
	}
	norm := string(AppendHost(nil, []byte(rest)))
	if wild {
		norm = "*." + norm
	}
	switch {
	case strings.TrimPrefix(norm, "*.") == "":
		return "", errors.New("empty host")
	case strings.TrimPrefix(norm, "*.") != strings.TrimSuffix(rest, "."):
		return "", fmt.Errorf("requests are matched by host without a port: write host=%s, which matches every port", norm)
	}
	return norm, nil
}

// isIPv6 reports whether s is an IPv6 address without a zone.
func isIPv6(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6() && a.Zone() == ""
}

// parsePathPrefix reads a path= prefix and normalizes it as AppendPath
// normalizes requests' paths, so that "/log%69n" or "/a/../login" match
// what they say.
func parsePathPrefix(v string) (string, error) {
	if !strings.HasPrefix(v, "/") {
		return "", errors.New(`want a prefix starting with "/", or ~ and a regular expression`)
	}
	if strings.ContainsAny(v, "?#") {
		return "", errors.New("a path prefix has no query or fragment")
	}
	return string(AppendPath(nil, []byte(v))), nil
}
