// Package denials answers "who is being limited, and by which rule": it
// observes the engine's decisions (decide.Observer) and keeps, per rule,
//
//   - a bounded heavy-hitter summary (Space-Saving) of the keys denied in
//     the current and the previous window, with the client address where
//     the key is one, and the admissions of those keys;
//   - a denial log: one line when a key starts being denied under a rule
//     in a window, at most LogRate lines a second process-wide, the rest
//     counted and reported as suppressed;
//   - the rule's admitted and denied rates over the last minutes.
//
// Shadow rules are observed as every rule is: their denials are what they
// would have denied.
//
// With an Exchange (Redis), each replica publishes its summaries every
// ShareInterval in one call, under keys that expire, and any replica's Top
// merges every replica's. On the request path, Observe takes one rule's
// lock and touches fixed memory: it allocates nothing once a rule has been
// seen; the merging, logging and formatting happen in Run and Top.
//
// Memory is bounded: per rule, two summaries of Size entries (see
// SummaryBytes), for at most MaxRules rule names, and a log ring of
// 2×LogRate lines.
package denials

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/decide"
)

// The defaults, and the bounds Options are checked against.
const (
	DefaultSize          = 256
	MaxSize              = 10000
	DefaultWindow        = 10 * time.Minute
	DefaultLogRate       = 10
	MaxLogRate           = 10000
	DefaultShareInterval = 5 * time.Second
	// DefaultMaxRules bounds the rule names summarized: a rule set has at
	// most algo.MaxRules rules, and Envoy's limits share one label.
	DefaultMaxRules = 128
	// RateStep and RatePoints shape the rates: a point every RateStep, the
	// last RatePoints of them (five minutes).
	RateStep   = 5 * time.Second
	RatePoints = 60
)

// Options configure a Recorder.
type Options struct {
	// Size is the number of keys a rule's summary holds per window; the
	// counts are exact while a window's distinct denied keys fit.
	Size int
	// Window is the length of a window; windows start at multiples of it
	// since the Unix epoch, the same on every replica.
	Window time.Duration
	// MaxRules bounds the rule names summarized; the denials of others
	// are counted in no summary.
	MaxRules int
	// LogRate caps the denial log's lines per second, process-wide; 0
	// turns the log off.
	LogRate int
	// LogKeys shows keys that may be credentials in the log as they are;
	// otherwise they are shown as a short hash.
	LogKeys bool
	// Exchange, when set, carries the summaries between replicas.
	Exchange Exchange
	// Replica names this replica in the Exchange; unique per process.
	Replica string
	// ShareInterval is how often Run publishes the summaries.
	ShareInterval time.Duration
	// Logger receives the denial log, at info. Default: discard.
	Logger *slog.Logger
	// Registry receives the metrics. Default: none.
	Registry prometheus.Registerer
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
}

// Recorder observes decisions and answers who is being limited. Build it
// with New, hand it to the engine as decide.Options.Observer, and Run it.
type Recorder struct {
	opts  Options
	clock func() time.Time
	seed  maphash.Seed
	log   *denialLog

	mu    sync.Mutex // orders additions to rules
	rules atomic.Pointer[map[string]*ruleTop]
	// unsummarized counts denials of rules past MaxRules.
	unsummarized atomic.Uint64

	shareMu   sync.Mutex // one publish at a time
	published map[int64]bool
	shareErrs prometheus.Counter
}

var _ decide.Observer = (*Recorder)(nil)

// New checks opts and returns a Recorder.
func New(opts Options) (*Recorder, error) {
	var errs []error
	if opts.Size < 1 || opts.Size > MaxSize {
		errs = append(errs, fmt.Errorf("denials: size %d is not 1 to %d", opts.Size, MaxSize))
	}
	if opts.Window < time.Second {
		errs = append(errs, fmt.Errorf("denials: window %s is under a second", opts.Window))
	}
	if opts.LogRate < 0 || opts.LogRate > MaxLogRate {
		errs = append(errs, fmt.Errorf("denials: log rate %d is not 0 to %d", opts.LogRate, MaxLogRate))
	}
	if opts.Exchange != nil && (opts.Replica == "" || opts.ShareInterval <= 0) {
		errs = append(errs, errors.New("denials: an exchange needs a replica name and a share interval"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if opts.MaxRules <= 0 {
		opts.MaxRules = DefaultMaxRules
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	r := &Recorder{opts: opts, clock: opts.Clock, seed: maphash.MakeSeed(), published: map[int64]bool{}}
	r.log = newDenialLog(opts.LogRate, opts.LogKeys, opts.Logger)
	r.rules.Store(&map[string]*ruleTop{})
	if opts.Registry != nil {
		r.shareErrs = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "authlimit_top_share_errors_total",
			Help: "Failed exchanges of the top limited clients' summaries with the other replicas through Redis (a publish or a fetch).",
		})
		if err := r.log.register(opts.Registry); err != nil {
			return nil, err
		}
		if err := opts.Registry.Register(r.shareErrs); err != nil {
			return nil, fmt.Errorf("denials metrics: %w", err)
		}
	}
	return r, nil
}

// SummaryBytes is the memory one rule's summaries take: two windows of
// size entries with their index and heap.
func SummaryBytes(size int) int {
	slots := 1
	for slots < 2*size {
		slots <<= 1
	}
	return 2 * (size*int(unsafe.Sizeof(entry{})) + 4*slots + 4*size)
}

// ruleTop is one rule's summaries and rates.
type ruleTop struct {
	name string

	mu        sync.Mutex
	win       int64    // the current window's index
	cur, prev *summary // of windows win and win-1
	// dirty: the window's summary changed since it was last published.
	curDirty, prevDirty bool
	shadow              bool

	// active says that cur holds keys, so that an admission looks for
	// its key, and seen has a bit set for each key cur took (by hash), so
	// that most admissions of keys it does not hold take no lock; both
	// are read without mu, written under it.
	active atomic.Bool
	seen   [seenWords]atomic.Uint64
	// The rule's decisions, for the rates.
	admitted, denied atomic.Uint64
	rates            rates
}

// rule returns the rule's state, made on first sight; nil past MaxRules.
func (r *Recorder) rule(name string) *ruleTop {
	if rt := (*r.rules.Load())[name]; rt != nil {
		return rt
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := *r.rules.Load()
	if rt := m[name]; rt != nil {
		return rt
	}
	if len(m) >= r.opts.MaxRules {
		return nil
	}
	rt := &ruleTop{name: name, cur: newSummary(r.opts.Size, r.seed), prev: newSummary(r.opts.Size, r.seed)}
	rt.win = r.window(r.clock())
	next := make(map[string]*ruleTop, len(m)+1)
	for k, v := range m {
		next[k] = v
	}
	next[name] = rt
	r.rules.Store(&next)
	return rt
}

// window returns the index of the window t falls in.
func (r *Recorder) window(t time.Time) int64 {
	return floorDiv(t.UnixNano(), int64(r.opts.Window))
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// at returns the summary of window w, moving the windows on when w is
// past the current one; nil when w is older than the previous one. The
// caller holds rt.mu.
func (rt *ruleTop) at(w int64) *summary {
	switch {
	case w == rt.win:
		return rt.cur
	case w == rt.win-1:
		return rt.prev
	case w < rt.win:
		return nil
	case w == rt.win+1:
		rt.cur, rt.prev = rt.prev, rt.cur
		rt.prevDirty = rt.curDirty
	default:
		rt.prev.reset()
		rt.prevDirty = false
	}
	rt.cur.reset()
	rt.curDirty = false
	rt.win = w
	rt.active.Store(false)
	for i := range rt.seen {
		rt.seen[i].Store(0)
	}
	return rt.cur
}

// seenWords is the size of ruleTop.seen: 4096 bits.
const seenWords = 64

// maySee reports whether cur may hold the key of hash h.
func (rt *ruleTop) maySee(h uint64) bool {
	return rt.seen[(h>>6)%seenWords].Load()&(1<<(h&63)) != 0
}

// see marks the key of hash h as taken by cur. The caller holds rt.mu.
func (rt *ruleTop) see(h uint64) {
	w := &rt.seen[(h>>6)%seenWords]
	w.Store(w.Load() | 1<<(h&63))
}

// Observe records one rule's answer (decide.Observer).
func (r *Recorder) Observe(d *decide.Decision) {
	rt := r.rule(d.Rule)
	if rt == nil {
		if d.Denied {
			r.unsummarized.Add(1)
		}
		return
	}
	if !d.Denied {
		rt.admitted.Add(1)
		if !rt.active.Load() || !rt.maySee(maphash.Bytes(r.seed, d.Tag)) {
			return
		}
		w := r.window(d.Now)
		rt.mu.Lock()
		if s := rt.at(w); s != nil && w == rt.win {
			s.admit(d.Tag)
		}
		rt.mu.Unlock()
		return
	}
	rt.denied.Add(1)
	w := r.window(d.Now)
	rt.mu.Lock()
	s := rt.at(w)
	fresh := false
	if s != nil {
		fresh = s.deny(d.Tag, d.Client, d.Policy, d.Now.UnixNano())
		if w == rt.win {
			rt.curDirty = true
			rt.active.Store(true)
			rt.see(maphash.Bytes(r.seed, d.Tag))
		} else {
			rt.prevDirty = true
		}
	}
	rt.shadow = d.Shadow
	rt.mu.Unlock()
	if fresh {
		r.log.offer(d)
	}
}

// Run logs, samples the rates and shares the summaries until ctx ends.
func (r *Recorder) Run(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	var nextRate, nextShare time.Time
	for {
		select {
		case <-ctx.Done():
			r.Flush()
			return
		case <-t.C:
		}
		r.Flush()
		now := r.clock()
		if !now.Before(nextRate) {
			r.sample()
			nextRate = now.Add(RateStep)
		}
		if r.opts.Exchange != nil && !now.Before(nextShare) {
			c, cancel := context.WithTimeout(ctx, r.opts.ShareInterval)
			if err := r.Publish(c); err != nil {
				r.opts.Logger.Warn("publish the top limited clients to the other replicas", "err", err)
			}
			cancel()
			nextShare = now.Add(r.opts.ShareInterval)
		}
	}
}

// Flush writes the denial log lines waiting, and the count of those
// suppressed since the last Flush.
func (r *Recorder) Flush() { r.log.flush(r.clock()) }

// rulesNow returns the rules seen, in no order.
func (r *Recorder) rulesNow() map[string]*ruleTop { return *r.rules.Load() }
