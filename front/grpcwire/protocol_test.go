package grpcwire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestRawGRPCSemantics: each malformed or refused call gets grpc-go's
// answer.
func TestRawGRPCSemantics(t *testing.T) {
	_, _, _, addr := testServer(t, Options{MaxRecvMsgSize: 1000, MaxHeaderListSize: 4096})
	hello := func(t *testing.T) []byte { return message(t, &wrapperspb.BytesValue{Value: []byte("hello")}) }
	for _, tc := range []struct {
		name    string
		headers []string
		body    func(t *testing.T) []byte
		end     bool // HEADERS ends the stream
		// want: an HTTP status and grpc-status, or a reset code.
		httpStatus, grpcStatus string
		message                string
		rst                    http2.ErrCode
		reset                  bool
	}{
		{name: "ok without te", headers: []string{":method", "POST", ":scheme", "http", ":path", echoPath, ":authority", "a", "content-type", "application/grpc+proto"}, body: hello, httpStatus: "200", grpcStatus: "0"},
		{name: "GET", headers: []string{":method", "GET", ":scheme", "http", ":path", echoPath, ":authority", "a", "content-type", "application/grpc"}, body: hello, httpStatus: "405", grpcStatus: code(codes.Internal)},
		{name: "not gRPC", headers: []string{":method", "POST", ":scheme", "http", ":path", echoPath, ":authority", "a", "content-type", "application/json"}, body: hello, httpStatus: "415", grpcStatus: code(codes.InvalidArgument), message: `invalid gRPC request content-type "application/json"`},
		{name: "no content type", headers: []string{":method", "POST", ":scheme", "http", ":path", echoPath, ":authority", "a"}, body: hello, httpStatus: "415", grpcStatus: code(codes.InvalidArgument)},
		{name: "grpcx is not grpc", headers: []string{":method", "POST", ":scheme", "http", ":path", echoPath, ":authority", "a", "content-type", "application/grpcx"}, body: hello, httpStatus: "415", grpcStatus: code(codes.InvalidArgument)},
		{name: "malformed timeout", headers: grpcHeaders(echoPath, "grpc-timeout", "soon"), body: hello, httpStatus: "400", grpcStatus: code(codes.Internal)},
		{name: "timeout too long", headers: grpcHeaders(echoPath, "grpc-timeout", "1234567890S"), body: hello, httpStatus: "400", grpcStatus: code(codes.Internal)},
		{name: "zero timeout", headers: grpcHeaders(echoPath, "grpc-timeout", "0m"), body: hello, httpStatus: "200", grpcStatus: code(codes.DeadlineExceeded)},
		{name: "timeout in hours", headers: grpcHeaders(echoPath, "grpc-timeout", "99999999H"), body: hello, httpStatus: "200", grpcStatus: "0"},
		{name: "no authority", headers: []string{":method", "POST", ":scheme", "http", ":path", echoPath, "content-type", "application/grpc"}, body: hello, httpStatus: "400", grpcStatus: code(codes.Internal)},
		{name: "host for authority", headers: []string{":method", "POST", ":scheme", "http", ":path", echoPath, "content-type", "application/grpc", "host", "a"}, body: hello, httpStatus: "200", grpcStatus: "0"},
		{name: "two authorities", headers: grpcHeaders(echoPath, ":authority", "b"), body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "connection header", headers: grpcHeaders(echoPath, "connection", "keep-alive"), body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "te not trailers", headers: []string{":method", "POST", ":scheme", "http", ":path", echoPath, ":authority", "a", "content-type", "application/grpc", "te", "gzip"}, body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "no :method", headers: []string{":scheme", "http", ":path", echoPath, ":authority", "a", "content-type", "application/grpc"}, body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "no :scheme", headers: []string{":method", "POST", ":path", echoPath, ":authority", "a", "content-type", "application/grpc"}, body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "no :path", headers: []string{":method", "POST", ":scheme", "http", ":authority", "a", "content-type", "application/grpc"}, body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "empty :path", headers: []string{":method", "POST", ":scheme", "http", ":path", "", ":authority", "a", "content-type", "application/grpc"}, body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "two :scheme", headers: []string{":method", "POST", ":scheme", "http", ":scheme", "http", ":path", echoPath, ":authority", "a", "content-type", "application/grpc"}, body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "pseudo after regular", headers: []string{":method", "POST", "content-type", "application/grpc", ":path", echoPath, ":authority", "a"}, body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "unknown pseudo", headers: grpcHeaders(echoPath)[:0:0], body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "upper case", headers: grpcHeaders(echoPath, "X-Big", "1"), body: hello, reset: true, rst: http2.ErrCodeProtocol},
		{name: "headers too large", headers: grpcHeaders(echoPath, "x-big", strings.Repeat("b", 5000)), body: hello, httpStatus: "431", grpcStatus: code(codes.Internal)},
		{name: "malformed method", headers: grpcHeaders("nope"), body: hello, httpStatus: "200", grpcStatus: code(codes.Unimplemented), message: `malformed method name: "nope"`},
		{name: "gzip", headers: grpcHeaders(echoPath, "grpc-encoding", "gzip"), body: hello, httpStatus: "200", grpcStatus: code(codes.Unimplemented), message: `grpc: Decompressor is not installed for grpc-encoding "gzip"`},
		{name: "compressed flag", headers: grpcHeaders(echoPath), body: func(t *testing.T) []byte { b := hello(t); b[0] = 1; return b }, httpStatus: "200", grpcStatus: code(codes.Internal), message: "grpc: compressed flag set with identity or empty encoding"},
		{name: "unknown flag", headers: grpcHeaders(echoPath), body: func(t *testing.T) []byte { b := hello(t); b[0] = 7; return b }, httpStatus: "200", grpcStatus: code(codes.Internal)},
		{name: "no message", headers: grpcHeaders(echoPath), body: func(*testing.T) []byte { return nil }, httpStatus: "200", grpcStatus: code(codes.Internal), message: "cardinality violation: received no request message from non-client-streaming RPC"},
		{name: "no message, headers end", headers: grpcHeaders(echoPath), end: true, httpStatus: "200", grpcStatus: code(codes.Internal)},
		{name: "two messages", headers: grpcHeaders(echoPath), body: func(t *testing.T) []byte { return append(hello(t), hello(t)...) }, httpStatus: "200", grpcStatus: code(codes.Internal), message: "cardinality violation: received multiple request messages for non-client-streaming RPC"},
		{name: "truncated message", headers: grpcHeaders(echoPath), body: func(t *testing.T) []byte { return hello(t)[:6] }, httpStatus: "200", grpcStatus: code(codes.Internal)},
		{name: "short prefix", headers: grpcHeaders(echoPath), body: func(t *testing.T) []byte { return []byte{0, 0} }, httpStatus: "200", grpcStatus: code(codes.Internal)},
		{name: "too large", headers: grpcHeaders(echoPath), body: func(*testing.T) []byte { return []byte{0, 0, 0, 4, 0} }, httpStatus: "200", grpcStatus: code(codes.ResourceExhausted), message: "grpc: received message larger than max (1024 vs. 1000)"},
		{name: "undecodable", headers: grpcHeaders(echoPath), body: func(*testing.T) []byte { return []byte{0, 0, 0, 0, 2, 0xff, 0xff} }, httpStatus: "200", grpcStatus: code(codes.Internal)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, addr)
			headers := tc.headers
			if tc.name == "unknown pseudo" {
				// :protocol after regular fields would be the other
				// case: put it first.
				headers = append([]string{":protocol", "x"}, grpcHeaders(echoPath)...)
			}
			r.headers(1, tc.end, headers...)
			if !tc.end {
				r.data(1, tc.body(t), true)
			}
			a := r.answer(1)
			if tc.reset {
				if !a.reset || a.rst != tc.rst {
					t.Fatalf("answer %+v, want RST_STREAM %v", a, tc.rst)
				}
				return
			}
			if a.reset || a.httpStatus != tc.httpStatus || a.grpcStatus != tc.grpcStatus || tc.message != "" && a.grpcMessage != tc.message {
				t.Fatalf("answer %+v, want :status %s grpc-status %s message %q", a, tc.httpStatus, tc.grpcStatus, tc.message)
			}
			// The connection goes on.
			r.call(3, "after")
			if a := r.answer(3); a.grpcStatus != "0" {
				t.Fatalf("call after: %+v", a)
			}
		})
	}
}

// TestRawStreamErrors: each stream error resets its stream with its code
// (RFC 9113; the cases h2spec tries), and the connection goes on.
func TestRawStreamErrors(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	for _, tc := range []struct {
		name string
		send func(r *raw) uint32 // returns the stream that must be reset
		code http2.ErrCode
	}{
		{"DATA after the call was answered", func(r *raw) uint32 {
			r.call(1, "x")
			if a := r.answer(1); a.grpcStatus != "0" {
				r.t.Fatalf("call: %+v", a)
			}
			_ = r.fr.WriteData(1, true, []byte{0})
			return 1
		}, http2.ErrCodeStreamClosed},
		{"DATA after the client's RST_STREAM", func(r *raw) uint32 {
			r.headers(1, false, grpcHeaders(echoPath)...)
			_ = r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			_ = r.fr.WriteData(1, true, []byte{0})
			return 1
		}, http2.ErrCodeStreamClosed},
		{"HEADERS depending on its own stream", func(r *raw) uint32 {
			_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.block(grpcHeaders(echoPath)...), EndHeaders: true,
				Priority: http2.PriorityParam{StreamDep: 1, Weight: 10}})
			return 1
		}, http2.ErrCodeProtocol},
		{"PRIORITY depending on its own stream", func(r *raw) uint32 {
			_ = r.fr.WritePriority(1, http2.PriorityParam{StreamDep: 1, Weight: 10})
			return 1
		}, http2.ErrCodeProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, addr)
			id := tc.send(r)
			if a := r.answer(id); !a.reset || a.rst != tc.code {
				t.Fatalf("answer %+v, want RST_STREAM %v", a, tc.code)
			}
			r.call(11, "after")
			if a := r.answer(11); a.grpcStatus != "0" {
				t.Fatalf("call after: %+v", a)
			}
		})
	}
}

// TestRawConnectionErrors: each protocol error ends the connection with
// GOAWAY and its code.
func TestRawConnectionErrors(t *testing.T) {
	_, _, _, addr := testServer(t, Options{MaxHeaderListSize: 4096})
	for _, tc := range []struct {
		name string
		send func(r *raw)
		code http2.ErrCode
	}{
		{"even stream", func(r *raw) { r.headers(2, true, grpcHeaders(echoPath)...) }, http2.ErrCodeProtocol},
		{"stream id going back", func(r *raw) {
			r.call(5, "x")
			r.answer(5)
			r.headers(3, true, grpcHeaders(echoPath)...)
		}, http2.ErrCodeStreamClosed},
		{"DATA on an idle stream", func(r *raw) { _ = r.fr.WriteData(9, true, []byte{0}) }, http2.ErrCodeProtocol},
		{"CONTINUATION alone", func(r *raw) { _ = r.fr.WriteContinuation(1, true, r.block(":method", "POST")) }, http2.ErrCodeProtocol},
		{"frame between HEADERS and CONTINUATION", func(r *raw) {
			_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.block(":method", "POST")})
			_ = r.fr.WritePing(false, [8]byte{})
		}, http2.ErrCodeProtocol},
		{"frame too large", func(r *raw) { _ = r.fr.WriteRawFrame(http2.FrameData, 0, 1, make([]byte, 20000)) }, http2.ErrCodeFrameSize},
		{"bad hpack", func(r *raw) {
			_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff, 0xff}, EndHeaders: true})
		}, http2.ErrCodeCompression},
		{"connection window overflow", func(r *raw) { _ = r.fr.WriteWindowUpdate(0, 1<<31-1) }, http2.ErrCodeFlowControl},
		{"window update of 0", func(r *raw) { _ = r.fr.WriteRawFrame(http2.FrameWindowUpdate, 0, 0, make([]byte, 4)) }, http2.ErrCodeProtocol},
		{"RST on an idle stream", func(r *raw) { _ = r.fr.WriteRSTStream(11, http2.ErrCodeCancel) }, http2.ErrCodeProtocol},
		{"PUSH_PROMISE", func(r *raw) {
			_ = r.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: r.block(":method", "GET"), EndHeaders: true})
		}, http2.ErrCodeProtocol},
		{"invalid setting", func(r *raw) { _ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 2}) }, http2.ErrCodeProtocol},
		{"window setting too large", func(r *raw) {
			_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31})
		}, http2.ErrCodeFlowControl},
		{"frame size setting too small", func(r *raw) { _ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 100}) }, http2.ErrCodeProtocol},
		{"CONTINUATION flood", func(r *raw) {
			_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.block(grpcHeaders(echoPath)...)})
			for range 100 {
				if r.fr.WriteContinuation(1, false, bytes.Repeat([]byte{0x80 | 2}, 1000)) != nil {
					return
				}
			}
		}, http2.ErrCodeEnhanceYourCalm},
		{"SETTINGS ACK with a payload", func(r *raw) { _ = r.fr.WriteRawFrame(http2.FrameSettings, 1, 0, make([]byte, 6)) }, http2.ErrCodeFrameSize},
		{"PING on a stream", func(r *raw) { _ = r.fr.WriteRawFrame(http2.FramePing, 0, 1, make([]byte, 8)) }, http2.ErrCodeProtocol},
		{"too much data for the connection window", func(r *raw) {
			for id := uint32(1); id < 40; id += 2 {
				// The server may have closed the connection already.
				if r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.block(grpcHeaders(echoPath)...), EndHeaders: true}) != nil {
					return
				}
				// A message of almost 4 MiB, sent in part.
				_ = r.fr.WriteData(id, false, []byte{0, 0, 0x3f, 0xff, 0xff})
				for range 64 {
					if r.fr.WriteData(id, false, make([]byte, 16384)) != nil {
						return
					}
				}
			}
		}, http2.ErrCodeFlowControl},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, addr)
			tc.send(r)
			if g := r.goAway(); g.ErrCode != tc.code {
				t.Errorf("GOAWAY %v, want %v", g.ErrCode, tc.code)
			}
		})
	}
}

// TestRawIgnored: padding, PRIORITY, unknown frame types and a split
// header block change nothing.
func TestRawIgnored(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	r := rawDial(t, addr)
	_ = r.fr.WritePriority(1, http2.PriorityParam{StreamDep: 0, Weight: 10})
	_ = r.fr.WriteRawFrame(0x42, 0xff, 1, []byte("unknown"))
	block := r.block(grpcHeaders(echoPath)...)
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:3], PadLength: 7, Priority: http2.PriorityParam{Weight: 3}}); err != nil {
		t.Fatal(err)
	}
	_ = r.fr.WriteContinuation(1, false, block[3:10])
	_ = r.fr.WriteContinuation(1, true, block[10:])
	msg := message(t, &wrapperspb.BytesValue{Value: []byte("padded")})
	if err := r.fr.WriteDataPadded(1, false, msg[:4], make([]byte, 200)); err != nil {
		t.Fatal(err)
	}
	_ = r.fr.WriteDataPadded(1, true, msg[4:], make([]byte, 3))
	if a := r.answer(1); a.grpcStatus != "0" || !bytes.Equal(a.data, msg) {
		t.Errorf("answer %+v, want the padded message back", a)
	}
	// A GOAWAY from the client: its calls in flight are answered, then
	// the connection closes.
	r.call(3, "last")
	_ = r.fr.WriteGoAway(3, http2.ErrCodeNo, nil)
	if a := r.answer(3); a.grpcStatus != "0" {
		t.Errorf("call before the client's GOAWAY: %+v", a)
	}
	if !r.closed() {
		t.Error("the connection stays open after the client's GOAWAY")
	}
}

// TestRawTimeouts: a silent connection, one that sends half a preface and
// an idle one are closed; so is one whose response waits for a window that
// never opens.
func TestRawTimeouts(t *testing.T) {
	_, _, _, addr := testServer(t, Options{PrefaceTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	t.Run("silent", func(t *testing.T) {
		if !rawConnect(t, addr).closed() {
			t.Error("a silent connection stays open")
		}
	})
	t.Run("half a preface", func(t *testing.T) {
		r := rawConnect(t, addr)
		_, _ = io.WriteString(r.c, clientPreface[:10])
		if !r.closed() {
			t.Error("a connection with half a preface stays open")
		}
	})
	t.Run("no HTTP/2", func(t *testing.T) {
		r := rawConnect(t, addr)
		_, _ = io.WriteString(r.c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		if !r.closed() {
			t.Error("an HTTP/1.1 connection stays open")
		}
	})
	t.Run("no SETTINGS", func(t *testing.T) {
		r := rawConnect(t, addr)
		_, _ = io.WriteString(r.c, clientPreface)
		_ = r.fr.WritePing(false, [8]byte{})
		if g := r.goAway(); g.ErrCode != http2.ErrCodeProtocol {
			t.Errorf("GOAWAY %v, want PROTOCOL_ERROR", g.ErrCode)
		}
	})
	t.Run("idle", func(t *testing.T) {
		r := rawDial(t, addr)
		r.call(1, "x")
		r.answer(1)
		if g := r.goAway(); g.ErrCode != http2.ErrCodeNo || g.LastStreamID != 1 {
			t.Errorf("GOAWAY %v last stream %d, want NO_ERROR 1", g.ErrCode, g.LastStreamID)
		}
	})
	t.Run("window never opens", func(t *testing.T) {
		r := rawDial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		r.call(1, "x")
		// Keep the connection busy, so that idleness does not close it.
		start := time.Now()
		for !r.closed() {
			if time.Since(start) > 20*time.Second {
				t.Fatal("a response waiting for a window keeps the connection")
			}
		}
	})
}

// TestRawFloods: a client that sends control frames without reading the
// answers is cut off.
func TestRawFloods(t *testing.T) {
	_, _, _, addr := testServer(t, Options{WriteTimeout: 300 * time.Millisecond})
	for _, tc := range []struct {
		name  string
		frame func(r *raw) error
	}{
		{"PING", func(r *raw) error { return r.fr.WritePing(false, [8]byte{}) }},
		{"SETTINGS", func(r *raw) error { return r.fr.WriteSettings() }},
		{"refused streams", func() func(r *raw) error {
			id := uint32(1)
			return func(r *raw) error {
				id += 2
				return r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.block(":method", "GET", ":path", "/x", ":authority", "a", "content-type", "application/grpc"), EndHeaders: true, EndStream: true})
			}
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, addr)
			// The client never reads: its socket buffer fills, then the
			// server's.
			var buf bytes.Buffer
			r.fr = http2.NewFramer(&buf, r.c)
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				buf.Reset()
				for range 1000 {
					if err := tc.frame(r); err != nil {
						t.Fatal(err)
					}
				}
				_ = r.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := r.c.Write(buf.Bytes()); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						continue
					}
					return // closed by the server
				}
			}
			t.Fatal("the flood went on for 60s")
		})
	}
}
