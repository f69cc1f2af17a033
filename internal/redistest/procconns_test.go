package redistest

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"
)

// TestProcessConns counts this process's connections by its pid, as a
// test counts authlimit's: open ones, then one the peer closed (CLOSE_WAIT)
// until it is closed here too.
func TestProcessConns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var dialed []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		dialed = append(dialed, c)
	}
	server := <-accepted
	defer (<-accepted).Close()
	if open, closeWait, err := ProcessConns(os.Getpid(), addr); err != nil || open != 2 || closeWait != 0 {
		t.Fatalf("ProcessConns = %d open, %d in CLOSE_WAIT, %v; want 2, 0", open, closeWait, err)
	}

	// The peer closes one: it waits in CLOSE_WAIT until closed here.
	server.Close()
	err = poll(5*time.Second, func() error {
		if _, closeWait, err := ProcessConns(os.Getpid(), addr); err != nil || closeWait != 1 {
			return fmt.Errorf("%d in CLOSE_WAIT, %v", closeWait, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("after the peer closed: %v", err)
	}
	for _, c := range dialed {
		c.Close()
	}
	if open, _, err := ProcessConns(os.Getpid(), addr); err != nil || open != 0 {
		t.Errorf("after closing: %d open, %v; want 0", open, err)
	}
}
