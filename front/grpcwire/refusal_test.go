package grpcwire

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/authlimit/authlimit/internal/membudget"
)

// event is a frame as the raw client read it, its bytes copied (the
// framer reuses its buffer).
type event struct {
	typ    http2.FrameType
	stream uint32
	end    bool // END_STREAM
	ack    bool
	data   []byte
	code   http2.ErrCode
	fields map[string]string
	val    uint32 // a WINDOW_UPDATE's increment
}

// next reads the next frame as an event.
func (r *raw) next() event {
	r.t.Helper()
	f := r.read()
	if f == nil {
		r.t.Fatal("the connection ended")
	}
	e := event{typ: f.Header().Type, stream: f.Header().StreamID}
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		e.end = f.StreamEnded()
		e.fields = map[string]string{}
		for _, hf := range f.Fields {
			e.fields[hf.Name] = hf.Value
		}
	case *http2.DataFrame:
		e.end, e.data = f.StreamEnded(), bytes.Clone(f.Data())
	case *http2.RSTStreamFrame:
		e.code = f.ErrCode
	case *http2.GoAwayFrame:
		e.code = f.ErrCode
	case *http2.SettingsFrame:
		e.ack = f.IsAck()
	case *http2.PingFrame:
		e.ack, e.data = f.IsAck(), bytes.Clone(f.Data[:])
	case *http2.WindowUpdateFrame:
		e.val = f.Increment
	}
	return e
}

// until reads events until done says so of the last, and returns them
// all.
func (r *raw) until(done func(e event) bool) []event {
	r.t.Helper()
	var evs []event
	for {
		e := r.next()
		evs = append(evs, e)
		if done(e) {
			return evs
		}
	}
}

// roundTrip sends a PING and returns what came before its ACK: the
// server has handled every frame sent before it.
func (r *raw) roundTrip() []event {
	r.t.Helper()
	data := [8]byte{'r', 'o', 'u', 'n', 'd'}
	if err := r.fr.WritePing(false, data); err != nil {
		r.t.Fatal(err)
	}
	evs := r.until(func(e event) bool { return e.typ == http2.FramePing && e.ack && bytes.Equal(e.data, data[:]) })
	return evs[:len(evs)-1]
}

// on returns the events of stream id.
func on(evs []event, id uint32) []event {
	var out []event
	for _, e := range evs {
		if e.stream == id {
			out = append(out, e)
		}
	}
	return out
}

// plainHeaders are the request headers of a client that is not gRPC's
// (h2spec's, a browser's), with extra fields after.
func plainHeaders(method string, extra ...string) []string {
	return append([]string{":method", method, ":scheme", "http", ":path", "/", ":authority", "test"}, extra...)
}

// callAfter makes a call on stream id and fails t unless it is answered
// OK: the connection went on.
func callAfter(t *testing.T, r *raw, id uint32) {
	t.Helper()
	r.call(id, "after")
	if a := r.answer(id); a.grpcStatus != "0" {
		t.Fatalf("call after: %+v, want OK", a)
	}
}

// TestRefusedRequest: a request that is not a gRPC call is answered only
// once its client's side has ended (RFC 9113: its stream stays open, its
// body read and discarded, nothing sent on it before), with 415, a
// plain-text body and the last DATA frame ending the stream; HEAD gets no
// body.
func TestRefusedRequest(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	const body = `invalid gRPC request content-type ""` + "\n"
	for _, tc := range []struct {
		name     string
		method   string
		body     []string
		trailers bool // the client's side ends with trailers, not DATA
		head     bool
		// contentType, if set, is sent, and quoted in the answer up to
		// its first maxQuoted bytes.
		contentType string
	}{
		{name: "GET", method: "GET"},
		{name: "POST with a body in three frames", method: "POST", body: []string{"a", "bb", "ccc"}},
		{name: "POST ended by trailers", method: "POST", body: []string{"abc"}, trailers: true},
		{name: "HEAD", method: "HEAD", head: true},
		{name: "long content-type", method: "GET", contentType: strings.Repeat("t", 10000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, addr)
			want := body
			if tc.contentType != "" {
				r.headers(1, false, plainHeaders(tc.method, "content-type", tc.contentType)...)
				want = fmt.Sprintf("invalid gRPC request content-type %q\n", tc.contentType[:maxQuoted])
			} else {
				r.headers(1, false, plainHeaders(tc.method)...)
			}
			for _, b := range tc.body {
				if err := r.fr.WriteData(1, false, []byte(b)); err != nil {
					t.Fatal(err)
				}
			}
			if evs := on(r.roundTrip(), 1); len(evs) > 0 {
				t.Fatalf("before the request ended, stream 1 got %+v, want nothing", evs)
			}
			if tc.trailers {
				r.headers(1, true, "x-trailer", "1")
			} else if err := r.fr.WriteData(1, true, nil); err != nil {
				t.Fatal(err)
			}
			evs := on(r.until(func(e event) bool { return e.stream == 1 && (e.end || e.typ == http2.FrameRSTStream) }), 1)
			h := evs[0]
			if h.typ != http2.FrameHeaders || h.fields[":status"] != "415" || h.fields["content-type"] != "text/plain; charset=utf-8" || h.end != tc.head {
				t.Fatalf("answer's first frame %+v, want HEADERS :status 415, content-type text/plain, END_STREAM %v", h, tc.head)
			}
			var got []byte
			for _, e := range evs[1:] {
				if e.typ != http2.FrameData {
					t.Fatalf("answer's frame %+v, want DATA", e)
				}
				got = append(got, e.data...)
			}
			if tc.head && len(evs) != 1 || !tc.head && string(got) != want {
				t.Fatalf("answer's body %q in %d frames, want %q (none for HEAD)", got, len(evs)-1, want)
			}
			callAfter(t, r, 3)
		})
	}
}

// TestContentLength: a request whose DATA do not add up to its
// content-length is malformed, a stream error PROTOCOL_ERROR (RFC 9113,
// section 8.1.1), a call or not, found as soon as it shows; the
// connection goes on.
func TestContentLength(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	msg := message(t, &wrapperspb.BytesValue{Value: []byte("hello")})
	n := strconv.Itoa(len(msg))
	for _, tc := range []struct {
		name    string
		headers []string
		end     bool // HEADERS ends the stream
		data    [][]byte
		// trailers: the stream ends with trailers after data.
		trailers bool
		ok       bool // answered (OK for a call, 415 otherwise), not reset
	}{
		{name: "call, as long as said", headers: grpcHeaders(echoPath, "content-length", n), data: [][]byte{msg}, ok: true},
		{name: "call, longer", headers: grpcHeaders(echoPath, "content-length", "1"), data: [][]byte{msg}},
		{name: "call, shorter", headers: grpcHeaders(echoPath, "content-length", strconv.Itoa(len(msg)+1)), data: [][]byte{msg}},
		{name: "call, shorter, ended by trailers", headers: grpcHeaders(echoPath, "content-length", strconv.Itoa(len(msg)+1)), data: [][]byte{msg}, trailers: true},
		{name: "call, said twice alike", headers: grpcHeaders(echoPath, "content-length", n, "content-length", n), data: [][]byte{msg}, ok: true},
		{name: "call, said twice unlike", headers: grpcHeaders(echoPath, "content-length", n, "content-length", "1"), data: [][]byte{msg}},
		{name: "call, not a number", headers: grpcHeaders(echoPath, "content-length", "ten"), data: [][]byte{msg}},
		{name: "call, signed", headers: grpcHeaders(echoPath, "content-length", "+"+n), data: [][]byte{msg}},
		{name: "POST, one DATA longer", headers: plainHeaders("POST", "content-length", "1"), data: [][]byte{[]byte("test")}},
		{name: "POST, two DATA longer", headers: plainHeaders("POST", "content-length", "5"), data: [][]byte{[]byte("test"), []byte("test")}},
		{name: "POST, as long as said", headers: plainHeaders("POST", "content-length", "8"), data: [][]byte{[]byte("test"), []byte("test")}, ok: true},
		{name: "GET, no DATA, said 4", headers: plainHeaders("GET", "content-length", "4"), end: true},
		{name: "GET, no DATA, said 0", headers: plainHeaders("GET", "content-length", "0"), end: true, ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, addr)
			r.headers(1, tc.end, tc.headers...)
			for i, d := range tc.data {
				if err := r.fr.WriteData(1, i == len(tc.data)-1 && !tc.trailers, d); err != nil {
					t.Fatal(err)
				}
			}
			if tc.trailers {
				r.headers(1, true, "x-trailer", "1")
			}
			a := r.answer(1)
			switch {
			case tc.ok && (a.reset || a.httpStatus != "200" && a.httpStatus != "415"):
				t.Fatalf("answer %+v, want an answer", a)
			case !tc.ok && (!a.reset || a.rst != http2.ErrCodeProtocol):
				t.Fatalf("answer %+v, want RST_STREAM PROTOCOL_ERROR", a)
			}
			callAfter(t, r, 3)
		})
	}
}

// TestStreamWindowOverflow: WINDOW_UPDATEs that take a stream's send
// window beyond 2^31-1 are a stream error FLOW_CONTROL_ERROR (RFC 9113,
// section 6.9.1), whether the stream is a call or a request refused,
// still open; the connection goes on.
func TestStreamWindowOverflow(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	for _, tc := range []struct {
		name    string
		headers []string
	}{
		{"call", grpcHeaders(echoPath)},
		{"GET", plainHeaders("GET")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawDial(t, addr)
			r.headers(1, false, tc.headers...)
			for range 2 {
				if err := r.fr.WriteWindowUpdate(1, maxWindow); err != nil {
					t.Fatal(err)
				}
			}
			if a := r.answer(1); !a.reset || a.rst != http2.ErrCodeFlowControl {
				t.Fatalf("answer %+v, want RST_STREAM FLOW_CONTROL_ERROR", a)
			}
			callAfter(t, r, 3)
		})
	}
}

// TestConcurrentStreamsRefused: requests refused (not gRPC calls) count
// against SETTINGS_MAX_CONCURRENT_STREAMS while their answers wait for
// the client's window, as calls do; a stream beyond the limit is reset
// REFUSED_STREAM (RFC 9113, section 5.1.2), and once one is answered a
// new one is taken.
func TestConcurrentStreamsRefused(t *testing.T) {
	_, _, _, addr := testServer(t, Options{MaxConcurrentStreams: 3})
	r := rawDial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.headers(1, true, plainHeaders("GET")...)
	r.headers(3, true, plainHeaders("GET")...)
	r.call(5, "waits for the window")
	r.headers(7, true, plainHeaders("GET")...)
	evs := r.until(func(e event) bool { return e.stream == 7 })
	if e := evs[len(evs)-1]; e.typ != http2.FrameRSTStream || e.code != http2.ErrCodeRefusedStream {
		t.Fatalf("stream 7, the fourth: %+v, want RST_STREAM REFUSED_STREAM", e)
	}
	for _, e := range evs[:len(evs)-1] {
		if e.stream != 0 && (e.typ != http2.FrameHeaders || e.end) {
			t.Fatalf("with no window, stream %d got %+v, want its headers alone", e.stream, e)
		}
	}
	if err := r.fr.WriteWindowUpdate(1, 1000); err != nil {
		t.Fatal(err)
	}
	r.until(func(e event) bool { return e.stream == 1 && e.typ == http2.FrameData && e.end })
	r.headers(9, true, plainHeaders("GET")...)
	if e := r.until(func(e event) bool { return e.stream == 9 })[0]; e.typ == http2.FrameRSTStream {
		t.Fatalf("stream 9, after stream 1 was answered: %+v, want its answer", e)
	}
}

// TestHalfClosedRemote: on a stream whose client's side has ended and
// whose answer waits for the window, WINDOW_UPDATE and PRIORITY are
// taken (RFC 9113, section 5.1: the window opens and the answer flows),
// and DATA is a stream error STREAM_CLOSED.
func TestHalfClosedRemote(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	r := rawDial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.headers(1, true, plainHeaders("GET")...)
	if err := r.fr.WritePriority(1, http2.PriorityParam{Weight: 255}); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteWindowUpdate(1, 1); err != nil {
		t.Fatal(err)
	}
	evs := on(r.until(func(e event) bool { return e.stream == 1 && e.typ != http2.FrameHeaders }), 1)
	if e := evs[len(evs)-1]; e.typ != http2.FrameData || len(e.data) != 1 || e.end {
		t.Fatalf("after WINDOW_UPDATE of 1: %+v, want DATA of 1 byte", e)
	}
	if err := r.fr.WriteData(1, false, []byte("late")); err != nil {
		t.Fatal(err)
	}
	evs = on(r.until(func(e event) bool { return e.stream == 1 }), 1)
	if e := evs[0]; e.typ != http2.FrameRSTStream || e.code != http2.ErrCodeStreamClosed {
		t.Fatalf("after DATA on a half-closed (remote) stream: %+v, want RST_STREAM STREAM_CLOSED", e)
	}
	if err := r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 16}); err != nil {
		t.Fatal(err)
	}
	callAfter(t, r, 3)
}

// TestSettingsAckFirst: a SETTINGS that opens the windows is acknowledged
// before the DATA it lets go.
func TestSettingsAckFirst(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	r := rawDial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.headers(1, true, plainHeaders("GET")...)
	r.until(func(e event) bool { return e.stream == 1 && e.typ == http2.FrameHeaders })
	if err := r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1}); err != nil {
		t.Fatal(err)
	}
	evs := r.until(func(e event) bool { return e.stream == 1 && e.typ == http2.FrameData })
	acked := false
	for _, e := range evs {
		acked = acked || e.typ == http2.FrameSettings && e.ack
	}
	if d := evs[len(evs)-1]; !acked || len(d.data) != 1 {
		t.Fatalf("after SETTINGS_INITIAL_WINDOW_SIZE 1: %+v, want SETTINGS ACK, then DATA of 1 byte", evs)
	}
}

// TestRefusedBodyBounded: the body of a request refused is discarded as
// it comes: the stream holds its streamCost of the budget and no more,
// its window is never returned (a byte beyond it is a stream error
// FLOW_CONTROL_ERROR), and it is reset CANCEL when it outlives
// RequestTimeout; every byte comes back to the budget.
func TestRefusedBodyBounded(t *testing.T) {
	b := membudget.New(1 << 20)
	_, _, _, addr := testServer(t, Options{Budget: b, RequestTimeout: 500 * time.Millisecond})
	r := rawDial(t, addr)
	r.headers(1, false, plainHeaders("POST")...)
	r.data(1, bytes.Repeat([]byte{'b'}, streamWindow), false)
	for _, e := range r.roundTrip() {
		if e.stream == 1 {
			t.Fatalf("while its body came, stream 1 got %+v, want nothing", e)
		}
	}
	if used := b.Used(); used != streamCost {
		t.Fatalf("with 1 MiB of body discarded, the budget holds %d, want the stream's %d", used, streamCost)
	}
	if err := r.fr.WriteData(1, false, []byte{'x'}); err != nil {
		t.Fatal(err)
	}
	if a := r.answer(1); !a.reset || a.rst != http2.ErrCodeFlowControl {
		t.Fatalf("a byte beyond the stream's window: %+v, want RST_STREAM FLOW_CONTROL_ERROR", a)
	}
	waitUsed(t, b, 0)
	// A request refused that never ends is reset after RequestTimeout.
	r.headers(3, false, plainHeaders("GET")...)
	start := time.Now()
	if a := r.answer(3); !a.reset || a.rst != http2.ErrCodeCancel {
		t.Fatalf("a request refused past RequestTimeout: %+v, want RST_STREAM CANCEL", a)
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("reset after %v, before the timeout", took)
	}
	waitUsed(t, b, 0)
	callAfter(t, r, 5)
}
