package spoa

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// FuzzConn feeds arbitrary bytes after HAProxy 2.6's HAPROXY-HELLO to the
// agent deciding on the memory store: it never panics nor hangs; whatever
// it answers is whole frames; once the peer closes its side, the agent
// closes the connection, having answered or not.
func FuzzConn(f *testing.F) {
	notify := func(sid uint64, msgs []byte) []byte { return frame(frameNotify, flagFin, sid, 1, msgs) }
	good := get("203.0.113.7", "/api?x=1", "X-Api-Key", "k1", "User-Agent", "ua").spoeMessage()
	f.Add(notify(1, good))
	f.Add(append(notify(1, good), notify(2, good)...))
	f.Add(notify(1, good[:len(good)/2]))
	f.Add(frame(frameHAProxyDisconnect, flagFin, 0, 0, nil))
	f.Add(frame(frameNotify, 0, 1, 1, good))
	f.Add(frame(frameUnset, flagFin, 1, 1, good))
	f.Add(frame(42, flagFin, 1, 1, []byte("x")))
	f.Add([]byte{0, 0, 0, 7, 3, 0, 0, 0, 1, 0xf0, 0x80})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(bytes.Repeat([]byte{0}, 64))

	e := newEngine(f, "name=per-ip key=ip limit=1000000/1m; name=api key=header:X-Api-Key limit=1000000/1m path=/api cost=header:X-Cost")
	a, err := NewAgent(AgentOptions{Engine: e})
	if err != nil {
		f.Fatal(err)
	}
	addr, _ := startServer(f, a, func(o *Options) {
		o.HelloTimeout, o.FrameTimeout, o.IdleTimeout = time.Second, time.Second, 2*time.Second
	})
	hello := frame(frameHAProxyHello, flagFin, 0, 0, helloPayload(16380))

	f.Fuzz(func(t *testing.T, b []byte) {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		// The agent may close before all is written.
		_, _ = nc.Write(append(bytes.Clone(hello), b...))
		_ = nc.(*net.TCPConn).CloseWrite()
		_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		out, err := io.ReadAll(nc)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the agent kept the connection open 20s after the peer's end")
		}
		for len(out) > 0 {
			if len(out) < 4 {
				t.Fatalf("%d bytes after the last whole frame", len(out))
			}
			n := int(out[0])<<24 | int(out[1])<<16 | int(out[2])<<8 | int(out[3])
			if n > len(out)-4 || n > 16380 {
				t.Fatalf("a frame of %d bytes, %d left", n, len(out)-4)
			}
			h, ok := readHeader(out[4 : 4+n])
			if !ok || (h.typ != frameAgentHello && h.typ != frameAck && h.typ != frameAgentDisconnect) {
				t.Fatalf("frame %x is no agent's", out[4:4+n])
			}
			out = out[4+n:]
		}
	})
}

// FuzzReadRequest: any LIST-OF-MESSAGES is read without a panic, and a
// request read is one the rules can look headers up in, every line of a
// header counted.
func FuzzReadRequest(f *testing.F) {
	f.Add(get("203.0.113.7", "/api", "X-Api-Key", "k1", "x_api_key", "k2").spoeMessage())
	f.Add(get("2001:db8::1", "http://h/x", "Content-Length", "5").spoeMessage())
	f.Add(encodeMessage(MessageName, str(argMethod, "GET"), str(argURL, "*"), arg{argHeaders, []byte{dataBinary, 2, 0, 0}}))
	f.Add([]byte{9, 'a', 'u', 't', 'h', 'l', 'i', 'm', 'i', 't', 0xff})
	names := []string{"X-Api-Key", "x_api_key", "Content-Length", "X-Original-Content-Length", "X-Forwarded-For",
		"X-Forwarded-Uri", "X-Forwarded-Host", "Host", "X-Real-IP", "Connection", "User-Agent", ""}
	f.Fuzz(func(t *testing.T, msgs []byte) {
		var r request
		if kind, _ := readRequest(msgs, &r); kind != "" {
			return
		}
		h := headers{req: &r, xff: []byte("x"), proto: protoHTTP}
		for _, name := range names {
			v, n := h.Lookup(name)
			if n < 0 || n != 1 && v != nil {
				t.Errorf("Lookup(%q) = %q, %d", name, v, n)
			}
		}
		if !validBlock(r.block) {
			t.Errorf("a request read with a headers block that is not whole: %x", r.block)
		}
	})
}
