package redistest

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParseProcAddr(t *testing.T) {
	tests := []struct {
		in   string
		ip   string
		port int
	}{
		{"0100007F:1F90", "127.0.0.1", 8080},
		{"00000000000000000000000001000000:0050", "::1", 80},
		{"0000000000000000FFFF00000100007F:18EB", "127.0.0.1", 6379},
	}
	for _, tt := range tests {
		ip, port, err := parseProcAddr(tt.in)
		if err != nil {
			t.Errorf("parseProcAddr(%q) = %v", tt.in, err)
			continue
		}
		if !ip.Equal(net.ParseIP(tt.ip)) || port != tt.port {
			t.Errorf("parseProcAddr(%q) = %v, %d; want %s, %d", tt.in, ip, port, tt.ip, tt.port)
		}
	}
}

// TestOpenConnsAndGoroutines is not parallel: it counts the process's
// goroutines.
func TestOpenConnsAndGoroutines(t *testing.T) {
	before := SnapshotGoroutines()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	var conns []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// The accepted ends point at the clients' ports, so only the three
	// dialed ends count.
	if got := OpenConns(t, addr); got != 3 {
		t.Errorf("OpenConns = %d, want 3", got)
	}
	conns[0].Close()
	if got := OpenConns(t, addr); got != 2 {
		t.Errorf("OpenConns after closing one = %d, want 2", got)
	}
	// Closing the server's ends leaves ours in CLOSE_WAIT: still counted.
	for i := 0; i < 3; i++ {
		(<-accepted).Close()
	}
	if got := OpenConns(t, addr); got != 2 {
		t.Errorf("OpenConns in CLOSE_WAIT = %d, want 2", got)
	}
	for _, c := range conns[1:] {
		c.Close()
	}
	WaitConns(t, addr, 0, time.Second)
	ln.Close()
	for c := range accepted {
		c.Close()
	}
	before.WaitBack(t, 5*time.Second)
}

// TestWaitBackReportsExtra checks the report names a goroutine started
// after the snapshot.
func TestWaitBackReportsExtra(t *testing.T) {
	before := SnapshotGoroutines()
	stop := make(chan struct{})
	go lingering(stop)
	rec := &recorder{TB: t}
	before.WaitBack(rec, 50*time.Millisecond)
	close(stop)
	if !rec.failed || !strings.Contains(rec.msg, "redistest.lingering") {
		t.Errorf("WaitBack with a lingering goroutine: failed=%v, message:\n%s", rec.failed, rec.msg)
	}
	before.WaitBack(t, 5*time.Second)
}

func lingering(stop chan struct{}) { <-stop }

// recorder is a testing.TB that records a failure instead of failing.
type recorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.failed = true
	r.msg = fmt.Sprintf(format, args...)
}
