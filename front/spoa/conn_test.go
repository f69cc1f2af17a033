package spoa

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/internal/membudget"
)

// TestHandshake: AGENT-HELLO answers with version 2.0, the lesser
// max-frame-size and the capabilities pipelining and async; NOTIFY frames
// follow. A health check's hello is answered, then the connection closes.
func TestHandshake(t *testing.T) {
	e := newEcho(false)
	var accepted atomic.Int64
	addr, _ := startServer(t, e, func(o *Options) {
		o.MaxFrameSize = 20000
		o.Accepted = func() { accepted.Add(1) }
	})
	for _, tt := range []struct {
		haproxy, want uint64
	}{{16380, 16380}, {65532, 20000}, {256, 256}} {
		p := dial(t, addr)
		items := p.hello(tt.haproxy)
		if v := items["version"]; v.typ != dataString || string(v.b) != "2.0" {
			t.Errorf("version %+v, want the string 2.0", v)
		}
		if v := items["max-frame-size"]; v.typ != dataUint32 || v.n != tt.want {
			t.Errorf("HAProxy's max-frame-size %d: the agent's %+v, want %d", tt.haproxy, v, tt.want)
		}
		if v := items["capabilities"]; v.typ != dataString || string(v.b) != "pipelining,async" {
			t.Errorf("capabilities %q, want pipelining,async", v.b)
		}
		msgs := encodeMessage("authlimit", str("method", "GET"))
		p.write(frameNotify, flagFin, 1, 1, msgs)
		if sid, fid, vars := p.ack(); sid != 1 || fid != 1 || !bytes.Equal(vars["msgs"].b, msgs) {
			t.Errorf("ACK of stream 1 frame 1: stream %d frame %d, variables %v", sid, fid, vars)
		}
	}

	p := dial(t, addr)
	p.write(frameHAProxyHello, flagFin, 0, 0, helloPayload(16380, append(appendString(nil, "healthcheck"), dataBool|dataTrue)...))
	if h, _ := p.readKVFrame(); h.typ != frameAgentHello {
		t.Fatalf("health check: frame of type %d, want AGENT-HELLO", h.typ)
	}
	p.closed()
	if got := accepted.Load(); got != 4 {
		t.Errorf("Accepted called %d times, want 4", got)
	}
}

// TestHelloRefused: a HAPROXY-HELLO that is missing an item, offers no SPOP
// 2, or is not a HAPROXY-HELLO at all is answered with AGENT-DISCONNECT
// and its status, then the connection closes.
func TestHelloRefused(t *testing.T) {
	var errs atomic.Int64
	addr, _ := startServer(t, newEcho(false), func(o *Options) {
		o.MaxFrameSize = 1000
		o.ProtocolError = func(int) { errs.Add(1) }
	})
	kv := func(name string, v ...byte) []byte { return append(appendString(nil, name), v...) }
	strv := func(s string) []byte { return appendString([]byte{dataString}, s) }
	tests := []struct {
		name   string
		frame  []byte
		status int
	}{
		{"no versions", frame(frameHAProxyHello, flagFin, 0, 0, append(kv("max-frame-size", appendVarint([]byte{dataUint32}, 300)...), kv("capabilities", strv("")...)...)), statusNoVersion},
		{"SPOP 1 only", frame(frameHAProxyHello, flagFin, 0, 0, append(kv("supported-versions", strv("1.0")...), kv("max-frame-size", dataUint32, 100)...)), statusBadVersion},
		{"frame size 100", frame(frameHAProxyHello, flagFin, 0, 0, append(append(kv("supported-versions", strv("2.0")...), kv("max-frame-size", dataUint32, 100)...), kv("capabilities", strv("")...)...)), statusBadFrameSize},
		{"fragmented", frame(frameHAProxyHello, 0, 0, 0, helloPayload(16380)), statusNoFragments},
		{"stream id", frame(frameHAProxyHello, flagFin, 1, 0, helloPayload(16380)), statusInvalid},
		{"NOTIFY first", frame(frameNotify, flagFin, 1, 1, encodeMessage("authlimit")), statusInvalid},
		{"truncated KV-list", frame(frameHAProxyHello, flagFin, 0, 0, helloPayload(16380)[:20]), statusInvalid},
		{"over the agent's frame size", frame(frameHAProxyHello, flagFin, 0, 0, helloPayload(16380, make([]byte, 1000)...)), statusTooBig},
		{"under 7 bytes", []byte{0, 0, 0, 6, 1, 0, 0, 0, 1, 0}, statusInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := dial(t, addr)
			if _, err := p.nc.Write(tt.frame); err != nil {
				t.Fatal(err)
			}
			p.disconnected(tt.status)
		})
	}
	if got := errs.Load(); got != int64(len(tests)) {
		t.Errorf("ProtocolError called %d times, want %d", got, len(tests))
	}
}

// TestProtocolErrors: after the handshake, each frame that breaks the
// protocol ends the connection with AGENT-DISCONNECT and its status; a
// frame of an unknown type is skipped and a NOTIFY with ABORT dropped,
// and the connection goes on.
func TestProtocolErrors(t *testing.T) {
	e := newEcho(false)
	addr, _ := startServer(t, e, func(o *Options) { o.MaxFrameSize = 1000 })
	tests := []struct {
		name   string
		frame  []byte
		status int
	}{
		{"a NOTIFY fragment", frame(frameNotify, 0, 1, 1, encodeMessage("authlimit")), statusNoFragments},
		{"an UNSET frame", frame(frameUnset, flagFin, 1, 1, encodeMessage("authlimit")), statusNoFragments},
		{"a second hello", frame(frameHAProxyHello, flagFin, 0, 0, helloPayload(1000)), statusInvalid},
		{"an ACK", frame(frameAck, flagFin, 1, 1, nil), statusInvalid},
		{"an AGENT-HELLO", frame(frameAgentHello, flagFin, 0, 0, nil), statusInvalid},
		{"over the settled frame size", frame(frameNotify, flagFin, 1, 1, make([]byte, 1000)), statusTooBig},
		{"a length of 2^32-1", []byte{0xff, 0xff, 0xff, 0xff, 3}, statusTooBig},
		{"under 7 bytes", []byte{0, 0, 0, 3, 3, 0, 0}, statusInvalid},
		{"truncated identifiers", []byte{0, 0, 0, 7, 3, 0, 0, 0, 1, 0xff, 0xff}, statusInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := dial(t, addr)
			p.hello(1000)
			if _, err := p.nc.Write(tt.frame); err != nil {
				t.Fatal(err)
			}
			p.disconnected(tt.status)
		})
	}

	p := dial(t, addr)
	p.hello(1000)
	p.write(42, flagFin, 1, 1, []byte("a frame of an unknown type"))
	p.write(frameNotify, flagFin|flagAbort, 2, 1, encodeMessage("authlimit"))
	p.write(frameNotify, flagFin, 3, 1, encodeMessage("authlimit"))
	if sid, _, _ := p.ack(); sid != 3 {
		t.Errorf("after an unknown frame and an aborted NOTIFY: ACK of stream %d, want 3", sid)
	}
	if got := len(e.got); got != 1 {
		t.Errorf("the handler saw %d NOTIFY frames, want 1 (the aborted one is dropped)", got)
	}
}

// TestDisconnect: HAPROXY-DISCONNECT is answered with AGENT-DISCONNECT,
// status 0, and the connection closes.
func TestDisconnect(t *testing.T) {
	addr, _ := startServer(t, newEcho(false), nil)
	p := dial(t, addr)
	p.hello(16380)
	b := appendString(nil, "status-code")
	b = append(b, dataUint32, 0)
	b = appendString(b, "message")
	b = appendString(append(b, dataString), "normal")
	p.write(frameHAProxyDisconnect, flagFin, 0, 0, b)
	p.disconnected(statusNormal)
}

// TestPipelining: NOTIFY frames are handed on as they come, many in
// flight on one connection, and each ACK carries its frame's identifiers
// whatever the order of the answers.
func TestPipelining(t *testing.T) {
	e := newEcho(true)
	addr, _ := startServer(t, e, nil)
	p := dial(t, addr)
	p.hello(16380)
	const n = 100
	for i := 0; i < n; i++ {
		p.write(frameNotify, flagFin, uint64(1000+i), uint64(i%3), encodeMessage("authlimit"))
	}
	eventually(t, "all frames handed on", func() bool { return e.heldCount() == n })
	e.release()
	seen := map[uint64]bool{}
	for i := 0; i < n; i++ {
		sid, fid, vars := p.ack()
		if fid != (sid-1000)%3 || seen[sid] {
			t.Fatalf("ACK %d: stream %d frame %d", i, sid, fid)
		}
		seen[sid] = true
		if want := uint64(sid - 1000); vars["n"].n != want {
			t.Errorf("ACK of stream %d carries n=%d, want %d", sid, vars["n"].n, want)
		}
	}
}

// TestInFlightBound: a connection with MaxInFlight frames unanswered reads
// no further frame until one is answered, and the bound over all
// connections holds the same way.
func TestInFlightBound(t *testing.T) {
	for _, tt := range []struct {
		name string
		mod  func(*Options)
	}{
		{"per connection", func(o *Options) { o.MaxInFlight = 4 }},
		{"over all connections", func(o *Options) { o.MaxInFlightTotal = 4 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEcho(true)
			addr, _ := startServer(t, e, tt.mod)
			p := dial(t, addr)
			p.hello(16380)
			for i := 0; i < 10; i++ {
				p.write(frameNotify, flagFin, uint64(i), 0, encodeMessage("authlimit"))
			}
			eventually(t, "4 frames handed on", func() bool { return e.heldCount() == 4 })
			time.Sleep(50 * time.Millisecond)
			if got := e.heldCount(); got != 4 {
				t.Fatalf("%d frames handed on with 4 unanswered, want 4", got)
			}
			if got := e.release(); got != 4 {
				t.Fatalf("released %d", got)
			}
			eventually(t, "the next frames handed on", func() bool { return e.heldCount() == 4 })
			e.release()
			eventually(t, "the last frames handed on", func() bool { return e.heldCount() == 2 })
			e.release()
			for i := 0; i < 10; i++ {
				p.ack()
			}
		})
	}
}

// TestTimeouts: a peer that sends no HAPROXY-HELLO is closed after
// HelloTimeout; an idle connection gets AGENT-DISCONNECT (status 2) after
// IdleTimeout; a frame whose bytes stop coming, after FrameTimeout.
func TestTimeouts(t *testing.T) {
	addr, _ := startServer(t, newEcho(false), func(o *Options) {
		o.HelloTimeout, o.IdleTimeout, o.FrameTimeout = 200*time.Millisecond, 300*time.Millisecond, 200*time.Millisecond
	})
	p := dial(t, addr)
	start := time.Now()
	p.disconnected(statusTimeout)
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("no hello: closed after %v, want about 200ms", d)
	}

	p = dial(t, addr)
	p.hello(16380)
	start = time.Now()
	p.disconnected(statusTimeout)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("idle: closed after %v, want about 300ms", d)
	}

	// A server whose idle timeout is far beyond its frame timeout, so that
	// which of the two closed the connection shows on a loaded machine too.
	addr, _ = startServer(t, newEcho(false), func(o *Options) {
		o.HelloTimeout, o.IdleTimeout, o.FrameTimeout = 5*time.Second, 20*time.Second, 200*time.Millisecond
	})
	p = dial(t, addr)
	p.hello(16380)
	f := frame(frameNotify, flagFin, 1, 1, encodeMessage("authlimit"))
	if _, err := p.nc.Write(f[:len(f)-2]); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	p.disconnected(statusTimeout)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("half a frame: closed after %v, want about 200ms (the frame timeout, not the 20s idle one)", d)
	}
}

// TestUntrustedPeer: a connection from outside Trusted is closed before a
// byte is read, and counted.
func TestUntrustedPeer(t *testing.T) {
	var refused atomic.Int64
	addr, _ := startServer(t, newEcho(false), func(o *Options) {
		o.Trusted = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		o.Refused = func() { refused.Add(1) }
	})
	for i := 0; i < 3; i++ {
		p := dial(t, addr)
		_, _ = p.nc.Write(frame(frameHAProxyHello, flagFin, 0, 0, helloPayload(16380)))
		p.closed()
	}
	if got := refused.Load(); got != 3 {
		t.Errorf("Refused called %d times, want 3", got)
	}
}

// TestUnixPeer: a peer on a Unix socket counts as UnixPeer (127.0.0.1):
// served when Trusted holds it, closed before a byte is read and counted
// when it does not.
func TestUnixPeer(t *testing.T) {
	tests := []struct {
		name    string
		trusted []netip.Prefix
		served  bool
	}{
		{"loopback trusted", loopback, true},
		{"127.0.0.1 alone trusted", []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, true},
		{"loopback not trusted", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "spoa.sock")
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			var accepted, refused atomic.Int64
			serveOn(t, l, newEcho(false), func(o *Options) {
				o.Trusted = tt.trusted
				o.Accepted = func() { accepted.Add(1) }
				o.Refused = func() { refused.Add(1) }
			})
			p := dial(t, "unix:"+sock)
			if !tt.served {
				_, _ = p.nc.Write(frame(frameHAProxyHello, flagFin, 0, 0, helloPayload(16380)))
				p.closed()
				if got := refused.Load(); got != 1 {
					t.Errorf("Refused called %d times, want 1", got)
				}
				return
			}
			p.hello(16380)
			msgs := encodeMessage("authlimit", str("method", "GET"))
			p.write(frameNotify, flagFin, 1, 1, msgs)
			if sid, fid, vars := p.ack(); sid != 1 || fid != 1 || !bytes.Equal(vars["msgs"].b, msgs) {
				t.Errorf("ACK over the Unix socket: stream %d frame %d, variables %v", sid, fid, vars)
			}
			if a, r := accepted.Load(), refused.Load(); a != 1 || r != 0 {
				t.Errorf("accepted %d, refused %d, want 1 and 0", a, r)
			}
		})
	}
}

// TestLargeFrames: a frame larger than the read buffer is read into a
// buffer from the budget, given back once handled; with the budget spent
// by holders none of which holds as much as the frame needs (none can be
// evicted for it), the connection waits FrameTimeout, then says
// AGENT-DISCONNECT with status 13.
func TestLargeFrames(t *testing.T) {
	b := membudget.New(64 << 10)
	e := newEcho(false)
	addr, _ := startServer(t, e, func(o *Options) { o.Budget, o.FrameTimeout = b, 200*time.Millisecond })
	p := dial(t, addr)
	p.hello(65532)
	big := encodeMessage("authlimit", str("headers", string(bytes.Repeat([]byte{'h'}, 40<<10))))
	for i := 0; i < 3; i++ {
		p.write(frameNotify, flagFin, uint64(i), 1, big)
		if _, _, vars := p.ack(); !bytes.Equal(vars["msgs"].b, big) {
			t.Fatalf("large frame %d: the handler saw %d bytes, want %d", i, len(vars["msgs"].b), len(big))
		}
	}
	eventually(t, "the budget given back", func() bool { return b.Used() == 0 })
	others := []*membudget.Holder{b.Holder(func() {}), b.Holder(func() {})}
	for _, h := range others {
		if !h.Take(20 << 10) {
			t.Fatal("Take")
		}
	}
	p.write(frameNotify, flagFin, 9, 1, big)
	p.disconnected(statusResources)
	for _, h := range others {
		h.Close()
	}
}

// TestBudgetShared: a large frame's bytes count in the budget the other
// ports share (AUTHLIMIT_MAX_BUFFERED_BYTES) while it is read, and an
// agent connection that holds the most when another port's request needs
// room is the one closed, its bytes given back.
func TestBudgetShared(t *testing.T) {
	b := membudget.New(64 << 10)
	addr, _ := startServer(t, newEcho(false), func(o *Options) { o.Budget = b })
	p := dial(t, addr)
	p.hello(65532)
	big := encodeMessage("authlimit", str("headers", string(bytes.Repeat([]byte{'h'}, 40<<10))))
	f := frame(frameNotify, flagFin, 1, 1, big)
	// The frame's length and its first bytes: the agent takes room for
	// all of it and waits for the rest.
	if _, err := p.nc.Write(f[:1024]); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the frame's bytes counted in the shared budget", func() bool { return b.Used() >= 40<<10 })
	evicted := make(chan struct{})
	other := b.Holder(func() { close(evicted) })
	defer other.Close()
	if !other.Take(40 << 10) {
		t.Fatal("another port's request was refused room the agent's connection held")
	}
	p.closed()
	eventually(t, "the agent's bytes given back", func() bool { return b.Used() == 40<<10 })
	select {
	case <-evicted:
		t.Fatal("the other holder was evicted, not the agent's connection")
	default:
	}
}

// TestShutdown: Shutdown stops accepting, lets the frames in flight be
// answered, then says AGENT-DISCONNECT with status 0 and closes.
func TestShutdown(t *testing.T) {
	e := newEcho(true)
	addr, s := startServer(t, e, nil)
	p := dial(t, addr)
	p.hello(16380)
	p.write(frameNotify, flagFin, 1, 1, encodeMessage("authlimit"))
	eventually(t, "the frame handed on", func() bool { return e.heldCount() == 1 })
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("Shutdown still accepts connections")
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a frame in flight", err)
	default:
	}
	e.release()
	if sid, _, _ := p.ack(); sid != 1 {
		t.Errorf("ACK of stream %d, want 1", sid)
	}
	p.disconnected(statusNormal)
	if err := <-done; err != nil {
		t.Errorf("Shutdown = %v", err)
	}

	// A frame never answered: Shutdown gives up at its context's end.
	e2 := newEcho(true)
	addr, s = startServer(t, e2, nil)
	p = dial(t, addr)
	p.hello(16380)
	p.write(frameNotify, flagFin, 1, 1, encodeMessage("authlimit"))
	eventually(t, "the frame handed on", func() bool { return e2.heldCount() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); err != context.DeadlineExceeded {
		t.Errorf("Shutdown with an unanswered frame = %v, want DeadlineExceeded", err)
	}
	p.closed()
	e2.release() // after the close: dropped
}

// TestSlowReader: a peer that stops reading its ACKs holds at most the
// agent's pending bound: the agent stops reading its frames, then closes
// the connection once a write has waited WriteTimeout.
func TestSlowReader(t *testing.T) {
	e := newEcho(false)
	addr, _ := startServer(t, e, func(o *Options) { o.WriteTimeout = 300 * time.Millisecond })
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.(*net.TCPConn).SetReadBuffer(4096)
	p := &peer{t: t, nc: nc}
	p.write(frameHAProxyHello, flagFin, 0, 0, helloPayload(16380))
	big := encodeMessage("authlimit", str("x", string(bytes.Repeat([]byte{'x'}, 3000))))
	// Frames go until the agent stops reading them and the socket fills,
	// or the agent closes.
	_ = nc.SetWriteDeadline(time.Now().Add(15 * time.Second))
	sent := 0
	f := frame(frameNotify, flagFin, 1, 1, big)
	for ; sent < 1<<20; sent++ {
		if _, err := nc.Write(f); err != nil {
			break
		}
	}
	if sent >= 1<<20 {
		t.Fatal("the agent kept reading frames whose answers nobody read")
	}
	if got := len(e.got); got*len(f) > 8<<20 {
		t.Errorf("the agent read %d frames (%d MiB) whose answers nobody read", got, got*len(f)>>20)
	}
}

// TestSendTooLarge: actions over Room end the connection rather than go
// out as an ACK that drops them.
func TestSendTooLarge(t *testing.T) {
	h := handlerFunc(func(_ []byte, r Reply) { r.Send(make([]byte, r.Room()+1)) })
	addr, _ := startServer(t, h, nil)
	p := dial(t, addr)
	p.hello(300)
	p.write(frameNotify, flagFin, 1, 1, encodeMessage("authlimit"))
	p.closed()
}

type handlerFunc func([]byte, Reply)

func (f handlerFunc) Notify(b []byte, r Reply) { f(b, r) }

// TestFrameLength: the length prefix counts the frame's bytes after it.
func TestFrameLength(t *testing.T) {
	b, at := startFrame([]byte("xx"), frameAck, 1, 2)
	b = endFrame(append(b, 'a', 'b'), at)
	if got := binary.BigEndian.Uint32(b[2:]); int(got) != len(b)-6 {
		t.Errorf("length %d, want %d", got, len(b)-6)
	}
}

// TestWriteAfterLargeBuffer: once a buffer grown past maxPending is
// written, the next write hands the socket bytes no answer completed
// meanwhile writes over. An answer appended while that write waits on the
// socket (as Reply.Send does with c.mu free) leaves the bytes being
// written as they were.
func TestWriteAfterLargeBuffer(t *testing.T) {
	s, err := NewServer(Options{Handler: newEcho(false), Trusted: loopback})
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	w := &hookConn{Conn: a}
	c := newConn(s, w)
	c.wbuf = append(make([]byte, 0, maxPending+1), "large"...)
	c.spare = make([]byte, 0, 1024)

	c.mu.Lock()
	if !c.writeLocked() {
		t.Fatal("first write failed")
	}
	c.wbuf = append(c.wbuf, "first answer"...)
	w.during = func() {
		c.mu.Lock()
		c.wbuf = append(c.wbuf, "later answer"...)
		c.mu.Unlock()
	}
	if !c.writeLocked() {
		t.Fatal("second write failed")
	}
	c.mu.Unlock()
	if got, want := string(w.writes[1]), "first answer"; got != want {
		t.Errorf("second write sent %q, want %q", got, want)
	}
}

// hookConn records what each Write is given, after calling during (if set)
// as the write would wait on the socket.
type hookConn struct {
	net.Conn
	during func()
	writes [][]byte
}

func (h *hookConn) Write(b []byte) (int, error) {
	if h.during != nil {
		h.during()
	}
	h.writes = append(h.writes, bytes.Clone(b))
	return len(b), nil
}

func (h *hookConn) SetWriteDeadline(time.Time) error { return nil }

// socketConn is an agent connection on one end of a loopback TCP
// connection, and the other end (HAProxy's), both closed when t ends.
func socketConn(t *testing.T) (*conn, net.Conn) {
	t.Helper()
	s, err := NewServer(Options{Handler: newEcho(false), Trusted: loopback})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	peer, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = peer.Close() })
	nc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c := newConn(s, nc)
	t.Cleanup(c.close)
	if c.now == nil {
		t.Skip("no write without waiting on this platform")
	}
	return c, peer
}

// TestWriteNowRest: what the socket does not take at once stays first in
// the buffer, before an answer buffered after it, and goes out whole
// once the peer reads: the peer gets every byte, in order.
func TestWriteNowRest(t *testing.T) {
	c, peer := socketConn(t)
	// More than the two sockets' buffers hold (Linux grows each to a
	// few MiB at most).
	want := make([]byte, 32<<20)
	for i := range want {
		want[i] = byte(i % 251)
	}
	c.wbuf = append(c.wbuf, want...)
	c.mu.Lock()
	if !c.writeNowLocked() {
		t.Fatal("the write failed")
	}
	rest := len(c.wbuf)
	c.wbuf = append(c.wbuf, "later answer"...)
	c.mu.Unlock()
	if rest == 0 || rest == len(want) {
		t.Fatalf("the socket took %d of %d bytes at once: want some, not all", len(want)-rest, len(want))
	}
	want = append(want, "later answer"...)

	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(want))
		_ = peer.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, _ := io.ReadFull(peer, b)
		got <- b[:n]
	}()
	c.drain()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer got %d bytes, want %d, in order", len(b), len(want))
	}
}

// TestSendInRun: answers told within a run (algo.Run) while few frames
// are in flight wait in the buffer for the run's end, and leave then in
// one write; with as many in flight as quietInFlight, an answer does not
// wait for the run.
func TestSendInRun(t *testing.T) {
	c, peer := socketConn(t)
	s := c.srv
	// frames in flight, as the reader would have counted them.
	inFlight := func(n int) {
		for range n {
			s.slots <- struct{}{}
		}
		c.mu.Lock()
		c.inflight += n
		c.mu.Unlock()
	}
	ack := func(sid uint64) []byte {
		b, at := startFrame(nil, frameAck, sid, 0)
		return endFrame(append(b, "actions"...), at)
	}
	// silent reports whether the peer gets nothing for a while.
	silent := func() bool {
		_ = peer.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, _ := peer.Read(make([]byte, 1))
		return n == 0
	}

	inFlight(2)
	run := new(algo.Run)
	Reply{c: c, sid: 1}.SendIn(run, []byte("actions"))
	Reply{c: c, sid: 2}.SendIn(run, []byte("actions"))
	if !silent() {
		t.Fatal("an answer told within a run left before the run's end")
	}
	run.End()
	want := append(ack(1), ack(2)...)
	got := make([]byte, 2*len(want))
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := peer.Read(got)
	if err != nil || !bytes.Equal(got[:n], want) {
		t.Fatalf("at the run's end the peer read %q, %v; want both answers at once, %q", got[:n], err, want)
	}

	inFlight(quietInFlight + 1)
	run = new(algo.Run)
	Reply{c: c, sid: 3}.SendIn(run, []byte("actions"))
	want = ack(3)
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(peer, got[:len(want)]); err != nil || !bytes.Equal(got[:len(want)], want) {
		t.Fatalf("with %d frames in flight the peer read %q, %v; want the answer before the run's end", quietInFlight+1, got[:len(want)], err)
	}
	run.End()
}
