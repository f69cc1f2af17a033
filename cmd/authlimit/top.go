package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/denials"
	"github.com/authlimit/authlimit/denials/redisshare"
)

// topSettings checks the top limited clients' and the denial log's
// variables: AUTHLIMIT_TOP_SIZE, AUTHLIMIT_TOP_WINDOW,
// AUTHLIMIT_TOP_SHARE_INTERVAL and AUTHLIMIT_DENIAL_LOG_RATE.
func topSettings(s *settings, _ map[string]string, p *problems) {
	c, problem := &s.config, p.add
	if c.TopSize < 1 || c.TopSize > denials.MaxSize {
		problem("TOP_SIZE", fmt.Errorf("%d is not 1 to %d", c.TopSize, denials.MaxSize))
	}
	if c.TopWindow < time.Minute || c.TopWindow > 24*time.Hour || c.TopWindow%time.Second != 0 {
		problem("TOP_WINDOW", fmt.Errorf("%s is not whole seconds from 1m to 24h", c.TopWindow))
	}
	if c.TopShareInterval < time.Second || c.TopShareInterval > time.Minute {
		problem("TOP_SHARE_INTERVAL", fmt.Errorf("%s is not 1s to 1m", c.TopShareInterval))
	}
	if c.DenialLogRate < 0 || c.DenialLogRate > denials.MaxLogRate {
		problem("DENIAL_LOG_RATE", fmt.Errorf("%d is not 0 (no denial log) to %d lines a second", c.DenialLogRate, denials.MaxLogRate))
	}
}

// describeTop adds the top limited clients and the denial log to -check's
// output.
func (s *settings) describeTop(w func(k, v string)) {
	share := "this instance only (no Redis)"
	if s.redisOptions != nil {
		share = fmt.Sprintf("shared through Redis every %s", s.TopShareInterval)
	}
	w("top limited", fmt.Sprintf("%d keys per rule and %s window, %s; at most %d bytes per rule", s.TopSize, s.TopWindow, share, denials.SummaryBytes(s.TopSize)))
	switch {
	case s.DenialLogRate == 0:
		w("denial log", "off (AUTHLIMIT_DENIAL_LOG_RATE=0)")
	case s.LogKeys:
		w("denial log", fmt.Sprintf("at most %d lines a second; keys shown as they are (AUTHLIMIT_LOG_KEYS)", s.DenialLogRate))
	default:
		w("denial log", fmt.Sprintf("at most %d lines a second; header keys shown hashed", s.DenialLogRate))
	}
}

// newDenials builds the recorder of denials; client, when not nil, is the
// Redis it shares its summaries through.
func newDenials(s *settings, reg prometheus.Registerer, log *slog.Logger, client goredis.UniversalClient) (*denials.Recorder, error) {
	opts := denials.Options{
		Size:          s.TopSize,
		Window:        s.TopWindow,
		LogRate:       s.DenialLogRate,
		LogKeys:       s.LogKeys,
		ShareInterval: s.TopShareInterval,
		Logger:        log,
		Registry:      reg,
	}
	if client != nil {
		opts.Exchange = redisshare.New(client, s.KeyPrefix)
		opts.Replica = replicaName()
	}
	return denials.New(opts)
}

// replicaName names this process among the replicas: its host name, its
// process id and a random part, so that a restarted replica is a new one.
func replicaName() string {
	host, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// runDenials runs the recorder in the background until the app closes.
func (a *app) runDenials() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.denials.Run(ctx)
	}()
	a.closers = append(a.closers, func() error { cancel(); <-done; return nil })
}
