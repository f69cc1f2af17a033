package grpcwire

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestRawGracefulStop: GOAWAY names the last call taken; a call opened
// after it is ignored; the call in flight is answered; then the
// connection closes and GracefulStop returns.
func TestRawGracefulStop(t *testing.T) {
	s, e, _, addr := testServer(t, Options{})
	r := rawDial(t, addr)
	r.call(1, "hold")
	<-e.started
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	for {
		f := r.read()
		if f == nil {
			t.Fatal("the connection ended before GOAWAY")
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeNo || g.LastStreamID != 1 {
				t.Fatalf("GOAWAY %v last stream %d, want NO_ERROR 1", g.ErrCode, g.LastStreamID)
			}
			break
		}
	}
	r.call(3, "too late")
	// New connections are refused.
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Error("a new connection is accepted after GracefulStop")
	}
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(e.release)
	a := r.answer(1)
	if a.grpcStatus != "0" || !bytes.Contains(a.data, []byte("released")) {
		t.Errorf("the call in flight: %+v, want it answered", a)
	}
	if !r.closed() {
		t.Error("the connection stays open")
	}
	if a := r.answers[3]; a != nil {
		t.Errorf("the call after GOAWAY was answered: %+v", a)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop did not return")
	}
}

// TestStopCutsCalls: Stop cancels the calls in flight and closes the
// connections at once.
func TestStopCutsCalls(t *testing.T) {
	s, e, _, addr := testServer(t, Options{})
	r := rawDial(t, addr)
	r.call(1, "hold")
	<-e.started
	s.Stop()
	select {
	case err := <-e.ended:
		if err == nil {
			t.Error("the call's context did not end")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not cancel the call in flight")
	}
	if !r.closed() {
		t.Error("the connection stays open after Stop")
	}
}

// TestMaxConns: beyond MaxConns, a connection is closed at once; once one
// closes, a new one is served.
func TestMaxConns(t *testing.T) {
	_, _, _, addr := testServer(t, Options{MaxConns: 1})
	first := rawDial(t, addr)
	second := rawConnect(t, addr)
	if !second.closed() {
		t.Fatal("a connection beyond MaxConns stays open")
	}
	_ = first.c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := rawConnect(t, addr)
		_, _ = r.c.Write([]byte(clientPreface))
		_ = r.fr.WriteSettings()
		_ = r.c.SetReadDeadline(time.Now().Add(time.Second))
		if f, err := r.fr.ReadFrame(); err == nil {
			if _, ok := f.(*http2.SettingsFrame); ok {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection served after the first closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRawStalledRequest: a request whose client stops sending is reset
// (CANCEL) within two read intervals, and its place is free again.
func TestRawStalledRequest(t *testing.T) {
	_, _, _, addr := testServer(t, Options{MaxConcurrentStreams: 1, IdleTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	r := rawDial(t, addr)
	r.headers(1, false, grpcHeaders(echoPath)...)
	_ = r.fr.WriteData(1, false, []byte{0, 0})
	if a := r.answer(1); !a.reset || a.rst != http2.ErrCodeCancel {
		t.Fatalf("stalled request: %+v, want RST_STREAM CANCEL", a)
	}
	r.call(3, "next")
	if a := r.answer(3); a.grpcStatus != "0" {
		t.Errorf("call after the stalled one: %+v", a)
	}
}
