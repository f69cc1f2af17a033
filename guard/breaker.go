package guard

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// state is a circuit's state, as the authlimit_circuit_state gauge reports
// it.
type state int32

const (
	stateClosed state = 0 // the store is called
	stateOpen   state = 2 // the fail mode answers; a probe runs in the background
)

func (s state) String() string {
	if s == stateClosed {
		return "closed"
	}
	return "open"
}

// breaker is one shard's circuit: closed, it lets calls through and counts
// consecutive failures; at the threshold it opens, and calls take the fail
// mode until a background probe finds the shard answering again. Closed, it
// costs an atomic load per call and an atomic add per failure.
type breaker struct {
	shard    int
	state    atomic.Int32
	failures atomic.Int32
	gauge    prometheus.Gauge // its authlimit_circuit_state series

	// Owned by the prober.
	backoff time.Duration
	next    time.Time
}

// globalShard is the breaker that stands for every shard: it opens when the
// store is not ready at start.
const globalShard = -1

// shardLabel is a shard's label in authlimit_circuit_state: its number,
// "all" for the global breaker; -1, a Redis Cluster slot whose primary
// the client does not know, is "unknown".
func shardLabel(shard int, global bool) string {
	switch {
	case global:
		return "all"
	case shard < 0:
		return "unknown"
	}
	return strconv.Itoa(shard)
}

// breakers are a guard's circuits, one per shard, created on first use, and
// the one goroutine that probes the open ones: at most one probe is in
// flight at a time, whatever the number of open circuits.
type breakers struct {
	threshold              int32
	minBackoff, maxBackoff time.Duration
	probeTimeout           time.Duration
	g                      *Guard
	global                 breaker
	mu                     sync.RWMutex
	m                      map[int]*breaker
	wake, quit, done       chan struct{}
	started, stopped       sync.Once
}

func newBreakers(threshold int, minBackoff, maxBackoff, probeTimeout time.Duration, g *Guard) *breakers {
	return &breakers{
		threshold:    int32(max(threshold, 1)),
		minBackoff:   minBackoff,
		maxBackoff:   max(maxBackoff, minBackoff),
		probeTimeout: probeTimeout,
		g:            g,
		global:       breaker{shard: globalShard, gauge: g.metrics.circuitState.WithLabelValues(shardLabel(globalShard, true))},
		m:            map[int]*breaker{},
		wake:         make(chan struct{}, 1),
		quit:         make(chan struct{}),
		done:         make(chan struct{}),
	}
}

func (bs *breakers) get(shard int) *breaker {
	bs.mu.RLock()
	b, ok := bs.m[shard]
	bs.mu.RUnlock()
	if ok {
		return b
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b, ok := bs.m[shard]; ok {
		return b
	}
	b = &breaker{shard: shard, gauge: bs.g.metrics.circuitState.WithLabelValues(shardLabel(shard, false))}
	b.gauge.Set(float64(stateClosed))
	bs.m[shard] = b
	return b
}

// allow reports whether every shard's circuit is closed.
func (bs *breakers) allow(shards []int) bool {
	if state(bs.global.state.Load()) != stateClosed {
		return false
	}
	for _, s := range shards {
		if state(bs.get(s).state.Load()) != stateClosed {
			return false
		}
	}
	return true
}

func (bs *breakers) success(shards []int) {
	for _, s := range shards {
		if b := bs.get(s); b.failures.Load() != 0 {
			b.failures.Store(0)
		}
	}
}

func (bs *breakers) failure(shards []int) {
	for _, s := range shards {
		b := bs.get(s)
		if b.failures.Add(1) >= bs.threshold {
			bs.open1(b)
		}
	}
}

// trip opens the shards' circuits at once.
func (bs *breakers) trip(shards []int) {
	for _, s := range shards {
		bs.open1(bs.get(s))
	}
}

// open1 opens b if it is closed and wakes the prober.
func (bs *breakers) open1(b *breaker) {
	if !b.state.CompareAndSwap(int32(stateClosed), int32(stateOpen)) {
		return
	}
	b.gauge.Set(float64(stateOpen))
	bs.g.circuitChanged(b.shard, stateClosed, stateOpen)
	select {
	case bs.wake <- struct{}{}:
	default:
	}
}

// openAll opens the global circuit: every decision takes the fail mode
// until the store is ready.
func (bs *breakers) openAll() { bs.open1(&bs.global) }

// openShards counts the open circuits among the known shards; an open
// global circuit counts as every shard.
func (bs *breakers) openShards() (open, known int) {
	bs.mu.RLock()
	defer bs.mu.RUnlock()
	known = max(len(bs.m), 1)
	if state(bs.global.state.Load()) != stateClosed {
		return known, known
	}
	for _, b := range bs.m {
		if state(b.state.Load()) != stateClosed {
			open++
		}
	}
	return open, known
}

func (bs *breakers) start() {
	bs.started.Do(func() { go bs.probe() })
}

func (bs *breakers) stop() {
	bs.stopped.Do(func() { close(bs.quit) })
	bs.started.Do(func() { close(bs.done) }) // never started: nothing to wait for
	<-bs.done
}

// probe runs in its own goroutine: it probes each open circuit when its
// backoff has passed, one at a time, and closes those that answer.
func (bs *breakers) probe() {
	defer close(bs.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := bs.probeDue()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-bs.quit:
			return
		case <-bs.wake:
		case <-timer.C:
		}
	}
}

// probeDue probes every open circuit whose time has come and returns when
// the next one is due (zero if none is open).
func (bs *breakers) probeDue() time.Time {
	var open []*breaker
	if state(bs.global.state.Load()) != stateClosed {
		open = append(open, &bs.global)
	}
	bs.mu.RLock()
	for _, b := range bs.m {
		if state(b.state.Load()) != stateClosed {
			open = append(open, b)
		}
	}
	bs.mu.RUnlock()
	var next time.Time
	for _, b := range open {
		now := time.Now()
		if b.next.IsZero() {
			// Just opened: the first probe after the shortest backoff.
			b.backoff, b.next = bs.minBackoff, now.Add(bs.minBackoff)
		}
		if now.Before(b.next) {
			if next.IsZero() || b.next.Before(next) {
				next = b.next
			}
			continue
		}
		if bs.try(b) {
			b.failures.Store(0)
			b.next = time.Time{}
			b.gauge.Set(float64(stateClosed)) // first: a caller that sees the state closed sees the gauge closed
			b.state.Store(int32(stateClosed))
			bs.g.circuitChanged(b.shard, stateOpen, stateClosed)
			continue
		}
		b.backoff = min(2*b.backoff, bs.maxBackoff)
		b.next = time.Now().Add(b.backoff)
		if next.IsZero() || b.next.Before(next) {
			next = b.next
		}
	}
	return next
}

// try probes one shard.
func (bs *breakers) try(b *breaker) bool {
	ctx, cancel := context.WithTimeout(context.Background(), bs.probeTimeout)
	defer cancel()
	bs.g.metrics.probes.Inc()
	var err error
	switch p := bs.g.prober; {
	case b.shard == globalShard:
		if w, ok := bs.g.store.(Warmer); ok {
			err = w.Warm(ctx)
		} else if p != nil {
			err = p.Probe(ctx, 0)
		}
	case p != nil:
		err = p.Probe(ctx, b.shard)
	}
	if err != nil {
		bs.g.log.Debug("store probe failed", "shard", b.shard, "err", err)
	}
	return err == nil
}
