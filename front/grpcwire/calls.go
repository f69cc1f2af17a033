package grpcwire

import (
	"context"
	"fmt"
	"sync/atomic"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A call's life: headers opens its stream; data gathers its request;
// endRequest, once the client's side ends, starts its handler (startAsync
// on the reader, or run on a worker); answer and respond queue its answer
// and write it (write.go). answerEarly answers a request refused before
// its handler runs; a reset drops the stream (frames.go).

// maxPendingStream is how much of a server-streaming call's messages may
// wait for the client's window before the call ends.
const maxPendingStream = 1 << 20

// answerEarly answers a stream whose request is refused, before its
// handler runs (on the reader).
func (c *conn) answerEarly(s *stream, st *status.Status, ended bool) {
	s.rd.ended = true
	c.freeReq(s)
	c.mu.Lock()
	s.ctx.endLocked(context.Canceled)
	delete(c.sh.streams, s.id)
	c.sh.wbuf = appendHeaderBlock(c.sh.wbuf, s.id, appendStatus(nil, st, true, 200), true, c.sh.maxFrame)
	if !ended {
		c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 4, frameRSTStream, 0, s.id)
		c.sh.wbuf = appendUint32(c.sh.wbuf, uint32(http2.ErrCodeNo))
	}
	c.finishLocked(s)
	_ = c.controlLocked()
	c.mu.Unlock()
}

// endRequest starts the handler of a request the client ended (on the
// reader): from here the request's bytes are the handler's.
func (c *conn) endRequest(s *stream) error {
	s.rd.ended = true
	b := reqBytes(s)
	c.release(len(b))
	var st *status.Status
	switch {
	case len(b) == 0:
		st = status.New(codes.Internal, "cardinality violation: received no request message from non-client-streaming RPC")
	case len(b) < 5 || len(b) < 5+(int(b[1])<<24|int(b[2])<<16|int(b[3])<<8|int(b[4])):
		st = status.New(codes.Internal, "grpc: the request ended within a message")
	case b[0] == 1:
		// A grpc-encoding other than identity was refused at once.
		st = status.New(codes.Internal, "grpc: compressed flag set with identity or empty encoding")
	case b[0] > 1:
		st = status.Newf(codes.Internal, "grpc: received unexpected payload format %d", b[0])
	}
	if st != nil {
		c.answerEarly(s, st, true)
		return nil
	}
	c.mu.Lock()
	if s.sh.reset {
		c.mu.Unlock()
		c.freeReq(s)
		return nil
	}
	s.sh.handling = true
	c.mu.Unlock()
	if s.m.async != nil && c.startAsync(s) {
		return nil
	}
	c.srv.start(c, s)
	return nil
}

// Reply answers a call taken by an asynchronous handler (UnaryRawAsync).
type Reply struct {
	c    *conn
	s    *stream
	out  *[]byte
	sent atomic.Bool
}

// Send answers the call: out, the response message appended to the out
// start was given, and OK; or err's status, as a unary handler's error.
// Only the first Send of a call counts. The request's bytes are not
// valid once it is called.
func (r *Reply) Send(out []byte, err error) {
	if !r.sent.CompareAndSwap(false, true) {
		return
	}
	*r.out = out
	r.c.answer(r.s, r.out, err)
}

// startAsync runs a call's asynchronous start on the reader, and reports
// whether it took the call.
func (c *conn) startAsync(s *stream) (taken bool) {
	out := getBuf()
	s.reply.c, s.reply.s, s.reply.out = c, s, out
	defer func() {
		if p := recover(); p != nil {
			c.srv.opts.Log.Error("grpc handler panicked", "stream", s.id, "panic", fmt.Sprint(p))
			s.reply.Send(nil, status.Error(codes.Internal, "the handler failed"))
			taken = true
		}
	}()
	s.async = true
	if s.m.async(&s.ctx, (*s.req)[5:], append((*out)[:0], 0, 0, 0, 0, 0), &s.reply) {
		return true
	}
	s.async = false
	s.reply = Reply{}
	putBuf(out)
	return false
}

// run runs a call's handler and writes its answer (on a worker).
func (c *conn) run(s *stream) {
	req := (*s.req)[5:]
	out := getBuf()
	defer func() {
		if p := recover(); p != nil {
			c.srv.opts.Log.Error("grpc handler panicked", "stream", s.id, "panic", fmt.Sprint(p))
			c.respond(s, out, status.New(codes.Internal, "the handler failed"))
		}
	}()
	if s.m.stream != nil {
		c.respond(s, out, errStatus(s.m.stream(&s.ctx, req, func(m proto.Message) error { return c.send(s, m) })))
		return
	}
	b := append((*out)[:0], 0, 0, 0, 0, 0)
	b, err := s.m.unary(&s.ctx, req, b)
	*out = b
	c.answer(s, out, err)
}

// answer writes a unary call's answer: the message in out (after its 5
// bytes of gRPC framing), or err's status.
func (c *conn) answer(s *stream, out *[]byte, err error) {
	switch {
	case err != nil:
		c.respond(s, out, errStatus(err))
	case !s.ctx.deadline.IsZero() && s.ctx.Err() == context.DeadlineExceeded:
		c.respond(s, out, status.New(codes.DeadlineExceeded, context.DeadlineExceeded.Error()))
	default:
		b := *out
		size := len(b) - 5
		b[1], b[2], b[3], b[4] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
		c.respond(s, out, nil)
	}
}

// send sends one message of a server-streaming call.
func (c *conn) send(s *stream, m proto.Message) error {
	out := getBuf()
	b, err := proto.MarshalOptions{}.MarshalAppend(append((*out)[:0], 0, 0, 0, 0, 0), m)
	if err != nil {
		putBuf(out)
		return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	size := len(b) - 5
	b[1], b[2], b[3], b[4] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	*out = b
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.sh.reset || c.sh.closed {
		putBuf(out)
		return status.FromContextError(context.Canceled).Err()
	}
	if s.sh.out != nil && len(*s.sh.out)-s.sh.outOff > maxPendingStream {
		putBuf(out)
		return status.Error(codes.ResourceExhausted, "the client reads no messages")
	}
	if !s.sh.headersSent {
		s.sh.headersSent = true
		c.sh.wbuf = appendHeaderBlock(c.sh.wbuf, s.id, responseHeaders, false, c.sh.maxFrame)
	}
	c.queueLocked(s, out)
	c.flushLocked()
	return nil
}

// errStatus is the status of a handler's error.
func errStatus(err error) *status.Status {
	if err == nil {
		return status.New(codes.OK, "")
	}
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// respond writes a call's answer: out's message then OK, or st.
func (c *conn) respond(s *stream, out *[]byte, st *status.Status) {
	c.freeReq(s)
	c.mu.Lock()
	c.respondLocked(s, out, st)
	c.flushFor(s)
	c.mu.Unlock()
}

// respondLocked queues a call's answer.
func (c *conn) respondLocked(s *stream, out *[]byte, st *status.Status) {
	s.sh.handling = false
	// The call has ended: so has its context, as grpc-go ends it.
	s.ctx.endLocked(context.Canceled)
	if s.sh.reset || c.sh.closed {
		putBuf(out)
		c.finishLocked(s)
		return
	}
	c.sh.answered = true
	if st != nil {
		// An error, or the end of a server-streaming call.
		putBuf(out)
		s.sh.trailers = appendStatus(nil, st, !s.sh.headersSent, 200)
		if s.sh.out == nil {
			c.sh.wbuf = appendHeaderBlock(c.sh.wbuf, s.id, s.sh.trailers, true, c.sh.maxFrame)
			s.sh.trailers = nil
			delete(c.sh.streams, s.id)
			c.finishLocked(s)
		} else {
			c.pushLocked(s)
		}
		return
	}
	if !s.sh.headersSent {
		s.sh.headersSent = true
		c.sh.wbuf = appendHeaderBlock(c.sh.wbuf, s.id, responseHeaders, false, c.sh.maxFrame)
	}
	b := *out
	if s.sh.out == nil && len(b) <= c.sh.maxFrame && int64(len(b)) <= c.sh.sendWindow && int64(len(b)) <= s.sh.sendWindow {
		// The common case: the message fits in one frame and the windows.
		c.sh.wbuf = appendFrameHeader(c.sh.wbuf, len(b), frameData, 0, s.id)
		c.sh.wbuf = append(c.sh.wbuf, b...)
		c.sh.sendWindow -= int64(len(b))
		s.sh.sendWindow -= int64(len(b))
		putBuf(out)
		c.sh.wbuf = appendHeaderBlock(c.sh.wbuf, s.id, okTrailers, true, c.sh.maxFrame)
		delete(c.sh.streams, s.id)
		c.finishLocked(s)
		return
	}
	s.sh.trailers = okTrailers
	c.queueLocked(s, out)
}
