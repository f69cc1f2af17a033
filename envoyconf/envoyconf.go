// Package envoyconf reads envoyproxy/ratelimit's YAML configuration (one
// domain per file, nested descriptors, limits) into policies, and answers
// which limits apply to a rate-limit descriptor as envoyproxy/ratelimit
// does, so that its users can point authlimit at the files they have.
//
// A descriptor's quota_mode and metadata are served as envoyproxy/ratelimit
// serves them (see Limit.Quota, Limit.Metadata).
//
// Beyond envoyproxy/ratelimit, a rate_limit block may pick any of
// authlimit's algorithms (algorithm, burst), and one descriptor may carry
// several limits: list it more than once at the same level, each listing
// with its own rate_limit; all of them apply.
package envoyconf

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/authlimit/authlimit/algo"
)

// Unit is the period of a limit. Its values are those of
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit, so that a
// front converts it by a cast.
type Unit int32

// The units envoyproxy/ratelimit accepts. A month is 30 days and a year 365,
// as there.
const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
	Month  Unit = 5
	Year   Unit = 6
	Week   Unit = 7
)

// units lists the units in the order messages name them.
var units = []Unit{Second, Minute, Hour, Day, Week, Month, Year}

// String returns the unit's name as written in configuration.
func (u Unit) String() string {
	switch u {
	case Second:
		return "second"
	case Minute:
		return "minute"
	case Hour:
		return "hour"
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return fmt.Sprintf("unit(%d)", int32(u))
}

// Window returns the unit's length, or 0 for a value that is not a unit.
func (u Unit) Window() time.Duration {
	const day = 24 * time.Hour
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return day
	case Week:
		return 7 * day
	case Month:
		return 30 * day
	case Year:
		return 365 * day
	}
	return 0
}

// parseUnit reads a unit name in any case, as envoyproxy/ratelimit does.
func parseUnit(s string) (Unit, bool) {
	for _, u := range units {
		if strings.EqualFold(s, u.String()) {
			return u, true
		}
	}
	return 0, false
}

// Limit is one rate_limit block, or one descriptor-level override sent by
// Envoy. It is immutable.
type Limit struct {
	// Name is the rate_limit's name, "" when it has none: what replaces
	// refers to, and what a response reports as the limit's name.
	Name string
	// Key is where the limit is configured, as envoyproxy/ratelimit names
	// it: the domain and the descriptor path, "domain.key_value.key".
	Key string
	// RequestsPerUnit and Unit are the limit as configured.
	RequestsPerUnit uint32
	Unit            Unit
	// Policy decides the limit. It is nil when Unlimited, or when
	// RequestsPerUnit is 0: such a limit denies every request without
	// counting.
	Policy *algo.Policy
	// Unlimited limits nothing and counts nothing.
	Unlimited bool
	// Shadow decides and counts, but never denies.
	Shadow bool
	// Detailed is the descriptor's detailed_metric: its decisions are
	// also counted per descriptor as the request sends it, values
	// included (a bounded number of them: see front/rls).
	Detailed bool
	// Replaces names the limits this one replaces when both apply to one
	// request.
	Replaces []string
	// Override marks a limit Envoy sent with the descriptor.
	Override bool
	// Quota is the descriptor's quota_mode: the limit is decided and
	// counted, but a request is over the limit for it only when every
	// quota descriptor of the request is over its limit.
	Quota bool
	// Metadata is the descriptor's metadata, returned to Envoy in the
	// response's dynamic_metadata when the descriptor is not over its
	// limit; nil for none. It must not be modified.
	Metadata *structpb.Struct
}

// OverrideLabel is the name every limit Envoy sends with a descriptor goes
// by in the metrics: there may be up to MaxOverrides of them, so they
// share one.
const OverrideLabel = "override"

// Label is the name a configured limit goes by in metrics and the
// RateLimit headers: its rate_limit.name when it has one (unique in the
// configuration), else its policy's generated name. A limit without a
// policy has none.
func (l *Limit) Label() string {
	switch {
	case l.Policy == nil:
		return ""
	case l.Name != "":
		return l.Name
	}
	return l.Policy.Name()
}

// DeniesAll reports whether the limit denies every request: a limit of 0
// requests per unit.
func (l *Limit) DeniesAll() bool { return !l.Unlimited && l.RequestsPerUnit == 0 }

// Entry is one key/value pair of a descriptor, as a request sends it.
type Entry struct{ Key, Value string }

// Bounds of a configuration and of the overrides it accepts.
const (
	// MaxLimits bounds the limits of a configuration, so that they and
	// the overrides stay far within what a store registers.
	MaxLimits = 16384
	// MaxOverrides bounds the distinct descriptor-level overrides (a
	// requests per unit and a unit) kept at once: each is a policy the
	// stores keep for good, and requests choose them.
	MaxOverrides = 1024
)

// Config is a loaded configuration: the domains, their descriptor trees and
// limits. Its methods are safe for concurrent use.
type Config struct {
	domains map[string]*node
	limits  []*Limit
	files   []string

	mu        sync.Mutex
	overrides map[overrideKey]*Limit
}

type overrideKey struct {
	rpu  uint32
	unit Unit
}

// node is a descriptor in the tree: its children by "key_value" (or "key"
// for a descriptor without a value), the wildcard children in the order
// configured, and the limits that apply when a request's last entry ends
// here.
type node struct {
	children  map[string]*node
	wildcards []wildcard
	limits    []*Limit
	// shareThreshold: the values this wildcard descriptor matches share
	// one counter, keyed by the pattern (value) instead of the value.
	shareThreshold bool
	value          string
}

// wildcard is a "key_value" with '*' in it, split at the stars: each star
// matches any run of bytes, empty included.
type wildcard struct {
	key   string
	parts []string
}

func (w *wildcard) match(s []byte) bool {
	p := w.parts
	if len(p) == 1 {
		return string(s) == p[0]
	}
	first, last := p[0], p[len(p)-1]
	if len(s) < len(first)+len(last) || string(s[:len(first)]) != first || string(s[len(s)-len(last):]) != last {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, part := range p[1 : len(p)-1] {
		i := bytes.Index(s, []byte(part))
		if i < 0 {
			return false
		}
		s = s[i+len(part):]
	}
	return true
}

// Limits returns every configured limit, in the order of the files and
// their descriptors.
func (c *Config) Limits() []*Limit { return c.limits }

// Policies returns the policies of the configured limits: those a store and
// a guard must know before the first decision.
func (c *Config) Policies() []*algo.Policy {
	var ps []*algo.Policy
	for _, l := range c.limits {
		if l.Policy != nil {
			ps = append(ps, l.Policy)
		}
	}
	return ps
}

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	ds := make([]string, 0, len(c.domains))
	for d := range c.domains {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	return ds
}

// Files returns the files the configuration was read from.
func (c *Config) Files() []string { return c.files }

// HasDomain reports whether the domain is configured.
func (c *Config) HasDomain(domain string) bool { return c.domains[domain] != nil }

// Match returns the configured limits that apply to a descriptor of a
// request for domain, as envoyproxy/ratelimit finds them: entry by entry,
// the child with the entry's key and value, else the first wildcard child
// that matches, else the child with the key alone; the limits are those of
// the node the last entry reaches, and none when the descriptor is longer
// or shorter than the path to a limit. It appends to key the bytes that
// identify the descriptor's counter (domain and entries, values as sent,
// or the pattern for a share_threshold wildcard) and returns it: turn it
// into a key tag with algo.AppendTag.
func (c *Config) Match(domain string, entries []Entry, key []byte) ([]*Limit, []byte) {
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return nil, key
	}
	start := len(key)
	key = appendKeyStart(key, domain)
	var found []*Limit
	var scratch [128]byte
	for i, e := range entries {
		fk := append(append(append(scratch[:0], e.Key...), '_'), e.Value...)
		next := n.children[string(fk)]
		if next == nil {
			for j := range n.wildcards {
				if w := &n.wildcards[j]; w.match(fk) {
					next = n.children[w.key]
					break
				}
			}
		}
		if next == nil {
			next = n.children[e.Key]
		}
		value := e.Value
		if next != nil && next.shareThreshold {
			value = next.value
		}
		key = appendField(key, e.Key)
		key = appendField(key, value)
		if next != nil && i == len(entries)-1 {
			found = next.limits
		}
		if next == nil || len(next.children) == 0 {
			break // a longer descriptor matches nothing
		}
		n = next
	}
	if len(found) == 0 {
		return nil, key[:start]
	}
	return found, key
}

// AppendOverrideKey appends the counter key of a descriptor that carries
// its own limit: the descriptor's key and the override, so that an
// override's state never meets a configured limit's.
func AppendOverrideKey(key []byte, domain string, entries []Entry, l *Limit) []byte {
	key = appendKeyStart(key, domain)
	for _, e := range entries {
		key = appendField(key, e.Key)
		key = appendField(key, e.Value)
	}
	key = append(key, 0, 'o')
	key = binary.AppendUvarint(key, uint64(l.RequestsPerUnit))
	return binary.AppendUvarint(key, uint64(l.Unit))
}

// appendKeyStart starts a counter key: a marker no HTTP key has (a NUL),
// then the domain. Every field is length-prefixed, so that no two
// descriptors share a key.
func appendKeyStart(key []byte, domain string) []byte {
	key = append(key, "rls\x00"...)
	return appendField(key, domain)
}

func appendField(key []byte, s string) []byte {
	key = binary.AppendUvarint(key, uint64(len(s)))
	return append(key, s...)
}

// Override returns the limit for a descriptor that carries its own limit
// (Envoy's descriptor-level limit override). Overrides never shadow and
// replace nothing, as in envoyproxy/ratelimit. Each distinct override is a
// policy kept for good: past MaxOverrides distinct ones, a new one is an
// error.
func (c *Config) Override(rpu uint32, unit Unit) (*Limit, error) {
	if unit.Window() == 0 {
		return nil, fmt.Errorf("override: %d is not a unit", int32(unit))
	}
	k := overrideKey{rpu, unit}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.overrides[k]; ok {
		return l, nil
	}
	if len(c.overrides) >= MaxOverrides {
		return nil, fmt.Errorf("override: more than %d distinct limit overrides", MaxOverrides)
	}
	l := &Limit{Key: "override", RequestsPerUnit: rpu, Unit: unit, Override: true}
	if rpu > 0 {
		p, err := algo.NewPolicy(algo.Spec{
			Name:      fmt.Sprintf("rls-override-%d-per-%s", rpu, unit),
			Algorithm: algo.FixedWindow,
			Limit:     int64(rpu),
			Window:    unit.Window(),
		})
		if err != nil {
			return nil, fmt.Errorf("override: %w", err)
		}
		l.Policy = p
	}
	if c.overrides == nil {
		c.overrides = map[overrideKey]*Limit{}
	}
	c.overrides[k] = l
	return l, nil
}

// policyName derives a limit's policy name from where it is configured:
// readable ([a-z0-9_], from the domain and the descriptor path) and unique
// (a hash of the exact domain, path and the limit's place among the limits
// of its descriptor). The same configuration gives the same names, so
// that counts carry over a restart or a reload; the limit's value and
// algorithm are not part of it, so that changing them keeps the count.
func policyName(domain string, path []string, index int) string {
	h := sha256.New()
	h.Write([]byte(domain))
	for _, p := range path {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	if index > 0 {
		fmt.Fprintf(h, "\x01%d", index)
	}
	sum := hex.EncodeToString(h.Sum(nil)[:4])
	readable := slug(domain + "_" + strings.Join(path, "_"))
	const room = 64 - len("rls_") - 1 - 8
	if len(readable) > room {
		readable = readable[:room]
	}
	return "rls_" + readable + "_" + sum
}

// slug keeps lower-case letters and digits, and turns every run of other
// bytes into one '_'.
func slug(s string) string {
	var b strings.Builder
	under := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
			fallthrough
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
			b.WriteByte(c)
			under = false
		default:
			if !under {
				b.WriteByte('_')
				under = true
			}
		}
	}
	return strings.Trim(b.String(), "_")
}

// maxRequestsPerUnit is the largest requests_per_unit: a uint32, as the
// protocol carries it.
const maxRequestsPerUnit = math.MaxUint32
