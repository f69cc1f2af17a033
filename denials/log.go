package denials

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/decide"
)

// The longest method and path a log line keeps; longer ones are cut.
const (
	maxLogMethod = 16
	maxLogPath   = 256
)

// logEvent is one denial log line, copied off the request.
type logEvent struct {
	rule, policy, front string
	tag                 [MaxTag]byte
	method              [maxLogMethod]byte
	path                [maxLogPath]byte
	tagLen, methodLen   uint8
	pathLen             uint16
	pathCut             bool
	credential, shadow  bool
	client              netip.Addr
	retryAfter          time.Duration
}

// denialLog is the denial log's ring: offer copies a line into it on the
// request path, at most rate a second, and flush writes them off it.
type denialLog struct {
	rate    int
	logKeys bool
	log     *slog.Logger

	mu         sync.Mutex
	sec        int64 // the second used counts in
	used       int
	ring       []logEvent
	head, n    int
	suppressed uint64 // since the last flush

	out           []logEvent // flush's copy
	lines         prometheus.Counter
	suppressedAll prometheus.Counter
}

func newDenialLog(rate int, logKeys bool, log *slog.Logger) *denialLog {
	l := &denialLog{rate: rate, logKeys: logKeys, log: log}
	if rate > 0 {
		l.ring = make([]logEvent, max(2*rate, 8))
		l.out = make([]logEvent, 0, len(l.ring))
	}
	return l
}

func (l *denialLog) register(reg prometheus.Registerer) error {
	l.lines = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "authlimit_denial_log_lines_total",
		Help: "Denial log lines written: one when a key starts being denied under a rule in a window (AUTHLIMIT_TOP_WINDOW).",
	})
	l.suppressedAll = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "authlimit_denial_log_suppressed_total",
		Help: "Denial log lines not written because AUTHLIMIT_DENIAL_LOG_RATE lines were written in that second.",
	})
	for _, c := range []prometheus.Collector{l.lines, l.suppressedAll} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("denials metrics: %w", err)
		}
	}
	return nil
}

// offer copies d into the ring, or counts it suppressed when rate lines
// were offered in d's second already or the ring is full.
func (l *denialLog) offer(d *decide.Decision) {
	if l.rate == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if sec := d.Now.Unix(); sec != l.sec {
		l.sec, l.used = sec, 0
	}
	if l.used >= l.rate || l.n == len(l.ring) {
		l.suppressed++
		return
	}
	l.used++
	e := &l.ring[(l.head+l.n)%len(l.ring)]
	l.n++
	e.rule, e.policy, e.front = d.Rule, d.Policy, d.Front
	e.tagLen = uint8(copy(e.tag[:], d.Tag))
	e.methodLen = uint8(copy(e.method[:], d.Method))
	e.pathLen = uint16(copy(e.path[:], d.Path))
	e.pathCut = len(d.Path) > maxLogPath
	e.credential, e.shadow = d.Credential, d.Shadow
	e.client, e.retryAfter = d.Client, d.RetryAfter
}

// flush writes the lines in the ring, then one line with the count of
// those suppressed since the last flush, if any.
func (l *denialLog) flush(now time.Time) {
	if l.rate == 0 {
		return
	}
	l.mu.Lock()
	out := l.out[:0]
	for ; l.n > 0; l.n-- {
		out = append(out, l.ring[l.head])
		l.head = (l.head + 1) % len(l.ring)
	}
	suppressed := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	ctx := context.Background()
	for i := range out {
		l.write(ctx, &out[i])
	}
	if l.lines != nil {
		l.lines.Add(float64(len(out)))
		l.suppressedAll.Add(float64(suppressed))
	}
	if suppressed > 0 {
		l.log.LogAttrs(ctx, slog.LevelInfo, "denial log lines suppressed",
			slog.Uint64("suppressed", suppressed), slog.Int("max_per_second", l.rate), slog.Time("until", now))
	}
}

func (l *denialLog) write(ctx context.Context, e *logEvent) {
	msg := "rate limit denied"
	if e.shadow {
		msg = "rate limit would have denied (shadow rule)"
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs, slog.String("rule", e.rule), slog.String("policy", e.policy),
		slog.String("key", l.showKey(e.tag[:e.tagLen], e.credential)))
	if e.client.IsValid() {
		attrs = append(attrs, slog.String("client", e.client.String()))
	}
	if e.methodLen > 0 {
		attrs = append(attrs, slog.String("method", string(e.method[:e.methodLen])))
	}
	if e.pathLen > 0 {
		p := string(e.path[:e.pathLen])
		if e.pathCut {
			p += "…"
		}
		attrs = append(attrs, slog.String("path", p))
	}
	if !e.shadow {
		attrs = append(attrs, slog.Float64("retry_after", e.retryAfter.Seconds()))
	}
	if e.front != "" {
		attrs = append(attrs, slog.String("front", e.front))
	}
	l.log.LogAttrs(ctx, slog.LevelInfo, msg, attrs...)
}

// showKey shows a key tag, or a short hash of it when it may be a
// credential and keys are not to be logged.
func (l *denialLog) showKey(tag []byte, credential bool) string {
	if !credential || l.logKeys {
		return string(tag)
	}
	return KeyHash(tag)
}

// KeyHash is the short hash a key that may be a credential is shown as:
// "sha256:" and the first 12 hex digits of the SHA-256 of its tag. The
// same key always shows the same hash, so that lines can be matched.
func KeyHash(tag []byte) string {
	sum := sha256.Sum256(tag)
	return "sha256:" + hex.EncodeToString(sum[:6])
}
