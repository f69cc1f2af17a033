package main

// This file is the gRPC load generator: closed-loop unary calls, one
// goroutine per connection (its own TCP connection and HTTP/2 session, as
// each gRPC client connection has) with one call in flight, so that N
// connections are N concurrent streams over N connections, as the HTTP load
// generator keeps one request in flight on each of its N connections.
// Calls are prebuilt HTTP/2 frames (grpcwire.go); each worker reuses one
// reply message.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// verdict is what one answer means to the load: a decision either way, or
// something else.
type verdict int

const (
	verdictAllowed verdict = iota
	verdictDenied
	verdictOther
)

// rpc is one gRPC method and its prebuilt requests.
type rpc struct {
	method   string          // full method name, /package.Service/Method
	reqs     []proto.Message // cycled through
	probe    proto.Message   // a request outside the workload's clients, for readiness
	newReply func() proto.Message
	// classify reads a reply; for verdictOther it names the kind of answer
	// for the results' notes.
	classify func(reply proto.Message) (verdict, string)
	// read is classify from the reply's bytes, reading only the fields
	// that decide and allocating nothing, as the HTTP load reads only a
	// response's status line and framing: decoding every answer whole
	// would cost the shared cores more than the server's own answer does.
	read func(msg []byte) (verdict, string)
}

// grpcLoad is one run of the gRPC load generator against one address.
type grpcLoad struct {
	addr     string
	rpc      *rpc
	conns    int
	warmup   time.Duration
	duration time.Duration
}

// grpcWorker is one connection's goroutine and its counts, its own until
// the run ends.
type grpcWorker struct {
	mu                    sync.Mutex
	conn                  net.Conn // guarded by mu, for interrupt
	allowed, denied       uint64
	transport, reconnects uint64
	failed                map[string]uint64 // gRPC errors and other answers, by kind
	hist                  histogram
}

// count records one answer completed in the measured window: a reply, or
// a gRPC status other than OK. A call that got no answer is no answer.
func (w *grpcWorker) count(r *rpc, msg []byte, err error, elapsed time.Duration) {
	kind := ""
	switch v, k := readCall(r, msg, err); v {
	case verdictAllowed:
		w.allowed++
	case verdictDenied:
		w.denied++
	default:
		kind = k
	}
	if kind != "" {
		if w.failed == nil {
			w.failed = map[string]uint64{}
		}
		w.failed[kind]++
	}
	// Every answer is timed, whatever it says, as the HTTP load times
	// every response whatever its status.
	w.hist.record(elapsed)
}

// classifyCall is the verdict of one call: its error's gRPC code, or the
// rpc's reading of its reply.
func classifyCall(r *rpc, reply proto.Message, err error) (verdict, string) {
	if err != nil {
		return callFailed(err)
	}
	return named(r.classify(reply))
}

// readCall is classifyCall from the reply's bytes.
func readCall(r *rpc, msg []byte, err error) (verdict, string) {
	if err != nil {
		return callFailed(err)
	}
	return named(r.read(msg))
}

// callFailed is the verdict of a call answered with a gRPC status.
func callFailed(err error) (verdict, string) {
	return verdictOther, "gRPC " + status.Code(err).String()
}

// named gives an answer that is neither a decision nor named a kind.
func named(v verdict, kind string) (verdict, string) {
	if v == verdictOther && kind == "" {
		kind = "unexpected answer"
	}
	return v, kind
}

// run drives the load like load.run: warm-up, then the measured window,
// calling atStart and atEnd right at its edges.
func (l *grpcLoad) run(ctx context.Context, atStart, atEnd func() error) (*loadResult, error) {
	calls, err := l.rpc.wire(l.addr)
	if err != nil {
		return nil, err
	}
	workers := make([]*grpcWorker, l.conns)
	for i := range workers {
		workers[i] = &grpcWorker{}
	}
	elapsed, err := drive(ctx, l.warmup, l.duration, len(workers),
		func(i int, phase *atomic.Int32, deadline time.Time) {
			workers[i].loop(l.addr, l.rpc, calls, i*len(calls)/l.conns, phase, deadline)
		},
		func(i int) { workers[i].interrupt() },
		atStart, atEnd)
	if err != nil {
		return nil, err
	}
	return mergeGRPC(elapsed, workers), nil
}

// mergeGRPC sums the workers' counts into one result.
func mergeGRPC(elapsed time.Duration, workers []*grpcWorker) *loadResult {
	res := &loadResult{elapsed: elapsed, badStatus: map[int]uint64{}}
	for _, w := range workers {
		res.allowed += w.allowed
		res.denied += w.denied
		res.transport += w.transport
		res.reconnects += w.reconnects
		res.hist.merge(&w.hist)
		for k, n := range w.failed {
			if res.failed == nil {
				res.failed = map[string]uint64{}
			}
			res.failed[k] += n
		}
	}
	return res
}

// loop makes calls[first] on, one call at a time, until the phase is
// phaseStop. Answers completed in phaseMeasure are counted.
func (w *grpcWorker) loop(addr string, r *rpc, calls []*wireCall, first int, phase *atomic.Int32, deadline time.Time) {
	next := first
	var c *wireConn
	for phase.Load() != phaseStop {
		if c == nil {
			var err error
			if c, err = w.dial(addr, phase, deadline); err != nil {
				if phase.Load() == phaseMeasure {
					w.transport++
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
		}
		call := calls[next]
		if next++; next == len(calls) {
			next = 0
		}
		start := time.Now()
		msg, err := c.exchange(call)
		elapsed := time.Since(start)
		measured := phase.Load() == phaseMeasure
		if _, isStatus := status.FromError(err); err != nil && !isStatus {
			switch {
			case errors.Is(err, errGoAway):
				// Not processed: not an answer, and no error.
				w.reconnects++
			case measured:
				w.transport++
			}
			w.drop(c)
			c = nil
			continue
		}
		if measured {
			w.count(r, msg, err, elapsed)
		}
		if c.goingAway {
			w.reconnects++
			w.drop(c)
			c = nil
		}
	}
	if c != nil {
		w.drop(c)
	}
}

// dial connects and starts HTTP/2, unless the run is stopping, and records
// the connection so that interrupt can reach it.
func (w *grpcWorker) dial(addr string, phase *atomic.Int32, deadline time.Time) (*wireConn, error) {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	// One deadline for the whole run, as the HTTP load has: a hung server
	// cannot hold the run past its end.
	if err := nc.SetDeadline(deadline); err != nil {
		nc.Close()
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if phase.Load() == phaseStop {
		nc.Close()
		return nil, errors.New("stopping")
	}
	c, err := newWireConn(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	w.conn = nc
	return c, nil
}

// drop closes the worker's connection.
func (w *grpcWorker) drop(c *wireConn) {
	w.mu.Lock()
	w.conn = nil
	w.mu.Unlock()
	c.conn.Close()
}

// interrupt fails the worker's blocked read or write at once.
func (w *grpcWorker) interrupt() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		_ = w.conn.SetDeadline(time.Now())
	}
}

// wire prebuilds the rpc's calls for a server at addr.
func (r *rpc) wire(addr string) ([]*wireCall, error) {
	calls := make([]*wireCall, len(r.reqs))
	for i, req := range r.reqs {
		var err error
		if calls[i], err = buildWireCall(addr, r.method, req); err != nil {
			return nil, err
		}
	}
	return calls, nil
}

// waitGRPC is a readiness check: the probe request gets a decision.
func waitGRPC(addr string, r *rpc) func() error {
	return func() error {
		call, err := buildWireCall(addr, r.method, r.probe)
		if err != nil {
			return err
		}
		nc, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer nc.Close()
		if err := nc.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
			return err
		}
		c, err := newWireConn(nc)
		if err != nil {
			return err
		}
		reply := r.newReply()
		err = c.call(call, reply)
		if _, isStatus := status.FromError(err); err != nil && !isStatus {
			return fmt.Errorf("%s on %s: %w", r.method, addr, err)
		}
		if v, kind := classifyCall(r, reply, err); v == verdictOther {
			return fmt.Errorf("%s on %s: %s", r.method, addr, kind)
		}
		return nil
	}
}
