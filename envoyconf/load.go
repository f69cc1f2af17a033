package envoyconf

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/rules"
)

// Error is one mistake in a configuration: the file and line, the domain,
// the descriptor path ("key_value.key", as envoyproxy/ratelimit names it)
// and the field.
type Error struct {
	File   string
	Line   int
	Domain string
	Path   string
	Field  string
	Err    error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Domain != "" {
		fmt.Fprintf(&b, "domain %q: ", e.Domain)
	}
	if e.Path != "" {
		fmt.Fprintf(&b, "descriptor %q: ", e.Path)
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// File is one configuration file's name and content.
type File struct {
	Name string
	Data []byte
}

// Load reads a configuration from a file, or from every .yaml and .yml file
// of a directory (not its subdirectories; names starting with '.' are
// skipped, such as the ..data of a mounted Kubernetes ConfigMap). Every
// mistake is reported, joined, each an *Error.
func Load(path string) (*Config, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return Parse([]File{{Name: path, Data: data}})
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []File
	for _, e := range entries {
		name := e.Name()
		ext := filepath.Ext(name)
		if strings.HasPrefix(name, ".") || ext != ".yaml" && ext != ".yml" {
			continue
		}
		full := filepath.Join(path, name)
		st, err := os.Stat(full) // follows a ConfigMap's symbolic links
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(full)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: full, Data: data})
	}
	if len(files) == 0 {
		return nil, &Error{File: path, Err: fmt.Errorf("no .yaml or .yml file in the directory: %w", fs.ErrNotExist)}
	}
	return Parse(files)
}

// Parse reads a configuration from files, in order: one domain each.
func Parse(files []File) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	p := &parser{c: c, seen: map[string]string{}, names: map[string]string{}, labels: map[string]*namedLimit{}}
	for _, f := range files {
		c.files = append(c.files, f.Name)
		p.file(f)
	}
	p.checkLabels()
	if len(c.limits) > MaxLimits {
		p.errs = append(p.errs, &Error{File: files[len(files)-1].Name, Err: fmt.Errorf("%d limits; the most is %d", len(c.limits), MaxLimits)})
	}
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return c, nil
}

// The fields of each level, in the order messages list them.
var (
	rootFields       = []string{"domain", "descriptors"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric", "value_to_metric", "share_threshold", "quota_mode", "metadata"}
	rateLimitFields  = []string{"unit", "requests_per_unit", "name", "replaces", "unlimited", "algorithm", "burst"}
	replacesFields   = []string{"name"}
)

type parser struct {
	c      *Config
	errs   []error
	seen   map[string]string // domain → file
	names  map[string]string // policy name → where, to catch a collision
	name   string            // the current file
	domain string
	// labels are the names given with rate_limit.name, each where it is
	// given, to keep them unique.
	labels map[string]*namedLimit
}

// namedLimit is where a rate_limit.name is given.
type namedLimit struct {
	file, domain, path string
	line               int
}

func (w *namedLimit) String() string {
	return fmt.Sprintf("%s:%d, domain %q, descriptor %q", w.file, w.line, w.domain, w.path)
}

// labelName is what a rate_limit.name may be: it labels the limit in
// metrics and names it in RateLimit-Policy and RateLimit, whose
// structured-field strings hold printable ASCII (a quote or a backslash
// would need escaping everywhere the name is written).
var labelName = regexp.MustCompile(`^[!#-\[\]-~]([ !#-\[\]-~]{0,62}[!#-\[\]-~])?$`)

// checkLabels refuses a rate_limit.name that is the name another limit
// goes by: the generated name of a limit without one, or override, which
// labels every limit Envoy sends.
func (p *parser) checkLabels() {
	for name, w := range p.labels {
		other, taken := p.names[name]
		other = "the generated name of the limit " + other
		if name == OverrideLabel {
			other, taken = "the name every limit Envoy sends with a descriptor goes by", true
		}
		if taken {
			p.errs = append(p.errs, &Error{File: w.file, Line: w.line, Domain: w.domain, Path: w.path, Field: "rate_limit.name",
				Err: fmt.Errorf("%q is %s: give this limit another", name, other)})
		}
	}
}

func (p *parser) fail(n *yaml.Node, path, field string, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	p.errs = append(p.errs, &Error{File: p.name, Line: line, Domain: p.domain, Path: path, Field: field, Err: fmt.Errorf(format, args...)})
}

func (p *parser) file(f File) {
	p.name, p.domain = f.Name, ""
	var doc yaml.Node
	dec := yaml.NewDecoder(strings.NewReader(string(f.Data)))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.fail(nil, "", "domain", "missing: the file is empty")
			return
		}
		p.fail(nil, "", "", "not YAML: %v", err)
		return
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.fail(&extra, "", "", "a second YAML document: a file holds one domain")
		return
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = deref(root.Content[0])
	}
	if root.Kind != yaml.MappingNode {
		p.fail(root, "", "", "want a mapping with domain and descriptors")
		return
	}
	if dn := lookup(root, "domain"); dn != nil && dn.Kind == yaml.ScalarNode {
		p.domain = dn.Value // for the messages about the other fields
	}
	fields := p.fields(root, "", "", rootFields)
	p.domain = ""
	dn, ok := fields["domain"]
	if !ok {
		p.fail(root, "", "domain", "missing")
		return
	}
	domain, ok := p.str(dn, "", "domain")
	if !ok {
		return
	}
	if domain == "" {
		p.fail(dn, "", "domain", "empty")
		return
	}
	p.domain = domain
	if prev, dup := p.seen[domain]; dup {
		p.fail(dn, "", "domain", "also configured in %s: each domain lives in one file", prev)
		return
	}
	p.seen[domain] = f.Name
	n := &node{children: map[string]*node{}}
	p.c.domains[domain] = n
	if dn, ok := fields["descriptors"]; ok {
		p.descriptors(n, dn, nil)
	}
}

// lookup returns the value of a mapping's key, or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Kind == yaml.ScalarNode && m.Content[i].Value == key {
			return deref(m.Content[i+1])
		}
	}
	return nil
}

// fields checks a mapping's keys against the known ones and returns the
// values by key, aliases resolved. A merge key (<<: *anchor) adds the
// fields of the mappings it names that the mapping does not set itself.
func (p *parser) fields(m *yaml.Node, path, prefix string, known []string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	var merges []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], deref(m.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			p.fail(k, path, prefix, "a key that is not a string")
			continue
		}
		switch {
		case k.Tag == "!!merge":
			merges = append(merges, v)
		case !contains(known, k.Value):
			if hint := suggest(k.Value, known); hint != "" {
				p.fail(k, path, prefix+k.Value, "unknown field%s", hint)
			} else {
				p.fail(k, path, prefix+k.Value, "unknown field (want %s)", strings.Join(known, ", "))
			}
		case out[k.Value] != nil:
			p.fail(k, path, prefix+k.Value, "given twice")
		default:
			out[k.Value] = v
		}
	}
	for _, v := range merges {
		srcs := []*yaml.Node{v}
		if v.Kind == yaml.SequenceNode {
			srcs = v.Content
		}
		for _, src := range srcs {
			if src = deref(src); src.Kind != yaml.MappingNode {
				p.fail(src, path, prefix+"<<", "a merge takes a mapping or a list of mappings")
				continue
			}
			for k, v := range p.fields(src, path, prefix, known) {
				if out[k] == nil {
					out[k] = v
				}
			}
		}
	}
	return out
}

// deref resolves an alias (*anchor) to the node it names.
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func (p *parser) descriptors(parent *node, list *yaml.Node, path []string) {
	at := strings.Join(path, ".")
	if list.Kind == yaml.ScalarNode && list.Tag == "!!null" {
		return
	}
	if list.Kind != yaml.SequenceNode {
		p.fail(list, at, "descriptors", "want a list of descriptors")
		return
	}
	for _, d := range list.Content {
		p.descriptor(parent, deref(d), path)
	}
}

func (p *parser) descriptor(parent *node, d *yaml.Node, path []string) {
	at := strings.Join(path, ".")
	if d.Kind != yaml.MappingNode {
		p.fail(d, at, "descriptors", "want a descriptor (a mapping with key, and value, rate_limit or descriptors)")
		return
	}
	// The key and value name the descriptor in messages about its
	// other fields.
	named := at
	if kn := lookup(d, "key"); kn != nil && kn.Kind == yaml.ScalarNode && kn.Value != "" {
		named = kn.Value
		if vn := lookup(d, "value"); vn != nil && vn.Kind == yaml.ScalarNode && vn.Tag != "!!null" && vn.Value != "" {
			named += "_" + vn.Value
		}
		named = strings.Join(append(path[:len(path):len(path)], named), ".")
	}
	f := p.fields(d, named, "", descriptorFields)
	kn, ok := f["key"]
	if !ok {
		p.fail(d, at, "key", "missing: every descriptor has a key")
		return
	}
	key, ok := p.str(kn, at, "key")
	if !ok {
		return
	}
	if key == "" {
		p.fail(kn, at, "key", "empty")
		return
	}
	final := key
	var value string
	if vn, ok := f["value"]; ok {
		if value, ok = p.str(vn, at, "value"); !ok {
			return
		}
		if value != "" {
			final += "_" + value
		}
	}
	path = append(path[:len(path):len(path)], final)
	at = strings.Join(path, ".")

	// A descriptor listed again at one level is the same descriptor: its
	// limits add up, its children merge.
	n := parent.children[final]
	if n == nil {
		n = &node{children: map[string]*node{}, value: value}
		parent.children[final] = n
		if strings.Contains(final, "*") {
			parent.wildcards = append(parent.wildcards, wildcard{key: final, parts: strings.Split(final, "*")})
		}
	}
	shadow := p.flag(f, "shadow_mode", at)
	detailed := p.flag(f, "detailed_metric", at)
	p.flag(f, "value_to_metric", at)
	quota := p.flag(f, "quota_mode", at)
	if p.flag(f, "share_threshold", at) {
		if !strings.Contains(value, "*") {
			p.fail(f["share_threshold"], at, "share_threshold", "only for a value with a wildcard ('*')")
		}
		n.shareThreshold = true
	}
	var metadata *structpb.Struct
	if mn, ok := f["metadata"]; ok {
		metadata = p.metadata(mn, at)
	}
	if rn, ok := f["rate_limit"]; ok {
		p.rateLimit(n, rn, path, shadow, detailed, quota, metadata)
	}
	if dn, ok := f["descriptors"]; ok {
		p.descriptors(n, dn, path)
	}
}

// metadata reads a descriptor's metadata: a mapping of any values, as
// google.protobuf.Struct holds them.
func (p *parser) metadata(mn *yaml.Node, at string) *structpb.Struct {
	if mn.Kind == yaml.ScalarNode && mn.Tag == "!!null" {
		return nil
	}
	var m map[string]any
	if mn.Kind != yaml.MappingNode || mn.Decode(&m) != nil {
		p.fail(mn, at, "metadata", "want a mapping")
		return nil
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		p.fail(mn, at, "metadata", "%v", err)
		return nil
	}
	if len(st.GetFields()) == 0 {
		return nil
	}
	return st
}

func (p *parser) rateLimit(n *node, rn *yaml.Node, path []string, shadow, detailed, quota bool, metadata *structpb.Struct) {
	at := strings.Join(path, ".")
	if rn.Kind != yaml.MappingNode {
		p.fail(rn, at, "rate_limit", "want a mapping with unit and requests_per_unit, or unlimited")
		return
	}
	f := p.fields(rn, at, "rate_limit.", rateLimitFields)
	l := &Limit{Key: p.domain + "." + at, Shadow: shadow, Detailed: detailed, Quota: quota, Metadata: metadata}
	bad := false
	if nn, ok := f["name"]; ok {
		l.Name, ok = p.str(nn, at, "rate_limit.name")
		bad = bad || !ok
		switch w := p.labels[l.Name]; {
		case !ok || l.Name == "":
		case !labelName.MatchString(l.Name):
			p.fail(nn, at, "rate_limit.name", "%q: want 1 to 64 printable ASCII characters, no quote, backslash or space at either end (the name labels the limit's metrics and names it in the RateLimit headers)", l.Name)
			bad = true
		case w != nil:
			p.fail(nn, at, "rate_limit.name", "%q is also the name of the limit at %s: names label the metrics, so each limit needs its own", l.Name, w)
			bad = true
		default:
			p.labels[l.Name] = &namedLimit{file: p.name, domain: p.domain, path: at, line: nn.Line}
		}
	}
	l.Unlimited = p.flag(f, "unlimited", at)
	if rl, ok := f["replaces"]; ok {
		if rl.Kind != yaml.SequenceNode {
			p.fail(rl, at, "rate_limit.replaces", "want a list of {name: ...}")
			bad = true
		}
		for _, r := range rl.Content {
			r = deref(r)
			if r.Kind != yaml.MappingNode {
				p.fail(r, at, "rate_limit.replaces", "want {name: ...}")
				bad = true
				continue
			}
			rf := p.fields(r, at, "rate_limit.replaces.", replacesFields)
			name := ""
			if nn, ok := rf["name"]; ok {
				name, _ = p.str(nn, at, "rate_limit.replaces.name")
			}
			switch {
			case name == "":
				p.fail(r, at, "rate_limit.replaces.name", "missing or empty")
				bad = true
			case name == l.Name:
				p.fail(r, at, "rate_limit.replaces.name", "%q is this limit's own name", name)
				bad = true
			default:
				l.Replaces = append(l.Replaces, name)
			}
		}
	}
	un, hasUnit := f["unit"]
	if l.Unlimited {
		for _, field := range []string{"unit", "algorithm", "burst"} {
			if fn, ok := f[field]; ok {
				p.fail(fn, at, "rate_limit."+field, "not with unlimited: true")
				bad = true
			}
		}
	} else {
		switch s, ok := p.scalar(un, hasUnit); {
		case !hasUnit:
			p.fail(rn, at, "rate_limit.unit", "missing (want %s)", unitNames())
			bad = true
		case !ok:
			p.fail(un, at, "rate_limit.unit", "want one of %s", unitNames())
			bad = true
		default:
			u, ok := parseUnit(s)
			if !ok {
				names := make([]string, len(units))
				for i, u := range units {
					names[i] = u.String()
				}
				p.fail(un, at, "rate_limit.unit", "%q is not a unit%s (want %s)", s, suggest(strings.ToLower(s), names), unitNames())
				bad = true
			}
			l.Unit = u
		}
		if rn, ok := f["requests_per_unit"]; ok {
			v, err := strconv.ParseUint(rn.Value, 10, 64)
			if rn.Kind != yaml.ScalarNode || err != nil || v > maxRequestsPerUnit {
				p.fail(rn, at, "rate_limit.requests_per_unit", "%q is not a whole number from 0 to %d", rn.Value, uint64(maxRequestsPerUnit))
				bad = true
			}
			l.RequestsPerUnit = uint32(v)
		}
		// envoyproxy/ratelimit reads a missing requests_per_unit as 0,
		// which denies everything: so does authlimit.
	}
	spec := algo.Spec{Algorithm: algo.FixedWindow, Limit: int64(l.RequestsPerUnit), Window: l.Unit.Window()}
	if an, ok := f["algorithm"]; ok {
		name, _ := p.scalar(an, true)
		a, err := algo.ParseAlgorithm(name)
		if err != nil {
			names := make([]string, 0, 6)
			for _, a := range algo.Algorithms() {
				names = append(names, a.String())
			}
			p.fail(an, at, "rate_limit.algorithm", "%q is not an algorithm%s (want %s)", name, suggest(name, names), strings.Join(names, ", "))
			bad = true
		}
		spec.Algorithm = a
	}
	if bn, ok := f["burst"]; ok {
		v, err := strconv.ParseInt(bn.Value, 10, 64)
		if bn.Kind != yaml.ScalarNode || err != nil || v < 1 {
			p.fail(bn, at, "rate_limit.burst", "%q is not a positive whole number", bn.Value)
			bad = true
		}
		spec.Burst = v
	}
	if l.Unlimited && len(n.limits) > 0 || !l.Unlimited && len(n.limits) > 0 && n.limits[0].Unlimited {
		p.fail(rn, at, "rate_limit.unlimited", "an unlimited descriptor cannot also have a limit (it is listed more than once)")
		bad = true
	}
	if bad {
		return
	}
	if !l.Unlimited && l.RequestsPerUnit > 0 {
		spec.Name = policyName(p.domain, path, len(n.limits))
		if where, dup := p.names[spec.Name]; dup {
			// Two paths that hash alike: practically never.
			p.fail(rn, at, "rate_limit", "its policy name %s is also %s's; rename a key", spec.Name, where)
			return
		}
		pol, err := algo.NewPolicy(spec)
		if err != nil {
			for _, e := range unjoin(err) {
				field := "rate_limit"
				var se *algo.SpecError
				if errors.As(e, &se) {
					field += "." + map[string]string{"limit": "requests_per_unit", "window": "unit"}[se.Field]
					if field == "rate_limit." {
						field += se.Field
					}
					e = se.Err
				}
				p.fail(rn, at, field, "%v", e)
			}
			return
		}
		p.names[spec.Name] = l.Key
		l.Policy = pol
	}
	n.limits = append(n.limits, l)
	p.c.limits = append(p.c.limits, l)
}

// flag reads an optional boolean field.
func (p *parser) flag(f map[string]*yaml.Node, field, at string) bool {
	n, ok := f[field]
	if !ok {
		return false
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		name := field
		if field == "unlimited" {
			name = "rate_limit.unlimited"
		}
		p.fail(n, at, name, "%q is not true or false", n.Value)
		return false
	}
	return b
}

// str reads a string field: any scalar, as envoyproxy/ratelimit reads
// `value: 200` as "200"; null is empty.
func (p *parser) str(n *yaml.Node, at, field string) (string, bool) {
	s, ok := p.scalar(n, true)
	if !ok {
		p.fail(n, at, field, "want a string")
	}
	return s, ok
}

func (p *parser) scalar(n *yaml.Node, present bool) (string, bool) {
	if !present || n.Kind != yaml.ScalarNode {
		return "", false
	}
	if n.Tag == "!!null" {
		return "", true
	}
	return n.Value, true
}

func unitNames() string {
	names := make([]string, len(units))
	for i, u := range units {
		names[i] = u.String()
	}
	return strings.Join(names, ", ")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// suggest names the known word closest to a misspelt one, if any is close.
func suggest(s string, known []string) string {
	if best := rules.Closest(s, known); best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return ""
}
