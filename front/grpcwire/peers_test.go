package grpcwire

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestPeers: a connection from outside Options.Peers is closed at once,
// unanswered, and reported; one from inside is served.
func TestPeers(t *testing.T) {
	var mu sync.Mutex
	var refused []string
	_, _, _, addr := testServer(t, Options{Peers: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, Refused: func(a net.Addr) {
		mu.Lock()
		refused = append(refused, a.(*net.TCPAddr).IP.String())
		mu.Unlock()
	}})
	from := func(ip string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	c := from("127.0.0.1")
	_, _ = io.WriteString(c, clientPreface)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	// Closed with the preface unread, the connection may end in a reset
	// rather than an EOF: either is closed.
	if n, err := io.Copy(io.Discard, c); n != 0 || err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a peer outside Peers read %d bytes (%v), want none and the connection closed", n, err)
	}
	mu.Lock()
	got := append([]string(nil), refused...)
	mu.Unlock()
	if len(got) != 1 || got[0] != "127.0.0.1" {
		t.Errorf("refused %v, want [127.0.0.1]", got)
	}

	r := rawConnectConn(t, from("127.0.0.2"))
	r.handshake()
	r.call(1, "trusted")
	if a := r.answer(1); a.grpcStatus != "0" {
		t.Errorf("a call from a peer inside Peers: %+v", a)
	}
}
