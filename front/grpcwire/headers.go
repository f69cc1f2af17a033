package grpcwire

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// reqHeaders is what a request's header block says.
type reqHeaders struct {
	method, path, contentType, timeout, encoding string
	authority, host, scheme                      int
	size                                         int
	malformed                                    bool // pseudo-header misplaced, unknown, repeated or empty; connection-specific field; upper-case name
	regular                                      bool // a regular field came
	isGRPC                                       bool
	badTimeout                                   error
	// length is content-length's value, if hasLength; a value that is
	// not a number, or a second that differs, makes the request
	// malformed.
	length    int64
	hasLength bool
}

// checkBlock bounds a header block: compressed, it may not be larger
// than twice the header list it may decode to.
func (c *conn) checkBlock() error {
	if len(c.rd.block) > 2*int(c.srv.opts.MaxHeaderListSize) {
		return connError{http2.ErrCodeEnhanceYourCalm, "header block too large"}
	}
	return nil
}

// headers handles a complete header block (on the reader).
func (c *conn) headers() error {
	if err := c.checkBlock(); err != nil {
		return err
	}
	rd := &c.rd
	id := rd.blockID
	if len(rd.last) == 0 || !bytes.Equal(rd.block, rd.last) {
		rd.hdr = reqHeaders{}
		if _, err := rd.dec.Write(rd.block); err != nil {
			return connError{http2.ErrCodeCompression, "header block: " + err.Error()}
		}
		if err := rd.dec.Close(); err != nil {
			return connError{http2.ErrCodeCompression, "header block: " + err.Error()}
		}
		rd.last = rd.last[:0]
		if len(rd.block) <= maxKeptBlock && standalone(rd.block) {
			rd.last, rd.lastHdr = append(rd.last, rd.block...), rd.hdr
		}
	} else {
		rd.hdr = rd.lastHdr
	}
	c.dropBlock()
	c.mu.Lock()
	if s := c.sh.streams[id]; s != nil {
		// Trailers from the client: they must end the stream.
		c.mu.Unlock()
		if !rd.blockEnd || s.rd.ended {
			c.resetStream(id, http2.ErrCodeProtocol)
			return nil
		}
		return c.endStream(s)
	}
	if id <= c.sh.maxStream {
		c.mu.Unlock()
		return connError{http2.ErrCodeStreamClosed, "HEADERS on a closed stream"}
	}
	c.sh.maxStream = id
	if c.sh.goingAway && id > c.sh.lastStream {
		// Sent after GOAWAY: ignored (section 6.8).
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	rd.opened++
	h := &rd.hdr
	switch {
	case h.size > int(c.srv.opts.MaxHeaderListSize):
		c.abort(id, status.New(codes.Internal, "header list larger than SETTINGS_MAX_HEADER_LIST_SIZE"), 431)
		return nil
	case h.authority > 1 || h.host > 1:
		c.abort(id, status.New(codes.Internal, "more than one :authority or host"), 400)
		return nil
	case h.malformed || h.method == "" || h.path == "" || h.scheme == 0 || rd.blockDep,
		rd.blockEnd && h.hasLength && h.length != 0:
		// A request without :method, :scheme or :path is malformed
		// (RFC 9113, section 8.3.1), and so is one whose content-length
		// is not the length of its DATA, none here (section 8.1.1); a
		// stream may not depend on itself (section 5.3.1).
		c.resetStream(id, http2.ErrCodeProtocol)
		return nil
	}
	c.mu.Lock()
	full := c.sh.active >= int(c.srv.opts.MaxConcurrentStreams)
	c.mu.Unlock()
	if full {
		// Section 5.1.2: a stream beyond the limit is a stream error.
		c.resetStream(id, http2.ErrCodeRefusedStream)
		return nil
	}
	if !h.isGRPC {
		ct := h.contentType
		if len(ct) > maxQuoted {
			// The answer may wait for the client's window: it holds
			// little of what the client sent.
			ct = ct[:maxQuoted]
		}
		return c.open(id, nil, newRefusal(status.Newf(codes.InvalidArgument, "invalid gRPC request content-type %q", ct), 415, h.method == "HEAD"), 0)
	}
	switch {
	case h.badTimeout != nil:
		c.abort(id, status.Newf(codes.Internal, "malformed grpc-timeout: %v", h.badTimeout), 400)
		return nil
	case h.authority == 0 && h.host == 0:
		c.abort(id, status.New(codes.Internal, "no host or :authority header present"), 400)
		return nil
	case h.method != "POST":
		c.abort(id, status.Newf(codes.Internal, "http2Server.operateHeaders parsed a :method field: %v which should be POST", h.method), 405)
		return nil
	}
	m := c.srv.methods[h.path]
	if m == nil {
		c.abort(id, unknownMethod(c.srv, h.path), 200)
		return nil
	}
	if h.encoding != "" && h.encoding != "identity" {
		c.abort(id, status.Newf(codes.Unimplemented, "grpc: Decompressor is not installed for grpc-encoding %q", h.encoding), 200)
		return nil
	}
	var timeout time.Duration
	if h.timeout != "" {
		timeout, _ = parseTimeout(h.timeout)
		if timeout <= 0 {
			c.abort(id, status.New(codes.DeadlineExceeded, context.DeadlineExceeded.Error()), 200)
			return nil
		}
	}
	return c.open(id, m, nil, timeout)
}

// open opens stream id for a call of m, or for a request refused, and
// counts it against MaxConcurrentStreams until it is answered; timeout
// is the call's grpc-timeout, if not 0 (on the reader).
func (c *conn) open(id uint32, m *method, r *refusal, timeout time.Duration) error {
	rd := &c.rd
	if !c.hold.Take(streamCost) {
		c.abort(id, errBudget, 200)
		return nil
	}
	s := &stream{id: id, m: m, refusal: r, charged: streamCost}
	s.rd.openTick = rd.tick
	s.rd.declared = -1
	if rd.hdr.hasLength {
		s.rd.declared = rd.hdr.length
	}
	s.sh.counted = true
	s.ctx.c = c
	if timeout != 0 {
		s.ctx.deadline = time.Now().Add(timeout)
	}
	c.mu.Lock()
	if c.sh.closed {
		s.ctx.endLocked(context.Canceled)
	}
	s.sh.sendWindow = c.sh.peerWindow
	c.sh.streams[id] = s
	c.sh.active++
	c.mu.Unlock()
	if rd.blockEnd {
		return c.endStream(s)
	}
	return nil
}

// abort answers a stream at once with a trailers-only response and, when
// the client's side is still open, resets it (NO_ERROR): the server needs
// nothing more (on the reader).
func (c *conn) abort(id uint32, st *status.Status, httpStatus int) {
	c.mu.Lock()
	c.sh.wbuf = appendHeaderBlock(c.sh.wbuf, id, appendStatus(nil, st, true, httpStatus), true, c.sh.maxFrame)
	if !c.rd.blockEnd {
		c.sh.wbuf = appendFrameHeader(c.sh.wbuf, 4, frameRSTStream, 0, id)
		c.sh.wbuf = appendUint32(c.sh.wbuf, uint32(http2.ErrCodeNo))
	}
	_ = c.controlLocked()
	c.mu.Unlock()
}

// unknownMethod is the status of a call to no registered method, as
// grpc-go words it.
func unknownMethod(srv *Server, path string) *status.Status {
	svc, name, ok := splitMethod(path)
	if !ok {
		return status.Newf(codes.Unimplemented, "malformed method name: %q", path)
	}
	if srv.services[svc] {
		return status.Newf(codes.Unimplemented, "unknown method %v for service %v", name, svc)
	}
	return status.Newf(codes.Unimplemented, "unknown service %v", svc)
}

// field takes one decoded header field (on the reader: hpack's decoder
// calls it).
func (c *conn) field(f hpack.HeaderField) {
	h := &c.rd.hdr
	h.size += len(f.Name) + len(f.Value) + 32
	if h.size > int(c.srv.opts.MaxHeaderListSize) {
		return
	}
	if strings.HasPrefix(f.Name, ":") {
		if h.regular {
			h.malformed = true
			return
		}
		var p *string
		switch f.Name {
		case ":method":
			p = &h.method
		case ":path":
			p = &h.path
		case ":authority":
			h.authority++
			return
		case ":scheme":
			h.scheme++
			if h.scheme > 1 || f.Value == "" {
				h.malformed = true
			}
			return
		default:
			h.malformed = true
			return
		}
		if *p != "" || f.Value == "" {
			h.malformed = true
		}
		*p = f.Value
		return
	}
	h.regular = true
	switch f.Name {
	case "content-type":
		h.contentType = f.Value
		h.isGRPC = isGRPCContentType(f.Value)
	case "grpc-timeout":
		h.timeout = f.Value
		if _, err := parseTimeout(f.Value); err != nil {
			h.badTimeout = err
		}
	case "grpc-encoding":
		h.encoding = f.Value
	case "host":
		h.host++
	case "content-length":
		n, err := strconv.ParseInt(f.Value, 10, 64)
		if err != nil || n < 0 || f.Value[0] == '+' || h.hasLength && n != h.length {
			h.malformed = true
		}
		h.length, h.hasLength = n, true
	case "te":
		if f.Value != "trailers" {
			h.malformed = true
		}
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
		h.malformed = true
	default:
		for i := 0; i < len(f.Name); i++ {
			if 'A' <= f.Name[i] && f.Name[i] <= 'Z' {
				h.malformed = true
			}
		}
	}
}

// isGRPCContentType reports whether v is application/grpc, alone or with a
// subtype ("+proto") or parameters.
func isGRPCContentType(v string) bool {
	rest, ok := strings.CutPrefix(v, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}
