package main

// Tests of the gRPC load's HTTP/2 client against scripted servers: every
// frame it must handle, and what it writes back.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// peer is the server side of a scripted connection: it records everything
// the client writes.
type peer struct {
	conn net.Conn
	enc  *hpack.Encoder // with its dynamic table, as a real server's
	buf  bytes.Buffer   // the encoder's output
	mu   sync.Mutex
	got  bytes.Buffer // what the client wrote
	done chan struct{}
}

// newPeer connects a client wireConn to a scripted peer.
func newPeer(t *testing.T) (*wireConn, *peer) {
	t.Helper()
	cc, sc := net.Pipe()
	p := &peer{conn: sc, done: make(chan struct{})}
	p.enc = hpack.NewEncoder(&p.buf)
	go func() {
		defer close(p.done)
		b := make([]byte, 4096)
		for {
			n, err := sc.Read(b)
			p.mu.Lock()
			p.got.Write(b[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cc.Close(); sc.Close(); <-p.done })
	if err := cc.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	w, err := newWireConn(cc)
	if err != nil {
		t.Fatal(err)
	}
	return w, p
}

// headers is a header block of fields, "name: value" each.
func (p *peer) headers(fields ...string) []byte {
	p.buf.Reset()
	for _, f := range fields {
		name, value, _ := strings.Cut(f, ": ")
		_ = p.enc.WriteField(hpack.HeaderField{Name: name, Value: value})
	}
	return bytes.Clone(p.buf.Bytes())
}

func frame(typ, flags byte, stream uint32, payload []byte) []byte {
	return append(appendFrameHeader(nil, len(payload), typ, flags, stream), payload...)
}

// grpcMessage is a reply with gRPC's length prefix.
func grpcMessage(m proto.Message) []byte {
	b, _ := proto.Marshal(m)
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

// written returns the frames the client wrote after its preface.
func (p *peer) written(t *testing.T) [][3]any {
	t.Helper()
	p.mu.Lock()
	b := bytes.Clone(p.got.Bytes())
	p.mu.Unlock()
	if !bytes.HasPrefix(b, []byte(clientPreface)) {
		t.Fatalf("client did not start with the HTTP/2 preface: %q", b)
	}
	b = b[len(clientPreface):]
	var frames [][3]any // type, flags, payload
	for len(b) >= frameHeaderLen {
		n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
		frames = append(frames, [3]any{b[3], b[4], b[frameHeaderLen : frameHeaderLen+n]})
		b = b[frameHeaderLen+n:]
	}
	return frames
}

var okReply = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}

func TestWireCall(t *testing.T) {
	ok := grpcMessage(okReply)
	tests := []struct {
		name     string
		script   func(p *peer) [][]byte
		wantErr  string // substring; "" for success
		wantCode codes.Code
	}{
		{"answer", func(p *peer) [][]byte {
			return [][]byte{
				frame(frameSettings, 0, 0, nil),
				frame(frameHeaders, flagEndHeaders, 1, p.headers(":status: 200", "content-type: application/grpc")),
				frame(frameData, 0, 1, ok),
				frame(frameHeaders, flagEndHeaders|flagEndStream, 1, p.headers("grpc-status: 0")),
			}
		}, "", codes.OK},
		{"message over two frames, padded", func(p *peer) [][]byte {
			trailers := p.headers("grpc-status: 0")
			return [][]byte{
				frame(frameHeaders, flagEndHeaders, 1, p.headers(":status: 200")),
				frame(frameData, flagPadded, 1, append(append([]byte{3}, ok[:4]...), 0, 0, 0)),
				frame(frameData, 0, 1, ok[4:]),
				frame(frameHeaders, flagEndStream, 1, trailers[:1]),
				frame(frameContinuation, flagEndHeaders, 1, trailers[1:]),
			}
		}, "", codes.OK},
		{"another stream's frames", func(p *peer) [][]byte {
			return [][]byte{
				frame(frameHeaders, flagEndHeaders|flagEndStream, 3, p.headers(":status: 200", "grpc-status: 13")),
				frame(frameData, 0, 3, ok),
				frame(frameHeaders, flagEndHeaders, 1, p.headers(":status: 200")),
				frame(frameData, 0, 1, ok),
				frame(frameHeaders, flagEndHeaders|flagEndStream, 1, p.headers("grpc-status: 0")),
			}
		}, "", codes.OK},
		{"trailers only", func(p *peer) [][]byte {
			return [][]byte{frame(frameHeaders, flagEndHeaders|flagEndStream, 1, p.headers(":status: 200", "grpc-status: 8", "grpc-message: slow down"))}
		}, "slow down", codes.ResourceExhausted},
		{"http error", func(p *peer) [][]byte {
			return [][]byte{frame(frameHeaders, flagEndHeaders|flagEndStream, 1, p.headers(":status: 503"))}
		}, `HTTP status "503"`, codes.Unknown},
		{"no grpc-status", func(p *peer) [][]byte {
			return [][]byte{
				frame(frameHeaders, flagEndHeaders, 1, p.headers(":status: 200")),
				frame(frameData, flagEndStream, 1, ok),
			}
		}, `grpc-status ""`, codes.Unknown},
		{"wrong length prefix", func(p *peer) [][]byte {
			return [][]byte{
				frame(frameHeaders, flagEndHeaders, 1, p.headers(":status: 200")),
				frame(frameData, 0, 1, append(bytes.Clone(ok), 0)),
				frame(frameHeaders, flagEndHeaders|flagEndStream, 1, p.headers("grpc-status: 0")),
			}
		}, "malformed gRPC message", codes.Unknown},
		{"reset", func(p *peer) [][]byte {
			return [][]byte{frame(frameRSTStream, 0, 1, []byte{0, 0, 0, 7})}
		}, "stream reset (error code 7)", codes.Unknown},
		{"goaway before the call", func(p *peer) [][]byte {
			return [][]byte{frame(frameGoAway, 0, 0, make([]byte, 8))}
		}, errGoAway.Error(), codes.Unknown},
		{"goaway after the call", func(p *peer) [][]byte {
			return [][]byte{
				frame(frameGoAway, 0, 0, []byte{0, 0, 0, 1, 0, 0, 0, 0}),
				frame(frameHeaders, flagEndHeaders, 1, p.headers(":status: 200")),
				frame(frameData, 0, 1, ok),
				frame(frameHeaders, flagEndHeaders|flagEndStream, 1, p.headers("grpc-status: 0")),
			}
		}, "", codes.OK},
		{"short goaway", func(p *peer) [][]byte {
			return [][]byte{frame(frameGoAway, 0, 0, make([]byte, 4))}
		}, "short GOAWAY", codes.Unknown},
		{"frame too large", func(p *peer) [][]byte {
			return [][]byte{appendFrameHeader(nil, maxFrameLen+1, frameData, 0, 1)}
		}, "over the 16384 allowed", codes.Unknown},
		{"bad padding", func(p *peer) [][]byte {
			return [][]byte{frame(frameData, flagPadded, 1, []byte{9, 1})}
		}, "malformed padding", codes.Unknown},
		{"interrupted header block", func(p *peer) [][]byte {
			return [][]byte{
				frame(frameHeaders, 0, 1, p.headers(":status: 200")),
				frame(frameData, 0, 1, ok),
			}
		}, "inside a header block", codes.Unknown},
		{"connection closed", func(p *peer) [][]byte { return [][]byte{{0, 0, 0, frameHeaders}} }, "unexpected EOF", codes.Unknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, p := newPeer(t)
			call, err := buildWireCall("127.0.0.1:1", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, rlsRPC(clientIPs(1)).reqs[0])
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				for _, f := range tt.script(p) {
					if _, err := p.conn.Write(f); err != nil {
						return
					}
				}
				if tt.name == "connection closed" || tt.name == "frame too large" {
					p.conn.Close()
				}
			}()
			reply := &rlsv3.RateLimitResponse{}
			err = w.call(call, reply)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("call: %v", err)
			case tt.wantErr == "" && reply.GetOverallCode() != rlsv3.RateLimitResponse_OK:
				t.Errorf("reply %v, want overall_code OK", reply)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("call error %v, want one saying %q", err, tt.wantErr)
			}
			if st, isStatus := status.FromError(err); err != nil && isStatus != (tt.wantCode != codes.Unknown) || isStatus && st.Code() != tt.wantCode {
				t.Errorf("call error %v: gRPC status %v (%v), want %v", err, st.Code(), isStatus, tt.wantCode)
			}
			// After a GOAWAY, even one that let the call through, the
			// connection takes no further call.
			if strings.HasPrefix(tt.name, "goaway") {
				if err := w.call(call, reply); !errors.Is(err, errGoAway) {
					t.Errorf("call after GOAWAY = %v, want %v", err, errGoAway)
				}
			}
		})
	}
}

// TestWireCallFrames checks what the client writes: the request frames
// with their stream id, answers to SETTINGS and PING, and a
// WINDOW_UPDATE returning the received data; and that a second call on
// the connection takes the next stream id and reads headers indexed in
// the server's dynamic table.
func TestWireCallFrames(t *testing.T) {
	w, p := newPeer(t)
	req := rlsRPC(clientIPs(1)).reqs[0]
	call, err := buildWireCall("127.0.0.1:1", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, req)
	if err != nil {
		t.Fatal(err)
	}
	ok := grpcMessage(okReply)
	big := bytes.Repeat([]byte{0}, windowRefill) // data on another stream, counted against the connection's window
	answer := func(stream uint32) [][]byte {
		return [][]byte{
			frame(frameHeaders, flagEndHeaders, stream, p.headers(":status: 200", "content-type: application/grpc")),
			frame(frameData, 0, stream, ok),
			frame(frameHeaders, flagEndHeaders|flagEndStream, stream, p.headers("grpc-status: 0", "grpc-message: ")),
		}
	}
	script := append([][]byte{
		frame(frameSettings, 0, 0, []byte{0, 4, 0, 1, 0, 0}),
		frame(framePing, 0, 0, []byte("pingpong")),
		frame(frameData, 0, 5, big),
	}, answer(1)...)
	go func() {
		for _, f := range append(script, answer(3)...) {
			if _, err := p.conn.Write(f); err != nil {
				return
			}
		}
	}()
	for i := range 2 {
		reply := &rlsv3.RateLimitResponse{}
		if err := w.call(call, reply); err != nil || reply.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d = %v, %v; want OK", i+1, reply, err)
		}
	}
	// The peer reads asynchronously: wait for the second request's frames.
	deadline := time.Now().Add(5 * time.Second)
	var frames [][3]any
	for {
		frames = p.written(t)
		if len(frames) >= 7 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var kinds []string
	var streams []uint32
	p.mu.Lock()
	raw := bytes.Clone(p.got.Bytes())[len(clientPreface):]
	p.mu.Unlock()
	for len(raw) >= frameHeaderLen {
		n := int(raw[0])<<16 | int(raw[1])<<8 | int(raw[2])
		streams = append(streams, binary.BigEndian.Uint32(raw[5:9]))
		raw = raw[frameHeaderLen+n:]
	}
	for i, f := range frames {
		typ, flags, payload := f[0].(byte), f[1].(byte), f[2].([]byte)
		switch {
		case typ == frameSettings && flags&flagAck == 0:
			kinds = append(kinds, "SETTINGS")
		case typ == frameSettings:
			kinds = append(kinds, "SETTINGS ACK")
		case typ == framePing && flags&flagAck != 0 && string(payload) == "pingpong":
			kinds = append(kinds, "PING ACK")
		case typ == frameHeaders && flags&flagEndHeaders != 0:
			kinds = append(kinds, "HEADERS")
		case typ == frameData && flags&flagEndStream != 0 && bytes.Equal(payload, grpcMessage(req)):
			kinds = append(kinds, "DATA")
		case typ == frameWindowUpdate && len(payload) == 4:
			kinds = append(kinds, "WINDOW_UPDATE "+itoa(binary.BigEndian.Uint32(payload)))
		default:
			kinds = append(kinds, "unexpected frame")
		}
		if typ == frameHeaders || typ == frameData {
			kinds[len(kinds)-1] += " " + itoa(streams[i])
		}
	}
	want := "SETTINGS, HEADERS 1, DATA 1, SETTINGS ACK, PING ACK, WINDOW_UPDATE " + itoa(uint32(len(big)+len(ok))) + ", HEADERS 3, DATA 3"
	if got := strings.Join(kinds, ", "); got != want {
		t.Errorf("client wrote %s\nwant %s", got, want)
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// TestWireSendWindow checks that a call waits for the connection's send
// window before it writes its DATA frame.
func TestWireSendWindow(t *testing.T) {
	w, p := newPeer(t)
	w.sendWindow = 0
	call, err := buildWireCall("127.0.0.1:1", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, rlsRPC(clientIPs(1)).reqs[0])
	if err != nil {
		t.Fatal(err)
	}
	ok := grpcMessage(okReply)
	go func() {
		for _, f := range [][]byte{
			frame(frameWindowUpdate, 0, 0, []byte{0, 0, 1, 0}),
			frame(frameHeaders, flagEndHeaders, 1, p.headers(":status: 200")),
			frame(frameData, 0, 1, ok),
			frame(frameHeaders, flagEndHeaders|flagEndStream, 1, p.headers("grpc-status: 0")),
		} {
			if _, err := p.conn.Write(f); err != nil {
				return
			}
		}
	}()
	if err := w.call(call, &rlsv3.RateLimitResponse{}); err != nil {
		t.Fatalf("call: %v", err)
	}
	if got, want := w.sendWindow, int64(256-(len(call.frames)-call.dataOff-frameHeaderLen)); got != want {
		t.Errorf("send window %d after the call, want %d", got, want)
	}
}

// TestBuildWireCall checks the prebuilt frames: a header block a fresh
// decoder reads (no dynamic table needed), and the length-prefixed
// message.
func TestBuildWireCall(t *testing.T) {
	req := checkRPC(clientIPs(1)).reqs[0]
	c, err := buildWireCall("127.0.0.1:9", "/envoy.service.auth.v3.Authorization/Check", req)
	if err != nil {
		t.Fatal(err)
	}
	// Every field is either in HPACK's static table (:method POST,
	// :scheme http) or a never-indexed literal: none enters a dynamic
	// table.
	var got []string
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		got = append(got, f.Name+"="+f.Value)
		if !f.Sensitive && f.Name != ":method" && f.Name != ":scheme" {
			t.Errorf("header %s is not a never-indexed literal", f.Name)
		}
	})
	if _, err := dec.Write(c.frames[frameHeaderLen:c.dataOff]); err != nil {
		t.Fatalf("decode: %v", err)
	}
	want := ":method=POST :scheme=http :path=/envoy.service.auth.v3.Authorization/Check :authority=127.0.0.1:9 content-type=application/grpc te=trailers user-agent=authlimit-bench"
	if strings.Join(got, " ") != want {
		t.Errorf("headers %q, want %q", strings.Join(got, " "), want)
	}
	if typ, flags := c.frames[c.dataOff+3], c.frames[c.dataOff+4]; typ != frameData || flags != flagEndStream {
		t.Errorf("second frame type %d flags %d, want DATA with END_STREAM", typ, flags)
	}
	data := c.frames[c.dataOff+frameHeaderLen:]
	sent := &authv3.CheckRequest{}
	if len(data) < 5 || data[0] != 0 || int(binary.BigEndian.Uint32(data[1:])) != len(data)-5 {
		t.Fatalf("DATA payload %x is not a length-prefixed message", data)
	}
	if err := proto.Unmarshal(data[5:], sent); err != nil || !proto.Equal(sent, req) {
		t.Errorf("DATA payload holds %v (%v), want the request %v", sent, err, req)
	}
	if _, err := buildWireCall("x", "/m", &rlsv3.RateLimitRequest{Domain: strings.Repeat("d", maxFrameLen)}); err == nil {
		t.Errorf("buildWireCall accepted a request larger than a frame")
	}
}

// TestWireStreamIDsExhausted checks that a connection whose stream ids are
// used up makes no call, and says so as a GOAWAY would.
func TestWireStreamIDsExhausted(t *testing.T) {
	w, _ := newPeer(t)
	w.next = maxStreamID + 2
	call, err := buildWireCall("127.0.0.1:1", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, rlsRPC(clientIPs(1)).reqs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := w.call(call, &rlsv3.RateLimitResponse{}); !errors.Is(err, errGoAway) {
		t.Errorf("call = %v, want %v", err, errGoAway)
	}
}
