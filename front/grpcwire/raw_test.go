package grpcwire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// raw is a client that speaks HTTP/2 frame by frame.
type raw struct {
	t      *testing.T
	c      net.Conn
	fr     *http2.Framer
	enc    *hpack.Encoder
	encBuf bytes.Buffer
	// settings are the server's first SETTINGS.
	settings map[http2.SettingID]uint32
	// answers are the streams read so far.
	answers map[uint32]*answer
	// open is a header block left open, for a test to end.
	open []byte
}

// rawDial connects, sends the preface and settings, and reads the
// server's SETTINGS.
func rawDial(t *testing.T, addr string, settings ...http2.Setting) *raw {
	t.Helper()
	r := rawConnect(t, addr)
	r.handshake(settings...)
	return r
}

// handshake sends the preface and settings, and reads the server's
// SETTINGS.
func (r *raw) handshake(settings ...http2.Setting) {
	t := r.t
	t.Helper()
	if _, err := io.WriteString(r.c, clientPreface); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	f := r.read()
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		t.Fatalf("server's first frame %v, want SETTINGS", f)
	}
	r.settings = map[http2.SettingID]uint32{}
	_ = sf.ForeachSetting(func(s http2.Setting) error { r.settings[s.ID] = s.Val; return nil })
	if err := r.fr.WriteSettingsAck(); err != nil {
		t.Fatal(err)
	}
}

// rawConnect connects and sends nothing.
func rawConnect(t *testing.T, addr string) *raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return rawConnectConn(t, c)
}

// rawConnectConn is a raw client on c.
func rawConnectConn(t *testing.T, c net.Conn) *raw {
	r := &raw{t: t, c: c}
	r.fr = http2.NewFramer(c, c)
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.fr.MaxHeaderListSize = 1 << 20
	r.enc = hpack.NewEncoder(&r.encBuf)
	return r
}

// read reads the next frame within 10 s; nil when the connection ended.
func (r *raw) read() http2.Frame {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := r.fr.ReadFrame()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			r.t.Fatalf("no frame within 10s")
		}
		r.t.Logf("read: %v", err)
		return nil
	}
	return f
}

// block encodes header fields, name value pairs.
func (r *raw) block(fields ...string) []byte {
	r.encBuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = r.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return bytes.Clone(r.encBuf.Bytes())
}

// grpcHeaders are a call's request headers, with extra fields after.
func grpcHeaders(path string, extra ...string) []string {
	return append([]string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "test", "content-type", "application/grpc", "te", "trailers"}, extra...)
}

func (r *raw) headers(id uint32, end bool, fields ...string) {
	r.t.Helper()
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.block(fields...), EndStream: end, EndHeaders: true}); err != nil {
		r.t.Fatal(err)
	}
}

// message frames m as one gRPC message.
func message(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{0, byte(len(b) >> 24), byte(len(b) >> 16), byte(len(b) >> 8), byte(len(b))}, b...)
}

// call sends an echo call of v on stream id.
func (r *raw) call(id uint32, v string) {
	r.t.Helper()
	r.headers(id, false, grpcHeaders(echoPath)...)
	r.data(id, message(r.t, &wrapperspb.BytesValue{Value: []byte(v)}), true)
}

// data sends b in DATA frames of at most 16384 bytes.
func (r *raw) data(id uint32, b []byte, end bool) {
	r.t.Helper()
	for {
		n := min(len(b), 16384)
		if err := r.fr.WriteData(id, end && n == len(b), b[:n]); err != nil {
			r.t.Fatal(err)
		}
		b = b[n:]
		if len(b) == 0 {
			return
		}
	}
}

// answer is what came back on a stream.
type answer struct {
	httpStatus, grpcStatus, grpcMessage string
	data                                []byte
	rst                                 http2.ErrCode // RST_STREAM's code, if the stream was reset
	reset                               bool
	done                                bool
}

// answer reads frames until stream id ends, keeping the other streams'
// for their own answer calls.
func (r *raw) answer(id uint32) answer {
	r.t.Helper()
	if r.answers == nil {
		r.answers = map[uint32]*answer{}
	}
	for {
		if a := r.answers[id]; a != nil && a.done {
			delete(r.answers, id)
			return *a
		}
		f := r.read()
		if f == nil {
			r.t.Fatalf("stream %d: the connection ended", id)
		}
		sid := f.Header().StreamID
		if sid == 0 {
			continue
		}
		a := r.answers[sid]
		if a == nil {
			a = &answer{}
			r.answers[sid] = a
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			for _, hf := range f.Fields {
				switch hf.Name {
				case ":status":
					a.httpStatus = hf.Value
				case "grpc-status":
					a.grpcStatus = hf.Value
				case "grpc-message":
					a.grpcMessage = hf.Value
				}
			}
			a.done = f.StreamEnded()
		case *http2.DataFrame:
			a.data = append(a.data, f.Data()...)
			a.done = f.StreamEnded()
		case *http2.RSTStreamFrame:
			a.rst, a.reset, a.done = f.ErrCode, true, true
		}
	}
}

// goAway reads until GOAWAY and then the connection's end.
func (r *raw) goAway() *http2.GoAwayFrame {
	r.t.Helper()
	var g *http2.GoAwayFrame
	for {
		f := r.read()
		if f == nil {
			if g == nil {
				r.t.Fatal("the connection ended without GOAWAY")
			}
			return g
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			g = &http2.GoAwayFrame{ErrCode: ga.ErrCode, LastStreamID: ga.LastStreamID}
		}
	}
}

// closed reports whether the server closed the connection within 10 s,
// whatever it wrote before.
func (r *raw) closed() bool {
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, r.c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func code(c codes.Code) string { return strconv.Itoa(int(c)) }

func TestRawCall(t *testing.T) {
	_, _, _, addr := testServer(t, Options{MaxConcurrentStreams: 7})
	r := rawDial(t, addr)
	if r.settings[http2.SettingMaxConcurrentStreams] != 7 || r.settings[http2.SettingMaxHeaderListSize] != DefaultMaxHeaderListSize {
		t.Errorf("server settings %v, want MAX_CONCURRENT_STREAMS 7 and MAX_HEADER_LIST_SIZE %d", r.settings, DefaultMaxHeaderListSize)
	}
	// PING is answered with its data.
	if err := r.fr.WritePing(false, [8]byte{1, 2, 3, 4, 5, 6, 7, 8}); err != nil {
		t.Fatal(err)
	}
	for {
		f := r.read()
		if p, ok := f.(*http2.PingFrame); ok {
			if !p.IsAck() || p.Data != [8]byte{1, 2, 3, 4, 5, 6, 7, 8} {
				t.Errorf("PING answer %v, want an ACK with the same data", p)
			}
			break
		}
		if f == nil {
			t.Fatal("no PING ACK")
		}
	}
	r.call(1, "hello")
	a := r.answer(1)
	if want := message(t, &wrapperspb.BytesValue{Value: []byte("hello")}); a.httpStatus != "200" || a.grpcStatus != "0" || !bytes.Equal(a.data, want) {
		t.Errorf("answer %+v, want 200, grpc-status 0 and the message", a)
	}
}

func TestRawFlowControl(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	// No window at first: the response waits; another stream and PING
	// are served meanwhile.
	r := rawDial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	big := string(bytes.Repeat([]byte("b"), 40000))
	r.call(1, big)
	r.call(3, "small")
	if err := r.fr.WritePing(false, [8]byte{9}); err != nil {
		t.Fatal(err)
	}
	var headers int
	for pinged := false; !pinged || headers < 2; {
		switch f := r.read().(type) {
		case *http2.PingFrame:
			pinged = true
		case *http2.MetaHeadersFrame:
			headers++
		case *http2.DataFrame:
			t.Fatalf("DATA on stream %d with no window", f.StreamID)
		case nil:
			t.Fatal("the connection ended")
		}
	}
	// Stream 3's window opens: it is answered in full.
	if err := r.fr.WriteWindowUpdate(3, 100); err != nil {
		t.Fatal(err)
	}
	if a := r.answer(3); a.grpcStatus != "0" || len(a.data) != 5+7 {
		t.Errorf("stream 3: %+v", a)
	}
	// Stream 1 gets 1000 bytes, then the window shrinks below zero by a
	// new INITIAL_WINDOW_SIZE (0 → ... stays 1000 less), then opens.
	if err := r.fr.WriteWindowUpdate(1, 1000); err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < 1000 {
		if d, ok := r.read().(*http2.DataFrame); ok && d.StreamID == 1 {
			got += len(d.Data())
		}
	}
	if err := r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100}); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	// Each SETTINGS is acknowledged; stream 1 got 100 more at most
	// while the setting was 100.
	for acks := 0; acks < 3; {
		switch f := r.read().(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				acks++
			}
		case *http2.DataFrame:
			got += len(f.Data())
		case nil:
			t.Fatal("the connection ended")
		}
	}
	if got > 1100 {
		t.Fatalf("stream 1 got %d bytes with a window of 1000 then 100", got)
	}
	if err := r.fr.WriteWindowUpdate(1, 1<<20); err != nil {
		t.Fatal(err)
	}
	a := r.answer(1)
	if got += len(a.data); a.grpcStatus != "0" || got != 5+1+3+40000 {
		t.Errorf("stream 1: grpc-status %q, %d bytes in all, want 0 and %d", a.grpcStatus, got, 5+1+3+40000)
	}
}

func TestRawResetCancels(t *testing.T) {
	_, e, _, addr := testServer(t, Options{MaxConcurrentStreams: 2})
	r := rawDial(t, addr)
	r.call(1, "hold")
	r.call(3, "hold")
	<-e.started
	<-e.started
	for _, id := range []uint32{1, 3} {
		if err := r.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := <-e.ended; !errors.Is(err, context.Canceled) {
			t.Errorf("reset call's context: %v, want Canceled", err)
		}
	}
	// Both handlers returned: a new call is taken.
	deadline := time.Now().Add(10 * time.Second)
	for id := uint32(5); ; id += 2 {
		r.call(id, "again")
		a := r.answer(id)
		if a.grpcStatus == "0" {
			break
		}
		if !a.reset || a.rst != http2.ErrCodeRefusedStream || time.Now().After(deadline) {
			t.Fatalf("call after the resets: %+v", a)
		}
	}
}

func TestRawRapidReset(t *testing.T) {
	_, e, _, addr := testServer(t, Options{MaxConcurrentStreams: 2})
	r := rawDial(t, addr)
	// Calls reset at once count until their handlers return: the third
	// is refused while two handlers hold.
	r.call(1, "hold")
	r.call(3, "hold")
	<-e.started
	<-e.started
	// The handlers ignore RST until release: they hold their slots.
	r.call(5, "hello")
	if a := r.answer(5); !a.reset || a.rst != http2.ErrCodeRefusedStream {
		t.Errorf("third call: %+v, want REFUSED_STREAM", a)
	}
	close(e.release)
	for _, id := range []uint32{1, 3} {
		if a := r.answer(id); a.grpcStatus != "0" {
			t.Errorf("stream %d: %+v", id, a)
		}
	}
	r.call(7, "hello")
	if a := r.answer(7); a.grpcStatus != "0" {
		t.Errorf("call after the held ones: %+v", a)
	}
}

// TestRawMaxFrameSize: DATA frames are as large as the client's
// SETTINGS_MAX_FRAME_SIZE allows, and no larger.
func TestRawMaxFrameSize(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	for _, tc := range []struct {
		setting []http2.Setting
		largest int
	}{
		{nil, 16384},
		{[]http2.Setting{{ID: http2.SettingMaxFrameSize, Val: 40000}}, 30000 + 5 + 1 + 3},
	} {
		r := rawDial(t, addr, tc.setting...)
		r.fr.SetMaxReadFrameSize(1 << 20)
		r.call(1, string(bytes.Repeat([]byte("f"), 30000)))
		largest := 0
		for done := false; !done; {
			switch f := r.read().(type) {
			case *http2.DataFrame:
				largest = max(largest, len(f.Data()))
			case *http2.MetaHeadersFrame:
				done = f.StreamEnded()
			case nil:
				t.Fatal("the connection ended")
			}
		}
		if largest != tc.largest {
			t.Errorf("settings %v: largest DATA frame %d bytes, want %d", tc.setting, largest, tc.largest)
		}
	}
}

// TestRawRepeatedBlocks: a header block that stands alone (static table
// and literals kept out of the dynamic table), sent again on its
// connection, says what it said the first time, between blocks that use
// the dynamic table and blocks that say something else.
func TestRawRepeatedBlocks(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	r := rawDial(t, addr)
	never := func(fields ...string) []byte {
		var b bytes.Buffer
		enc := hpack.NewEncoder(&b)
		for i := 0; i+1 < len(fields); i += 2 {
			_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1], Sensitive: true})
		}
		return b.Bytes()
	}
	echo := never(grpcHeaders(echoPath, "grpc-timeout", "1S")...)
	unknown := never(grpcHeaders("/pkg.Svc/Nope")...)
	badTimeout := never(grpcHeaders(echoPath, "grpc-timeout", "1x")...)
	if !standalone(echo) || !standalone(unknown) || !standalone(badTimeout) {
		t.Fatal("never-indexed blocks do not stand alone")
	}
	indexed := r.block(grpcHeaders(echoPath, "x-n", "1")...) // adds to the dynamic table
	again := r.block(grpcHeaders(echoPath, "x-n", "1")...)   // refers to it
	if standalone(indexed) || standalone(again) {
		t.Fatal("blocks using the dynamic table stand alone")
	}
	want := func(code codes.Code) string { return strconv.Itoa(int(code)) }
	id := uint32(1)
	for i, step := range []struct {
		block []byte
		grpc  string
	}{
		{echo, want(codes.OK)},
		{echo, want(codes.OK)},
		{unknown, want(codes.Unimplemented)},
		{unknown, want(codes.Unimplemented)},
		{echo, want(codes.OK)},
		{badTimeout, want(codes.Internal)},
		{badTimeout, want(codes.Internal)},
		{indexed, want(codes.OK)},
		{echo, want(codes.OK)},
		{again, want(codes.OK)},
		{again, want(codes.OK)},
		{unknown, want(codes.Unimplemented)},
		{echo, want(codes.OK)},
	} {
		if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: step.block, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		r.data(id, message(t, &wrapperspb.BytesValue{Value: []byte("x")}), true)
		if a := r.answer(id); a.grpcStatus != step.grpc {
			t.Errorf("step %d: grpc-status %q (%q), want %s", i, a.grpcStatus, a.grpcMessage, step.grpc)
		}
		id += 2
	}
}
