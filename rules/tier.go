package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/authlimit/authlimit/algo"
)

// Per-customer limits. A rule's own limit= is the default; two kinds of
// entries in the rule set give some requests another:
//
//	name=api key=header:X-Api-Key limit=100/1m tier=header:X-Plan
//	tier rule=api name=pro limit=1000/1m
//	override rule=api key=k-acme-2f9c limit=5000/1m
//
// An override gives one value of the rule's key its own limit (an API key
// with a contract); a tier gives every request whose tier header names it
// its limit (a proxy sets the header after authentication). An override
// comes first, then the tier, then the rule's own limit.
//
// Each tier and each override is a policy of its own, with state of its
// own, named after the rule (see policyName): a client whose tier changes
// starts the new tier's limit afresh, and finds its old tier's count if it
// returns within the window. What a tier or an override changes is the
// limit (limit=, and burst= for the algorithms with one); the algorithm,
// the key, the cost and the matching are the rule's.

// Tier is one tier of a rule: the requests whose tier header names it are
// limited by Policy.
type Tier struct {
	// Name is the tier's name, [a-z0-9_-]+; the header's value is compared
	// with it without regard to case.
	Name string
	// Policy is the tier's limit.
	Policy *algo.Policy
}

// Override gives one value of a rule's key its own limit.
type Override struct {
	// Key is the key's value as the rule counts it: a header's value as
	// sent, or a host normalized as AppendHost does.
	Key string
	// Policy is the override's limit.
	Policy *algo.Policy
}

// TierStatus says whether a request's tier could be read.
type TierStatus uint8

// The tier statuses.
const (
	// TierOK: the request's limit is chosen.
	TierOK TierStatus = iota
	// TierRepeated: a trusted proxy forwarded the tier header more than
	// once. The request is refused, never given the default: which copy
	// the proxy set is unknown, and either answer would let a client's
	// own copy move its limit.
	TierRepeated
)

// maxVariants bounds the tiers and overrides of a rule set: each is a
// policy the stores register.
const maxVariants = 4096

// Policies returns every policy the rule may decide with: its own, then
// its tiers' and its overrides', in the order Select numbers them.
func (r *Rule) Policies() []*algo.Policy {
	if len(r.policies) == 0 {
		return []*algo.Policy{r.Policy}
	}
	return r.policies
}

// Select returns the index in Policies of the policy that limits q, whose
// key under the rule (AppendKey's) is key: an override of that key, else
// the tier q's tier header names, else the rule's own (0). The tier header
// is read only when trusted says the request came from a trusted proxy: a
// client talking to authlimit itself could otherwise choose its tier. A
// missing, empty or unknown tier is the rule's own limit; a repeated one
// is TierRepeated.
func (r *Rule) Select(q *Request, key []byte, trusted bool) (int, TierStatus) {
	if r.overrides != nil {
		if i, ok := r.overrides[string(key)]; ok {
			return i, TierOK
		}
	}
	if r.TierHeader == "" || !trusted || q.Header == nil {
		return 0, TierOK
	}
	v, n := q.Header.Lookup(r.TierHeader)
	switch {
	case n > 1:
		return 0, TierRepeated
	case n == 0 || len(v) == 0 || len(v) > 64:
		return 0, TierOK
	}
	var buf [64]byte
	name := buf[:len(v)]
	for i, c := range v {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		name[i] = c
	}
	for i, t := range r.Tiers {
		if string(name) == t.Name {
			return 1 + i, TierOK
		}
	}
	return 0, TierOK
}

// variant is a tier or override line as read, before it joins its rule.
type variant struct {
	kind   string // "tier" or "override"
	n      int    // its position among the entries of its kind
	rule   string
	name   string // a tier's
	key    string // an override's
	limit  string
	burst  string
	fields map[string]string
}

// label names the entry in errors: by kind and position, and by its
// rule, and a tier by its name. An override's key is not repeated: it may
// be a credential.
func (v *variant) label() string {
	s := fmt.Sprintf("%s %d", v.kind, v.n)
	if v.kind == "tier" && v.name != "" {
		s += fmt.Sprintf(" %q", v.name)
	}
	if v.rule != "" {
		s += fmt.Sprintf(" of rule %q", v.rule)
	}
	return s
}

// parseVariant reads a tier or override entry: its fields after the
// leading word.
func parseVariant(kind string, n int, fields []string) (*variant, error) {
	v := &variant{kind: kind, n: n, fields: map[string]string{}}
	var errs []error
	want := "rule, name, limit or burst"
	if kind == "override" {
		want = "rule, key, limit or burst"
	}
	for _, f := range fields {
		k, val, ok := strings.Cut(f, "=")
		if !ok {
			errs = append(errs, fmt.Errorf("%q is not field=value", f))
			continue
		}
		if _, dup := v.fields[k]; dup {
			errs = append(errs, fmt.Errorf("%s: given twice", k))
			continue
		}
		v.fields[k] = val
		switch {
		case k == "rule":
			v.rule = val
		case k == "name" && kind == "tier":
			v.name = val
			if err := algo.ValidName(val); err != nil {
				errs = append(errs, fmt.Errorf("name %q: %w", val, err))
			}
		case k == "key" && kind == "override":
			v.key = val
			if val == "" {
				errs = append(errs, errors.New("key: empty; want the key's value, such as an API key"))
			}
		case k == "limit":
			v.limit = val
			if _, _, err := parseLimit(val); err != nil {
				errs = append(errs, fmt.Errorf("limit %q: %w", val, err))
			}
		case k == "burst":
			v.burst = val
			if _, err := parseCount(val); err != nil {
				errs = append(errs, fmt.Errorf("burst %q: %w", val, err))
			}
		default:
			errs = append(errs, fmt.Errorf("%s: unknown field (want %s)", k, want))
		}
	}
	if v.rule == "" {
		errs = append(errs, fmt.Errorf("rule: missing; every %s names its rule: rule=<name>", kind))
	}
	if _, ok := v.fields["name"]; !ok && kind == "tier" {
		errs = append(errs, errors.New("name: missing; want name=<[a-z0-9_-]+>, the value of the rule's tier header"))
	}
	if _, ok := v.fields["key"]; !ok && kind == "override" {
		errs = append(errs, errors.New("key: missing; want key=<value>, the value of the rule's key it applies to"))
	}
	if _, ok := v.fields["limit"]; !ok {
		errs = append(errs, errors.New("limit: missing; want limit=<N>/<duration>, such as 1000/1m"))
	}
	return v, prefixErrors(v.label(), errs)
}

func prefixErrors(label string, errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = fmt.Errorf("%s: %w", label, e)
	}
	return errors.Join(out...)
}

// attach joins the tier and override entries to their rules, building each
// one's policy, and checks that every policy name in the set is its own.
func attach(rs []*Rule, positions map[string]int, vs []*variant, mentioned map[string]bool) error {
	var errs []error
	byName := map[string]*Rule{}
	for _, r := range rs {
		byName[r.Name] = r
	}
	if len(vs) > maxVariants {
		return fmt.Errorf("%d tiers and overrides; the maximum is %d", len(vs), maxVariants)
	}
	tierAt := map[[2]string]int{}
	overrideAt := map[[2]string]int{}
	for _, v := range vs {
		fail := func(err error) { errs = append(errs, fmt.Errorf("%s: %w", v.label(), err)) }
		r, ok := byName[v.rule]
		if !ok {
			if _, known := positions[v.rule]; !known {
				fail(fmt.Errorf("rule %q: no rule has that name%s", v.rule, didYouMean(v.rule, positions)))
			}
			continue // a rule with mistakes of its own: reported there
		}
		spec := r.Policy.Spec()
		var key string
		switch v.kind {
		case "tier":
			if r.TierHeader == "" {
				fail(fmt.Errorf("rule %q: the rule reads no tier: add tier=header:<Name> to it, naming the header a proxy sets", v.rule))
				continue
			}
			if first, dup := tierAt[[2]string{r.Name, v.name}]; dup {
				fail(fmt.Errorf("name %q: already given by tier %d", v.name, first))
				continue
			}
			tierAt[[2]string{r.Name, v.name}] = v.n
			spec.Name = policyName(r.Name, v.name)
		case "override":
			var err error
			if key, err = overrideKey(r, v.key); err != nil {
				fail(fmt.Errorf("key: %w", err))
				continue
			}
			if first, dup := overrideAt[[2]string{r.Name, key}]; dup {
				fail(fmt.Errorf("key: the same key as override %d", first))
				continue
			}
			overrideAt[[2]string{r.Name, key}] = v.n
			spec.Name = policyName(r.Name, "key-"+strings.TrimPrefix(KeyHash(key), "sha256:"))
		}
		p, err := variantPolicy(spec, v)
		if err != nil {
			for _, e := range unjoin(err) {
				fail(e)
			}
			continue
		}
		if r.CostMissing > p.MaxCost() {
			fail(fmt.Errorf("limit %q: the rule's cost_missing %d is more than this limit ever admits at once (%d): every such request would be denied", v.limit, r.CostMissing, p.MaxCost()))
			continue
		}
		switch v.kind {
		case "tier":
			r.Tiers = append(r.Tiers, Tier{Name: v.name, Policy: p})
		case "override":
			r.Overrides = append(r.Overrides, Override{Key: key, Policy: p})
		}
	}
	// Number the policies: the rule's, its tiers', its overrides'.
	for _, r := range rs {
		if r.TierHeader != "" && !mentioned[r.Name] && !mentioned[""] {
			errs = append(errs, ruleError(positions[r.Name], r.Name, fmt.Errorf("tier %q: no tier names this rule, so every request gets the rule's own limit: add tier rule=%s name=<tier> limit=<N>/<duration>, or remove tier=", "header:"+r.TierHeader, r.Name)))
		}
		if len(r.Tiers)+len(r.Overrides) == 0 {
			continue
		}
		r.policies = []*algo.Policy{r.Policy}
		for _, t := range r.Tiers {
			r.policies = append(r.policies, t.Policy)
		}
		if len(r.Overrides) > 0 {
			r.overrides = make(map[string]int, len(r.Overrides))
			for i, o := range r.Overrides {
				r.overrides[o.Key] = len(r.policies) + i
			}
			for _, o := range r.Overrides {
				r.policies = append(r.policies, o.Policy)
			}
		}
	}
	// A tier's or override's policy name must not be a rule's, nor
	// another's: the state would be shared.
	owner := map[string]string{}
	for _, r := range rs {
		owner[r.Name] = fmt.Sprintf("rule %d %q", positions[r.Name], r.Name)
	}
	for _, r := range rs {
		for i, p := range r.Policies()[1:] {
			what := fmt.Sprintf("override of rule %q", r.Name)
			if i < len(r.Tiers) {
				what = fmt.Sprintf("tier %q of rule %q", r.Tiers[i].Name, r.Name)
			}
			if o, taken := owner[p.Name()]; taken {
				errs = append(errs, fmt.Errorf("%s: keeps its counts under the name %q, which %s has: rename one", what, p.Name(), o))
				continue
			}
			owner[p.Name()] = what
		}
	}
	return errors.Join(errs...)
}

// variantPolicy builds a tier's or override's policy: the rule's spec with
// the entry's limit and burst. Its burst defaults to its own limit, not
// the rule's burst.
func variantPolicy(spec algo.Spec, v *variant) (*algo.Policy, error) {
	var errs []error
	limit, window, err := parseLimit(v.limit)
	if err != nil {
		errs = append(errs, fmt.Errorf("limit %q: %w", v.limit, err))
	}
	spec.Limit, spec.Window, spec.Burst = limit, window, 0
	if _, given := v.fields["burst"]; given {
		if spec.Burst, err = parseCount(v.burst); err != nil {
			errs = append(errs, fmt.Errorf("burst %q: %w", v.burst, err))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	p, err := algo.NewPolicy(spec)
	if err != nil {
		for _, e := range unjoin(err) {
			var se *algo.SpecError
			if errors.As(e, &se) {
				field := se.Field
				if field == "window" {
					field = "limit"
				}
				switch field {
				case "limit":
					errs = append(errs, fmt.Errorf("limit %q: %w", v.limit, se.Err))
				case "burst":
					errs = append(errs, fmt.Errorf("burst %q: %w", v.burst, se.Err))
				case "cost":
					errs = append(errs, fmt.Errorf("limit %q: the rule's cost: %w", v.limit, se.Err))
				default:
					errs = append(errs, fmt.Errorf("%s: %w", field, se.Err))
				}
			} else {
				errs = append(errs, e)
			}
		}
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// overrideKey checks that the rule's key can be overridden by value and
// returns the value as the rule's key holds it.
func overrideKey(r *Rule, v string) (string, error) {
	if len(r.Key) != 1 || (r.Key[0].Kind != PartHeader && r.Key[0].Kind != PartHost) {
		return "", fmt.Errorf("rule %q counts by %s: an override names one value of a key of one part, header:<Name> or host", r.Name, keyString(r.Key))
	}
	if r.Key[0].Kind == PartHost {
		h, err := parseHost(v)
		if err != nil || strings.HasPrefix(h, "*.") {
			return "", errors.New("want a host name, as the rule counts it")
		}
		return h, nil
	}
	return v, nil
}

// policyName names a tier's or override's policy after its rule: rule,
// "--", and what sets it apart, cut to algo's 64 bytes with a hash of the
// whole when longer. It is stable across reloads, so that a tier or an
// override keeps its counts.
func policyName(rule, variant string) string {
	name := rule + "--" + variant
	if len(name) <= 64 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:64-13] + "-" + hex.EncodeToString(sum[:6])
}

// didYouMean suggests the closest rule name, if one is close.
func didYouMean(name string, positions map[string]int) string {
	known := make([]string, 0, len(positions))
	for n := range positions {
		known = append(known, n)
	}
	if best := Closest(name, known); best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return ""
}
