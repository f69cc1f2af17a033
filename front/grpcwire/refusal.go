package grpcwire

import (
	"context"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/status"
)

// A request that is not a gRPC call (a content-type other than
// application/grpc: a browser, curl, a health checker, h2spec) is
// refused, and its stream lives as RFC 9113 says a stream lives: it is
// open until the client's side ends (its body is read, flow-controlled,
// and discarded), it counts against MaxConcurrentStreams, and it is
// answered then, with an HTTP status and a body in DATA that the
// client's windows pace. Each such stream holds streamCost of
// Options.Budget until it is answered, and is reset when it outlives
// RequestTimeout as a call is. Its discarded body holds no memory; the
// stream's window is never returned, so a client sends at most
// streamWindow of it before the stream stalls and is reset.
//
// A gRPC call refused for what its headers say (method, path, timeout,
// encoding) is answered at once with a trailers-only response and a
// reset of the client's side, as grpc-go answers it: a gRPC client reads
// its status from the trailers, and has no use for a stream kept open.

// maxQuoted is the most of a request's content-type its refusal quotes.
const maxQuoted = 64

// refusal is a refused request's answer.
type refusal struct {
	header []byte // the response's header block
	body   []byte // its body; nil: none (HEAD)
}

// newRefusal is the answer to a request that is not a gRPC call: HTTP
// status httpStatus with st's grpc-status and grpc-message, and st's
// message as a plain-text body, none when head (a HEAD request's answer
// has no body).
func newRefusal(st *status.Status, httpStatus int, head bool) *refusal {
	b := appendStatusField(nil, httpStatus)
	b = appendLiteral(b, "content-type", "text/plain; charset=utf-8")
	b = appendStatus(b, st, false, httpStatus)
	r := &refusal{header: b}
	if !head {
		r.body = append([]byte(st.Message()), '\n')
	}
	return r
}

// endStream ends the client's side of s (on the reader): a request
// whose body is not as long as its content-length said is malformed
// (RFC 9113, section 8.1.1), a stream error; a refused one is answered,
// and a call's handler starts.
func (c *conn) endStream(s *stream) error {
	if s.rd.declared >= 0 && s.rd.body != s.rd.declared {
		c.resetStream(s.id, http2.ErrCodeProtocol)
		return nil
	}
	if s.refusal != nil {
		c.answerRefusal(s)
		return nil
	}
	return c.endRequest(s)
}

// answerRefusal answers a refused request whose client's side ended (on
// the reader): its headers now, its body as the windows allow, the last
// DATA frame ending the stream.
func (c *conn) answerRefusal(s *stream) {
	s.rd.ended = true
	c.freeReq(s)
	r := s.refusal
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.sh.reset || c.sh.closed {
		return
	}
	s.ctx.endLocked(context.Canceled)
	c.sh.wbuf = appendHeaderBlock(c.sh.wbuf, s.id, r.header, len(r.body) == 0, c.sh.maxFrame)
	s.sh.headersSent = true
	if len(r.body) == 0 {
		delete(c.sh.streams, s.id)
		c.finishLocked(s)
	} else {
		out := getBuf()
		*out = append((*out)[:0], r.body...)
		s.sh.endData = true
		c.queueLocked(s, out)
	}
	// Counted as a control frame: a client that sends requests without
	// reading their answers is cut off as one that sends PINGs is.
	_ = c.controlLocked()
}
