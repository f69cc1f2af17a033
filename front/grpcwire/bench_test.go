package grpcwire

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/internal/race"
)

// nullAuthz answers every Check OK, deciding nothing.
type nullAuthz struct {
	authv3.UnimplementedAuthorizationServer
}

func (nullAuthz) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return &authv3.CheckResponse{Status: &rpcstatus.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}}, nil
}

const checkPath = "/envoy.service.auth.v3.Authorization/Check"

// benchCall is a Check as Envoy sends one: HEADERS and a DATA frame
// ending the stream, whose stream ids are patched per call.
func benchCall(b testing.TB) []byte {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", checkPath}, {":authority", "authlimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"grpc-timeout", "200m"}, {"x-envoy-internal", "true"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true})
	}
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "198.18.0.7", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 50000}}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/api/items?x=1", Host: "api.example.com",
			Headers: map[string]string{"user-agent": "bench", "accept": "*/*", "x-request-id": "0f3c1a2b-5d6e-4f70-8192-a3b4c5d6e7f8"}}},
	}}
	msg := message(&testing.T{}, req)
	var out bytes.Buffer
	fr := http2.NewFramer(&out, nil)
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})
	_ = fr.WriteData(1, true, msg)
	return out.Bytes()
}

// benchConn is one client connection making one call at a time.
type benchConn struct {
	c      net.Conn
	fr     *http2.Framer
	w      *bufio.Writer
	call   []byte
	data   int // where the DATA frame starts in call
	id     uint32
	unread int // response bytes not yet returned to the server's window
}

func dialBench(b testing.TB, addr string, call []byte) *benchConn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
	headersLen := int(call[0])<<16 | int(call[1])<<8 | int(call[2])
	bc := &benchConn{c: c, w: bufio.NewWriter(c), call: bytes.Clone(call), data: 9 + headersLen, id: 1}
	bc.fr = http2.NewFramer(bc.w, bufio.NewReader(c))
	bc.fr.SetReuseFrames()
	_, _ = bc.w.WriteString(clientPreface)
	_ = bc.fr.WriteSettings()
	_ = bc.fr.WriteWindowUpdate(0, 1<<30)
	if err := bc.w.Flush(); err != nil {
		b.Fatal(err)
	}
	return bc
}

// do makes one call and reads its answer up to the trailers.
func (bc *benchConn) do(b testing.TB) {
	id := bc.id
	bc.id += 2
	for _, off := range []int{5, bc.data + 5} {
		bc.call[off], bc.call[off+1], bc.call[off+2], bc.call[off+3] = byte(id>>24), byte(id>>16), byte(id>>8), byte(id)
	}
	_, _ = bc.w.Write(bc.call)
	if err := bc.w.Flush(); err != nil {
		b.Fatal(err)
	}
	for {
		f, err := bc.fr.ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = bc.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = bc.fr.WritePing(true, f.Data)
			}
		case *http2.DataFrame:
			bc.unread += int(f.Length)
		case *http2.HeadersFrame:
			if f.StreamID == id && f.StreamEnded() {
				if bc.unread > 1<<20 {
					_ = bc.fr.WriteWindowUpdate(0, uint32(bc.unread))
					bc.unread = 0
				}
				return
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			b.Fatalf("unexpected %v", f)
		}
	}
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkUnaryCall compares the CPU a unary Check costs on grpc-go's
// server and on this package's, with the same frame-level client (one
// call in flight per connection, 64 connections) over loopback. cpu-ns/op
// is the whole process's (client and server) CPU time per call. The
// floor is a responder that reads the frames and writes a prebuilt
// answer, decoding nothing: what a server costs is its figure less the
// floor's, plus the floor responder's own small share (its reads and
// writes).
func BenchmarkUnaryCall(b *testing.B) {
	call := benchCall(b)
	servers := []struct {
		name  string
		serve func(b *testing.B, l net.Listener) func()
	}{
		{"floor", func(b *testing.B, l net.Listener) func() {
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go respondCanned(c)
				}
			}()
			return func() { _ = l.Close() }
		}},
		{"grpc-go", func(b *testing.B, l net.Listener) func() {
			g := grpc.NewServer()
			authv3.RegisterAuthorizationServer(g, nullAuthz{})
			go func() { _ = g.Serve(l) }()
			return g.Stop
		}},
		{"grpcwire", func(b *testing.B, l net.Listener) func() {
			s := NewServer(Options{})
			if err := Unary(s, checkPath, nullAuthz{}.Check); err != nil {
				b.Fatal(err)
			}
			go func() { _ = s.Serve(l) }()
			return s.Stop
		}},
	}
	for _, srv := range servers {
		b.Run(srv.name, func(b *testing.B) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			stop := srv.serve(b, l)
			defer stop()
			b.SetParallelism(4) // 4 × GOMAXPROCS connections
			b.ReportAllocs()
			conns := make(chan *benchConn, 64)
			for range 64 {
				bc := dialBench(b, l.Addr().String(), call)
				bc.do(b) // settle the SETTINGS exchange
				conns <- bc
			}
			start := cpuTime()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				bc := <-conns
				for pb.Next() {
					bc.do(b)
				}
				conns <- bc
			})
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
			close(conns)
			for bc := range conns {
				_ = bc.c.Close()
			}
		})
	}
}

// frameHeaderSize is an HTTP/2 frame header's length.
const frameHeaderSize = 9

// respondCanned answers every request stream on c with a prebuilt Check
// response, decoding nothing but the frame headers.
func respondCanned(c net.Conn) {
	defer c.Close()
	resp, err := proto.Marshal(&authv3.CheckResponse{Status: &rpcstatus.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}})
	if err != nil {
		return
	}
	msg := append([]byte{0, 0, 0, 0, byte(len(resp))}, resp...)
	answer := appendFrameHeader(nil, 0, frameSettings, 0, 0)
	first := len(answer)
	answer = appendHeaderBlock(answer, 1, responseHeaders, false, readFrameSize)
	answer = appendFrameHeader(answer, len(msg), frameData, 0, 1)
	answer = append(answer, msg...)
	answer = appendHeaderBlock(answer, 1, okTrailers, true, readFrameSize)
	// The stream ids to patch: in each of the three frames.
	var ids []int
	for off := first; off < len(answer); {
		ids = append(ids, off+5)
		off += frameHeaderSize + (int(answer[off])<<16 | int(answer[off+1])<<8 | int(answer[off+2]))
	}
	br := bufio.NewReader(c)
	if _, err := io.ReadFull(br, make([]byte, len(clientPreface))); err != nil {
		return
	}
	out := append([]byte(nil), answer[:first]...) // SETTINGS first
	var hdr [frameHeaderSize]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		if _, err := br.Discard(n); err != nil {
			return
		}
		if hdr[3] != frameData || hdr[4]&flagEndStream == 0 {
			continue
		}
		for _, off := range ids {
			copy(answer[off:off+4], hdr[5:9])
		}
		out = append(out, answer[first:]...)
		if br.Buffered() == 0 {
			if _, err := c.Write(out); err != nil {
				return
			}
			out = out[:0]
		}
	}
}

// TestUnaryCallAllocates bounds the allocations of a whole unary call
// with a grpc-timeout, as Envoy sends one, to a handler that allocates
// nothing, over loopback, the frame-level client's included (its reading
// of the response's header frames). The server's are the stream and the
// HEADERS frame x/net's framer reads. The request's header block is the
// same never-indexed literals on every call, decoded once per connection
// (see conn.last; decoding it on every call made it 15); a field from the
// dynamic table, as Envoy mostly sends, allocates nothing either. The
// call's context is part of its stream, and costs nothing until a handler
// asks for Done (a context.WithTimeout per call made it 19).
func TestUnaryCallAllocates(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	s := NewServer(Options{})
	resp, err := proto.Marshal(&authv3.CheckResponse{Status: &rpcstatus.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := UnaryRaw(s, checkPath, func(_ context.Context, _, out []byte) ([]byte, error) { return append(out, resp...), nil }); err != nil {
		t.Fatal(err)
	}
	bc := dialBench(t, serveLoopback(t, s), benchCall(t))
	t.Cleanup(func() { _ = bc.c.Close() })
	bc.do(t) // settle the SETTINGS exchange
	got := testing.AllocsPerRun(200, func() { bc.do(t) })
	if max := 5.0; got > max {
		t.Errorf("a call allocates %v times, want at most %v", got, max)
	}
}
