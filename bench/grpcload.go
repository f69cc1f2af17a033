package main

// This file is the gRPC load generator: closed-loop unary calls, one
// goroutine per gRPC client connection (its own TCP connection and HTTP/2
// session) with one call in flight, so that N connections are N concurrent
// streams over N connections, as the HTTP load generator keeps one request
// in flight on each of its N connections. Requests are prebuilt; each
// worker reuses one reply message.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
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
	allowed, denied uint64
	failed          map[string]uint64 // errors and other answers, by kind
	hist            histogram
}

// count records one answer completed in the measured window.
func (w *grpcWorker) count(r *rpc, reply proto.Message, err error, elapsed time.Duration) {
	kind := ""
	switch v, k := classifyCall(r, reply, err); v {
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
	// Like the HTTP load, which times every response whatever its status:
	// every answer is timed, failed calls are not.
	if err == nil {
		w.hist.record(elapsed)
	}
}

// classifyCall is the verdict of one call: its error's gRPC code, or the
// rpc's reading of its reply.
func classifyCall(r *rpc, reply proto.Message, err error) (verdict, string) {
	if err != nil {
		return verdictOther, "gRPC " + status.Code(err).String()
	}
	v, kind := r.classify(reply)
	if v == verdictOther && kind == "" {
		kind = "unexpected answer"
	}
	return v, kind
}

// dialGRPC opens a client connection to a loopback address, in plaintext,
// without name resolution.
func dialGRPC(addr string) (*grpc.ClientConn, error) {
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("gRPC client for %s: %w", addr, err)
	}
	return cc, nil
}

// run drives the load like load.run: warm-up, then the measured window,
// calling atStart and atEnd right at its edges.
func (l *grpcLoad) run(ctx context.Context, atStart, atEnd func() error) (*loadResult, error) {
	conns := make([]*grpc.ClientConn, l.conns)
	defer func() {
		for _, cc := range conns {
			if cc != nil {
				cc.Close()
			}
		}
	}()
	for i := range conns {
		cc, err := dialGRPC(l.addr)
		if err != nil {
			return nil, err
		}
		cc.Connect()
		conns[i] = cc
	}
	// One deadline for the whole run, as the HTTP load has: a hung server
	// cannot hold the run past its end.
	callCtx, cancel := context.WithDeadline(ctx, time.Now().Add(l.warmup+l.duration+stopGrace))
	defer cancel()
	var phase atomic.Int32
	workers := make([]*grpcWorker, l.conns)
	var wg sync.WaitGroup
	for i := range workers {
		w := &grpcWorker{}
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(callCtx, conns[i], l.rpc, i*len(l.rpc.reqs)/l.conns, &phase)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	stop := func() {
		phase.Store(phaseStop)
		cancel()
		<-done
	}

	if err := sleepCtx(ctx, l.warmup); err != nil {
		stop()
		return nil, err
	}
	if err := atStart(); err != nil {
		stop()
		return nil, err
	}
	start := time.Now()
	phase.Store(phaseMeasure)
	err := sleepCtx(ctx, l.duration)
	phase.Store(phaseStop)
	elapsed := time.Since(start)
	if err != nil {
		stop()
		return nil, err
	}
	endErr := atEnd()
	select {
	case <-done:
	case <-time.After(stopGrace):
		stop() // a server that stopped answering: cancel its calls
	}
	if endErr != nil {
		return nil, endErr
	}
	return mergeGRPC(elapsed, workers), nil
}

// mergeGRPC sums the workers' counts into one result.
func mergeGRPC(elapsed time.Duration, workers []*grpcWorker) *loadResult {
	res := &loadResult{elapsed: elapsed, badStatus: map[int]uint64{}}
	for _, w := range workers {
		res.allowed += w.allowed
		res.denied += w.denied
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

// loop calls with reqs[first] on, one call at a time, until the phase is
// phaseStop. Answers completed in phaseMeasure are counted.
func (w *grpcWorker) loop(ctx context.Context, cc *grpc.ClientConn, r *rpc, first int, phase *atomic.Int32) {
	reply := r.newReply()
	next := first
	for phase.Load() != phaseStop {
		req := r.reqs[next]
		if next++; next == len(r.reqs) {
			next = 0
		}
		proto.Reset(reply)
		start := time.Now()
		err := cc.Invoke(ctx, r.method, req, reply)
		elapsed := time.Since(start)
		if phase.Load() == phaseMeasure {
			w.count(r, reply, err, elapsed)
		}
		// A connection that is down fails every call at once: do not
		// spin on it.
		if status.Code(err) == codes.Unavailable {
			_ = sleepCtx(ctx, 10*time.Millisecond)
		}
	}
}

// waitGRPC is a readiness check: the probe request gets a decision.
func waitGRPC(addr string, r *rpc) func() error {
	return func() error {
		cc, err := dialGRPC(addr)
		if err != nil {
			return err
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		reply := r.newReply()
		err = cc.Invoke(ctx, r.method, r.probe, reply)
		if v, kind := classifyCall(r, reply, err); v == verdictOther {
			return fmt.Errorf("%s on %s: %s", r.method, addr, kind)
		}
		return nil
	}
}
