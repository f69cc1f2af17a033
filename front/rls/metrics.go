package rls

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/envoyconf"
)

// Metrics count the service's requests by how they were answered. The
// decisions of their limits are the engine's to count, with those of /auth
// and Check (authlimit_requests_total, authlimit_decisions_total): these
// add what only the front knows, the requests refused before the engine
// and the answer Envoy got.
//
// Build them once with NewMetrics and give them to every Service of the
// process (Options.Metrics): a Service built by a reload then continues the
// counts of the one it replaces, and Prometheus sees no counter reset. Their
// labels are a fixed set of answers, none per limit, so a reload that
// removes limits leaves no series behind.
type Metrics struct {
	ok, overLimit, failedOpen, invalid, unavailable, errors prometheus.Counter
	detailed                                                detailedMetrics
}

// Bounds of the detailed metrics (detailed_metric: true): the descriptors
// counted apart per limit, and in all. A descriptor past either bound is
// counted under DetailedOther.
const (
	MaxDetailedPerLimit = 100
	MaxDetailed         = 1000
	// DetailedOther is the descriptor label of the descriptors past the
	// bounds.
	DetailedOther = "(other)"
	// maxDetailedLabel bounds a descriptor label's length in bytes.
	maxDetailedLabel = 256
)

// detailedMetrics count the decisions of detailed_metric limits per
// descriptor as requests send it (authlimit_rls_detailed_decisions_total),
// as envoyproxy/ratelimit's detailed metrics do, bounded: the first
// MaxDetailedPerLimit descriptors of a limit, and MaxDetailed of all
// limits, get series of their own, the rest share one per limit. The
// bounds hold for the process's life, across reloads: a series, once
// made, is never removed.
type detailedMetrics struct {
	vec      *prometheus.CounterVec
	mu       sync.RWMutex
	series   map[string]*outcomeCounters // label, 0, descriptor → counters
	perLimit map[string]int              // label → its descriptors counted apart
	apart    int                         // the descriptors counted apart, of every limit
}

type outcomeCounters struct{ allowed, denied, shadowDenied prometheus.Counter }

// NewMetrics registers the service's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_rls_requests_total",
		Help: "ShouldRateLimit and /json requests by answer: ok, over_limit, failed_open (the store could not decide; the fail mode admits), invalid (refused with InvalidArgument), unavailable (no decision), error.",
	}, []string{"result"})
	detailed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_rls_detailed_decisions_total",
		Help: "Decisions of the limits configured with detailed_metric: true, by limit (rule, as authlimit_decisions_total names it), descriptor as the request sent it (key_value entries joined by '.'; the first 100 descriptors of a limit and 1000 in all, the rest under (other)) and outcome: allowed, denied, shadow_denied.",
	}, []string{"rule", "descriptor", "outcome"})
	for _, c := range []prometheus.Collector{requests, detailed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rls metrics: %w", err)
		}
	}
	return &Metrics{
		detailed:    detailedMetrics{vec: detailed, series: map[string]*outcomeCounters{}, perLimit: map[string]int{}},
		ok:          requests.WithLabelValues("ok"),
		overLimit:   requests.WithLabelValues("over_limit"),
		failedOpen:  requests.WithLabelValues("failed_open"),
		invalid:     requests.WithLabelValues("invalid"),
		unavailable: requests.WithLabelValues("unavailable"),
		errors:      requests.WithLabelValues("error"),
	}, nil
}

// count records how a request was answered.
func (m *Metrics) count(a *answer, failedOpen bool, err error) {
	switch {
	case err == nil && a.overLimit:
		m.overLimit.Inc()
	case err == nil && failedOpen:
		m.failedOpen.Inc()
	case err == nil:
		m.ok.Inc()
	case status.Code(err) == codes.InvalidArgument:
		m.invalid.Inc()
	case status.Code(err) == codes.Unavailable:
		m.unavailable.Inc()
	default:
		m.errors.Inc()
	}
}

// countDetailed counts the decision r of limit l for the descriptor of
// entries, if l is detailed. buf is scratch memory, returned for reuse: a
// descriptor seen before costs no allocation.
func (m *Metrics) countDetailed(l *envoyconf.Limit, entries []envoyconf.Entry, r *decide.Result, buf []byte) []byte {
	if !l.Detailed || r.NotDecided {
		return buf
	}
	label := r.Limit.Name
	buf = append(buf[:0], label...)
	buf = append(buf, 0)
	at := len(buf)
	for i, e := range entries {
		if i > 0 {
			buf = append(buf, '.')
		}
		buf = appendValid(buf, e.Key)
		buf = append(buf, '_')
		buf = appendValid(buf, e.Value)
		if len(buf)-at > maxDetailedLabel {
			break
		}
	}
	if len(buf)-at > maxDetailedLabel {
		n := at + maxDetailedLabel
		for n > at && !utf8.RuneStart(buf[n]) {
			n-- // cut on a rune's start
		}
		buf = buf[:n]
	}
	c := m.detailed.counters(buf, at)
	switch {
	case r.Allowed:
		c.allowed.Inc()
	case r.Shadow:
		c.shadowDenied.Inc()
	default:
		c.denied.Inc()
	}
	return buf
}

// counters returns the series of key (a limit's label, 0, a descriptor
// from at), made if the bounds allow, else the limit's (other).
func (d *detailedMetrics) counters(key []byte, at int) *outcomeCounters {
	d.mu.RLock()
	c, ok := d.series[string(key)]
	d.mu.RUnlock()
	if ok {
		return c
	}
	label := string(key[:at-1])
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.series[string(key)]; ok {
		return c
	}
	desc := string(key[at:])
	if d.perLimit[label] >= MaxDetailedPerLimit || d.apart >= MaxDetailed {
		desc = DetailedOther
		if c, ok := d.series[label+"\x00"+desc]; ok {
			return c // not remembered under key: a descriptor past the bounds is looked up again
		}
	} else {
		d.perLimit[label]++
		d.apart++
	}
	c = &outcomeCounters{
		allowed:      d.vec.WithLabelValues(label, desc, "allowed"),
		denied:       d.vec.WithLabelValues(label, desc, "denied"),
		shadowDenied: d.vec.WithLabelValues(label, desc, "shadow_denied"),
	}
	d.series[label+"\x00"+desc] = c
	return c
}

// appendValid appends s, each byte that is not part of valid UTF-8
// replaced by U+FFFD: label values are UTF-8.
func appendValid(b []byte, s string) []byte {
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[:n]...)
		}
		s = s[n:]
	}
	return b
}
