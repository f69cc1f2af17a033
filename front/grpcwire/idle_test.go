package grpcwire

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// idleKind is a frame that moves nothing forward: setup readies the
// connection, frame writes the n-th (counting from 0).
type idleKind struct {
	name  string
	setup func(r *raw)
	frame func(r *raw, fr *http2.Framer, n uint32) error
}

// idleKinds are the frames that move nothing forward, each written by
// frame (n counting from 0) after setup on the connection.
var idleKinds = []idleKind{
	{"empty CONTINUATION", func(r *raw) {
		r.open = r.block(grpcHeaders(echoPath)...)
		_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.open[:1]})
	}, func(_ *raw, fr *http2.Framer, _ uint32) error { return fr.WriteContinuation(1, false, nil) }},
	{"empty DATA", func(r *raw) { r.headers(1, false, grpcHeaders(echoPath)...) },
		func(_ *raw, fr *http2.Framer, _ uint32) error { return fr.WriteData(1, false, nil) }},
	{"WINDOW_UPDATE of 0 on a stream", func(r *raw) { r.headers(1, false, grpcHeaders(echoPath)...) },
		func(_ *raw, fr *http2.Framer, _ uint32) error { return fr.WriteWindowUpdate(1, 0) }},
	{"WINDOW_UPDATE on a stream gone", func(r *raw) { r.call(1, "x"); r.answer(1) },
		func(_ *raw, fr *http2.Framer, _ uint32) error { return fr.WriteWindowUpdate(1, 1) }},
	{"RST_STREAM on a stream gone", func(r *raw) { r.call(1, "x"); r.answer(1) },
		func(_ *raw, fr *http2.Framer, _ uint32) error { return fr.WriteRSTStream(1, http2.ErrCodeCancel) }},
	{"PRIORITY", nil, func(_ *raw, fr *http2.Framer, n uint32) error {
		return fr.WritePriority(2*n+101, http2.PriorityParam{Weight: 15})
	}},
	{"unknown type", nil, func(_ *raw, fr *http2.Framer, _ uint32) error { return fr.WriteRawFrame(0x20, 0, 0, []byte{1}) }},
	{"SETTINGS", nil, func(_ *raw, fr *http2.Framer, _ uint32) error { return fr.WriteSettings() }},
	{"SETTINGS ACK never asked for", nil, func(_ *raw, fr *http2.Framer, _ uint32) error { return fr.WriteSettingsAck() }},
	{"PING", nil, func(_ *raw, fr *http2.Framer, n uint32) error { return fr.WritePing(false, [8]byte{byte(n)}) }},
	{"PING ACK never asked for", nil, func(_ *raw, fr *http2.Framer, n uint32) error { return fr.WritePing(true, [8]byte{byte(n)}) }},
	{"GOAWAY again", func(r *raw) {
		r.headers(1, false, grpcHeaders(echoPath)...) // a call in flight keeps the connection
		_ = r.fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	}, func(_ *raw, fr *http2.Framer, _ uint32) error { return fr.WriteGoAway(0, http2.ErrCodeNo, nil) }},
}

// writeIdle writes n frames of kind k at once.
func writeIdle(t *testing.T, r *raw, k int, n int) {
	t.Helper()
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	fr.AllowIllegalWrites = true
	for i := range n {
		if err := idleKinds[k].frame(r, fr, uint32(i)); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = r.c.Write(buf.Bytes())
}

// TestIdleFrameFlood: more than maxIdleFrames frames that move nothing
// forward, within a second, end the connection with GOAWAY
// ENHANCE_YOUR_CALM.
func TestIdleFrameFlood(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	for k, kind := range idleKinds {
		t.Run(kind.name, func(t *testing.T) {
			r := rawDial(t, addr)
			if kind.setup != nil {
				kind.setup(r)
			}
			writeIdle(t, r, k, maxIdleFrames+10)
			if g := r.goAway(); g.ErrCode != http2.ErrCodeEnhanceYourCalm {
				t.Errorf("GOAWAY %v, want ENHANCE_YOUR_CALM", g.ErrCode)
			}
		})
	}
}

// TestIdleFramesAllowed: a client's few such frames (keep-alive PINGs,
// a late WINDOW_UPDATE) are answered as ever, and calls, however many,
// never count.
func TestIdleFramesAllowed(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	for k, kind := range idleKinds {
		if kind.name == "GOAWAY again" {
			continue // the connection goes once its call is answered
		}
		t.Run(kind.name, func(t *testing.T) {
			r := rawDial(t, addr)
			if kind.setup != nil {
				kind.setup(r)
			}
			writeIdle(t, r, k, maxIdleFrames/2)
			if r.open != nil {
				// The header block the CONTINUATIONs left open ends.
				_ = r.fr.WriteContinuation(1, true, r.open[1:])
			}
			for id := uint32(101); id < 101+2*2*maxIdleFrames; id += 2 {
				r.call(id, "after")
				if a := r.answer(id); a.grpcStatus != "0" {
					t.Fatalf("call %d after %d %s frames: %+v", id, maxIdleFrames/2, kind.name, a)
				}
			}
		})
	}
}

// TestPingsAsAnswersArrive: a client that pings each time an answer
// arrives, as grpc-go's BDP estimator does, is not cut off however many
// calls it makes within idleWindow; only the first PING after an answer
// is let be, so a burst of them after one still ends the connection.
func TestPingsAsAnswersArrive(t *testing.T) {
	_, _, _, addr := testServer(t, Options{})
	r := rawDial(t, addr)
	start := time.Now()
	const calls = maxIdleFrames + 100
	for i := range calls {
		id := uint32(2*i + 1)
		r.call(id, "x")
		for done := false; !done; {
			switch f := r.read().(type) {
			case nil:
				t.Fatalf("the connection ended after %d calls, each followed by a PING", i)
			case *http2.GoAwayFrame:
				t.Fatalf("GOAWAY %v after %d calls, each followed by a PING", f.ErrCode, i)
			case *http2.MetaHeadersFrame:
				done = f.StreamID == id && f.StreamEnded()
			}
		}
		if err := r.fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d calls, each followed by a PING, in %v", calls, time.Since(start))

	r = rawDial(t, addr)
	r.call(1, "x")
	if a := r.answer(1); a.grpcStatus != "0" {
		t.Fatalf("call answered %+v", a)
	}
	writeIdle(t, r, slices.IndexFunc(idleKinds, func(k idleKind) bool { return k.name == "PING" }), maxIdleFrames+10)
	if g := r.goAway(); g.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("GOAWAY %v after an answer and %d PINGs, want ENHANCE_YOUR_CALM", g.ErrCode, maxIdleFrames+10)
	}
}
