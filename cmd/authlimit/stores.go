package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/store/redis"
)

// The capabilities the guard finds in the stores by type assertion, and
// the engine in the guard, held at compile time: a method whose signature
// changes fails the build here rather than silently sending decisions down
// a plainer path.
var (
	_ guard.Store      = (*redis.Store)(nil)
	_ guard.Sharded    = (*redis.Store)(nil)
	_ guard.Prober     = (*redis.Store)(nil)
	_ guard.Warmer     = (*redis.Store)(nil)
	_ guard.AsyncStore = (*redis.Store)(nil)
	_ guard.Store      = (*algo.Memory)(nil)
	// and those the engine finds in the guard.
	_ decide.AsyncDecider = (*guard.Guard)(nil)
	_ decide.WholeDecider = (*guard.Guard)(nil)
	_ decide.QuotaStore   = (*guard.Guard)(nil)
)

// newStores builds the store that decides: the embedded memory store, or
// the Redis store over a client of the settings' Redis, with fail mode
// local's memory store beside it.
func (a *app) newStores(_ context.Context, s *settings) error {
	if s.redisOptions == nil {
		m := algo.NewMemory(algo.MemoryOptions{MaxKeys: s.MemoryMaxKeys})
		a.closers = append(a.closers, m.Close)
		registerMemory(a.reg, m, "primary")
		a.store = m
		return nil
	}
	// go-redis logs through a process-wide logger; send it to ours.
	goredis.SetLogger(redisLogger{a.log})
	var client goredis.UniversalClient
	if s.redisPlain != nil {
		client = goredis.NewClient(s.redisPlain)
	} else {
		client = goredis.NewUniversalClient(s.redisOptions)
	}
	a.closers = append(a.closers, client.Close)
	a.client = client
	lost := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "authlimit_refunds_lost_total",
		Help: "Rules of Redis Cluster requests denied by one slot whose consumption in another slot could not be refunded, or whose refund was sent but not answered (it may have run).",
	})
	a.reg.MustRegister(lost)
	rs := redis.New(client, redis.Options{
		Prefix:  s.KeyPrefix,
		Timeout: s.RedisTimeout,
		Conns:   s.RedisPoolSize,
		OnRefundLost: func(n int, err error) {
			lost.Add(float64(n))
			a.log.Warn("refund lost: a denied request still counts in some rules", "rules", n, "err", redact(fmt.Sprint(err), s.RedisURL))
		},
	})
	a.closers = append(a.closers, rs.Close)
	a.store, a.remote = rs, true
	if s.failMode == guard.FailLocal {
		m := algo.NewMemory(algo.MemoryOptions{MaxKeys: s.MemoryMaxKeys})
		a.closers = append(a.closers, m.Close)
		registerMemory(a.reg, m, "local")
		a.local = m
	}
	return nil
}

// registerMemory exports how full a memory store is and what its bound
// gives up; store is primary (the embedded store) or local (the fallback).
func registerMemory(reg prometheus.Registerer, m *algo.Memory, store string) {
	labels := prometheus.Labels{"store": store}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "authlimit_memory_keys",
			Help:        "States the in-memory store holds; at most AUTHLIMIT_MEMORY_MAX_KEYS.",
			ConstLabels: labels,
		}, func() float64 { return float64(m.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "authlimit_memory_refused_total",
			Help:        "Requests denied because the in-memory store was full and no state in it was back to full quota: their new key could not be kept.",
			ConstLabels: labels,
		}, func() float64 { return float64(m.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "authlimit_memory_evicted_total",
			Help:        "States back to full quota that a full in-memory store removed to keep a new key.",
			ConstLabels: labels,
		}, func() float64 { return float64(m.Evicted()) }),
	)
}

// refused reports whether Redis answered, but refused authlimit: wrong
// credentials, missing permissions, or a certificate authlimit does not
// trust. Waiting does not cure these.
func refused(err error) bool {
	var cert *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	if errors.As(err, &cert) || errors.As(err, &unknown) || errors.As(err, &hostname) {
		return true
	}
	msg := err.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "can't access", "invalid password", "invalid username-password", "tls: "} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// redisLogger sends go-redis's messages (reconnects, failovers) to slog at
// debug level: the circuit breaker and metrics report store trouble.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, args ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, args...), "component", "go-redis")
}
