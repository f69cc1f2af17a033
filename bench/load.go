package main

// This file is the load generator: closed-loop HTTP/1.1 keep-alive clients,
// one goroutine and one connection each, sending prebuilt requests.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Phases of a load run, as workers see them.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// stopGrace is how long after the planned end a response may still take
// before its connection's deadline fails it.
const stopGrace = 5 * time.Second

// load is one run of the load generator against one address.
type load struct {
	addr       string
	reqs       [][]byte // prebuilt requests, cycled through
	conns      int
	warmup     time.Duration
	duration   time.Duration
	denyStatus int // the status that means "denied"; 200 means allowed
}

// loadResult is what a load run measured in its window.
type loadResult struct {
	elapsed    time.Duration // the measured window
	allowed    uint64        // 200 answers
	denied     uint64        // deny-status answers
	badStatus  map[int]uint64
	transport  uint64 // failed dials, writes, reads and malformed responses
	reconnects uint64 // connections the server closed with Connection: close
	hist       histogram
	// failed counts the gRPC load's failed calls and answers that are
	// neither decision, by kind.
	failed map[string]uint64
}

// decisions is the number of answers counted as decided (allowed or denied).
func (r *loadResult) decisions() uint64 { return r.allowed + r.denied }

// errors counts transport errors and unexpected statuses.
func (r *loadResult) errors() uint64 {
	n := r.transport
	for _, c := range r.badStatus {
		n += c
	}
	for _, c := range r.failed {
		n += c
	}
	return n
}

// errorDetail names the kinds of errors, for the results' notes.
func (r *loadResult) errorDetail() string {
	var parts []string
	if r.transport > 0 {
		parts = append(parts, fmt.Sprintf("transport %d", r.transport))
	}
	codes := make([]int, 0, len(r.badStatus))
	for c := range r.badStatus {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("status %d: %d", c, r.badStatus[c]))
	}
	kinds := make([]string, 0, len(r.failed))
	for k := range r.failed {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s: %d", k, r.failed[k]))
	}
	return strings.Join(parts, ", ")
}

// worker is one connection's goroutine and its counts. The counts are its
// own until the run ends; mu guards only conn, for dialing and for the
// interruption on cancel.
type worker struct {
	mu         sync.Mutex
	conn       net.Conn
	status     [600]uint64
	transport  uint64
	reconnects uint64
	hist       histogram
}

// run drives the load: warm-up, then the measured window, calling atStart
// and atEnd right at its edges (for CPU and Redis samples).
func (l *load) run(ctx context.Context, atStart, atEnd func() error) (*loadResult, error) {
	workers := make([]*worker, l.conns)
	for i := range workers {
		workers[i] = &worker{}
	}
	elapsed, err := drive(ctx, l.warmup, l.duration, len(workers),
		func(i int, phase *atomic.Int32, deadline time.Time) {
			workers[i].loop(l, i*len(l.reqs)/l.conns, phase, deadline)
		},
		func(i int) { workers[i].interrupt() },
		atStart, atEnd)
	if err != nil {
		return nil, err
	}

	res := &loadResult{elapsed: elapsed, badStatus: map[int]uint64{}}
	for _, w := range workers {
		res.hist.merge(&w.hist)
		res.transport += w.transport
		res.reconnects += w.reconnects
		for code, n := range w.status {
			switch {
			case n == 0:
			case code == 200:
				res.allowed += n
			case code == l.denyStatus:
				res.denied += n
			default:
				res.badStatus[code] += n
			}
		}
	}
	return res, nil
}

// loop sends requests from reqs[first] on, one at a time, until the phase is
// phaseStop. Answers completed in phaseMeasure are counted.
func (w *worker) loop(l *load, first int, phase *atomic.Int32, deadline time.Time) {
	br := bufio.NewReaderSize(nil, 16<<10)
	next := first
	var c net.Conn
	for phase.Load() != phaseStop {
		if c == nil {
			var err error
			if c, err = w.dial(l.addr, phase, deadline); err != nil {
				if phase.Load() == phaseMeasure {
					w.transport++
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			br.Reset(c)
		}
		req := l.reqs[next]
		if next++; next == len(l.reqs) {
			next = 0
		}
		start := time.Now()
		status, closing, err := roundTrip(c, br, req)
		elapsed := time.Since(start)
		measured := phase.Load() == phaseMeasure
		if err != nil {
			if measured {
				w.transport++
			}
			w.drop(c)
			c = nil
			continue
		}
		if measured {
			w.status[status]++
			w.hist.record(elapsed)
		}
		if closing {
			w.reconnects++
			w.drop(c)
			c = nil
		}
	}
	if c != nil {
		w.drop(c)
	}
}

// dial connects, unless the run is stopping, and records the connection so
// that interrupt can reach it.
func (w *worker) dial(addr string, phase *atomic.Int32, deadline time.Time) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	// One deadline for the whole run: a hung server cannot hold the run
	// past its end, without a timer reset per request.
	if err := c.SetDeadline(deadline); err != nil {
		c.Close()
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if phase.Load() == phaseStop {
		c.Close()
		return nil, errors.New("stopping")
	}
	w.conn = c
	return c, nil
}

// drop closes the worker's connection.
func (w *worker) drop(c net.Conn) {
	w.mu.Lock()
	w.conn = nil
	w.mu.Unlock()
	c.Close()
}

// interrupt fails the worker's blocked read or write at once.
func (w *worker) interrupt() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		_ = w.conn.SetDeadline(time.Now())
	}
}

// sendEach sends every request once over conns connections and counts the
// answers by status; it is for filling a store, not for measuring.
func sendEach(ctx context.Context, addr string, reqs [][]byte, conns int) (map[int]int, error) {
	var next atomic.Int64
	var mu sync.Mutex
	counts := map[int]int{}
	errc := make(chan error, conns)
	for range conns {
		go func() {
			errc <- func() error {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					return fmt.Errorf("dial %s: %w", addr, err)
				}
				defer c.Close()
				br := bufio.NewReader(c)
				for ctx.Err() == nil {
					i := int(next.Add(1)) - 1
					if i >= len(reqs) {
						return nil
					}
					_ = c.SetDeadline(time.Now().Add(10 * time.Second))
					status, closing, err := roundTrip(c, br, reqs[i])
					if err != nil {
						return fmt.Errorf("request %d to %s: %w", i, addr, err)
					}
					mu.Lock()
					counts[status]++
					mu.Unlock()
					if closing {
						return fmt.Errorf("request %d to %s: the server closed the connection", i, addr)
					}
				}
				return ctx.Err()
			}()
		}()
	}
	var errs []error
	for range conns {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
	}
	return counts, errors.Join(errs...)
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drive runs n connections' loops through the warm-up and the measured
// window, calling atStart and atEnd right at the window's edges, and
// returns the window's length. loop(i, phase, deadline) is connection i's
// loop, which counts while phase is phaseMeasure and ends at phaseStop or
// the deadline; interrupt(i) cuts connection i, for a server that stopped
// answering.
func drive(ctx context.Context, warmup, duration time.Duration, n int, loop func(i int, phase *atomic.Int32, deadline time.Time), interrupt func(i int), atStart, atEnd func() error) (time.Duration, error) {
	var phase atomic.Int32
	deadline := time.Now().Add(warmup + duration + stopGrace)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(i, &phase, deadline)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	stop := func() {
		phase.Store(phaseStop)
		for i := range n {
			interrupt(i)
		}
		<-done
	}

	if err := sleepCtx(ctx, warmup); err != nil {
		stop()
		return 0, err
	}
	if err := atStart(); err != nil {
		stop()
		return 0, err
	}
	start := time.Now()
	phase.Store(phaseMeasure)
	err := sleepCtx(ctx, duration)
	phase.Store(phaseStop)
	elapsed := time.Since(start)
	if err != nil {
		stop()
		return 0, err
	}
	endErr := atEnd()
	select {
	case <-done:
	case <-time.After(stopGrace):
		stop() // a server that stopped answering: cut its connections
	}
	return elapsed, endErr
}
