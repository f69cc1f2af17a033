package spoa

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// This file is HAProxy's side of the protocol, for the tests: a peer that
// writes frames as doc/SPOE.txt describes them, and a Handler that
// records and answers.

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// startServer serves h on a loopback port and returns the address.
func startServer(t testing.TB, h Handler, mod func(*Options)) (string, *Server) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l.Addr().String(), serveOn(t, l, h, mod)
}

// serveOn serves h on l until the test ends.
func serveOn(t testing.TB, l net.Listener, h Handler, mod func(*Options)) *Server {
	t.Helper()
	o := Options{Handler: h, Trusted: loopback}
	if mod != nil {
		mod(&o)
	}
	s, err := NewServer(o)
	if err != nil {
		_ = l.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve = %v, want ErrServerClosed", err)
		}
	})
	return s
}

// peer is HAProxy's end of a connection.
type peer struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

// dial connects to addr: host:port, or unix:<path>.
func dial(t testing.TB, addr string) *peer {
	t.Helper()
	network := "tcp"
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", path
	}
	nc, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	return &peer{t: t, nc: nc, br: bufio.NewReader(nc)}
}

// write writes a frame: its type, flags, identifiers and payload.
func (p *peer) write(typ byte, flags uint32, sid, fid uint64, payload []byte) {
	p.t.Helper()
	if _, err := p.nc.Write(frame(typ, flags, sid, fid, payload)); err != nil {
		p.t.Fatalf("write frame of type %d: %v", typ, err)
	}
}

func frame(typ byte, flags uint32, sid, fid uint64, payload []byte) []byte {
	b := []byte{0, 0, 0, 0, typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[5:], flags)
	b = appendVarint(appendVarint(b, sid), fid)
	b = append(b, payload...)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// helloPayload is HAProxy 2.6's HAPROXY-HELLO, with a max-frame-size and
// items added.
func helloPayload(maxFrame uint64, extra ...byte) []byte {
	b := appendString(nil, "supported-versions")
	b = appendString(append(b, dataString), "2.0")
	b = appendString(b, "max-frame-size")
	b = appendVarint(append(b, dataUint32), maxFrame)
	b = appendString(b, "capabilities")
	b = appendString(append(b, dataString), "pipelining,async")
	b = appendString(b, "engine-id")
	b = appendString(append(b, dataString), "4F0D3A5B-5E8E-4A63-9C9C-1A2B3C4D5E6F")
	return append(b, extra...)
}

// hello does the handshake and returns AGENT-HELLO's items.
func (p *peer) hello(maxFrame uint64) map[string]value {
	p.t.Helper()
	p.write(frameHAProxyHello, flagFin, 0, 0, helloPayload(maxFrame))
	h, items := p.readKVFrame()
	if h.typ != frameAgentHello {
		p.t.Fatalf("answer to HAPROXY-HELLO: frame of type %d (%v), want AGENT-HELLO", h.typ, items)
	}
	return items
}

// read reads a frame; ok false if the connection ended first.
func (p *peer) read() (header, bool) {
	p.t.Helper()
	var l [4]byte
	if _, err := io.ReadFull(p.br, l[:]); err != nil {
		return header{}, false
	}
	f := make([]byte, binary.BigEndian.Uint32(l[:]))
	if _, err := io.ReadFull(p.br, f); err != nil {
		p.t.Fatalf("read frame: %v", err)
	}
	h, ok := readHeader(f)
	if !ok {
		p.t.Fatalf("frame %x: malformed metadata", f)
	}
	if h.flags != flagFin {
		p.t.Errorf("frame of type %d: flags %x, want FIN alone", h.typ, h.flags)
	}
	return h, true
}

// readKVFrame reads a frame whose payload is a KV-list.
func (p *peer) readKVFrame() (header, map[string]value) {
	p.t.Helper()
	h, ok := p.read()
	if !ok {
		p.t.Fatal("the agent closed the connection")
	}
	items := map[string]value{}
	for b := h.payload; len(b) > 0; {
		item, n := readKV(b)
		if n == 0 {
			p.t.Fatalf("frame of type %d: malformed KV-list %x", h.typ, h.payload)
		}
		items[string(item.name)] = item.v
		b = b[n:]
	}
	if h.sid != 0 || h.fid != 0 {
		p.t.Errorf("frame of type %d: stream %d, frame %d, want 0 and 0", h.typ, h.sid, h.fid)
	}
	return h, items
}

// disconnected reads AGENT-DISCONNECT, checks its status and message, and
// checks that the connection then ends.
func (p *peer) disconnected(status int) {
	p.t.Helper()
	h, items := p.readKVFrame()
	if h.typ != frameAgentDisconnect {
		p.t.Fatalf("frame of type %d, want AGENT-DISCONNECT (status %d)", h.typ, status)
	}
	if got := items["status-code"]; got.typ != dataUint32 || got.n != uint64(status) {
		p.t.Errorf("AGENT-DISCONNECT status-code %+v, want %d", got, status)
	}
	if got := items["message"]; got.typ != dataString || string(got.b) != statusMessages[status] {
		p.t.Errorf("AGENT-DISCONNECT message %q, want %q", got.b, statusMessages[status])
	}
	p.closed()
}

// closed checks that the agent closes the connection without another
// frame.
func (p *peer) closed() {
	p.t.Helper()
	if h, ok := p.read(); ok {
		p.t.Fatalf("a frame of type %d after the end", h.typ)
	}
}

// ack reads an ACK and returns its identifiers and the variables it sets.
func (p *peer) ack() (sid, fid uint64, vars map[string]value) {
	p.t.Helper()
	h, ok := p.read()
	if !ok {
		p.t.Fatal("the agent closed the connection instead of answering")
	}
	if h.typ != frameAck {
		p.t.Fatalf("frame of type %d, want ACK", h.typ)
	}
	return h.sid, h.fid, actions(p.t, h.payload)
}

// actions reads a LIST-OF-ACTIONS of set-var actions on txn variables.
func actions(t testing.TB, b []byte) map[string]value {
	t.Helper()
	vars := map[string]value{}
	for len(b) > 0 {
		if len(b) < 3 || b[0] != actionSetVar || b[1] != 3 || b[2] != scopeTxn {
			t.Fatalf("action %x: not a set-var of a txn variable", b)
		}
		name, n := readBytes(b[3:])
		if n == 0 {
			t.Fatalf("action %x: no name", b)
		}
		v, k := readValue(b[3+n:])
		if k == 0 {
			t.Fatalf("action %x: no value", b)
		}
		if _, dup := vars[string(name)]; dup {
			t.Errorf("variable %s set twice", name)
		}
		vars[string(name)] = v
		b = b[3+n+k:]
	}
	return vars
}

// arg is an argument of a test's message.
type arg struct {
	name string
	v    []byte // its typed data
}

func str(name, s string) arg { return arg{name, appendString([]byte{dataString}, s)} }

// encodeMessage encodes a message of a LIST-OF-MESSAGES.
func encodeMessage(name string, args ...arg) []byte {
	b := appendString(nil, name)
	b = append(b, byte(len(args)))
	for _, a := range args {
		b = append(appendString(b, a.name), a.v...)
	}
	return b
}

// echo answers each NOTIFY with its messages' bytes in a variable, or,
// when hold is set, keeps the Replies for the test to answer.
type echo struct {
	mu      sync.Mutex
	hold    bool
	held    []Reply
	got     chan []byte
	answers int
}

func newEcho(hold bool) *echo { return &echo{hold: hold, got: make(chan []byte, 1<<16)} }

func (e *echo) Notify(msgs []byte, r Reply) {
	e.got <- append([]byte(nil), msgs...)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.hold {
		e.held = append(e.held, r)
		return
	}
	r.Send(appendSetVar(nil, "msgs", msgs))
	e.answers++
}

// release answers the held Replies, the last first.
func (e *echo) release() int {
	e.mu.Lock()
	held := e.held
	e.held = nil
	e.mu.Unlock()
	for i := len(held) - 1; i >= 0; i-- {
		held[i].Send(appendSetVarInt(nil, "n", uint32(i)))
	}
	return len(held)
}

func (e *echo) heldCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.held)
}

// eventually polls cond until it holds or 10s pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s after 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
