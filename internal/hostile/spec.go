package hostile

import (
	"context"
	"fmt"
	"time"
)

// Spec names an attack and its scale, so that a test can run it in a
// process of its own: an attacker that shares the well-behaved client's
// process takes its share of the Go scheduler, and the client's latency
// would measure the attacker.
type Spec struct {
	Kind     string        // one of the Kinds
	Addr     string        // host:port on loopback
	Duration time.Duration // how long it runs
	Conns    int           // connections at once
	Size     int           // HalfSentCalls: the message announced; HeldHeaders: the header bytes
	Sent     int           // HalfSentCalls: the bytes sent of it
	Streams  int           // HalfOpenStreams: the streams a connection
	Calls    int           // ZeroWindow: the calls a connection
	Frame    EmptyFrame    // EmptyFrameFlood: the frame
	Interval time.Duration // SlowLoris: between bytes
	Path     string        // HeldHeaders, SlowLoris: the request's path
	Msg      []byte        // RapidReset, ZeroWindow, SlowReader, WholeCalls: a call's framed message
}

// The kinds of attack a Spec names.
const (
	KindHalfSent     = "half-sent calls"
	KindHalfOpen     = "half-open streams"
	KindContinuation = "CONTINUATION flood"
	KindEmptyFrames  = "empty-frame flood"
	KindRapidReset   = "rapid reset"
	KindHPACKBomb    = "HPACK bomb"
	KindZeroWindow   = "zero window"
	KindSlowReader   = "slow reader"
	KindConnFloodH2  = "HTTP/2 connection flood"
	KindWholeCalls   = "whole calls"
	KindHeldHeaders  = "held headers"
	KindSlowLoris    = "slowloris"
	KindConnFloodTCP = "TCP connection flood"
)

// Run runs the attack s names for its duration, or until ctx ends.
func Run(ctx context.Context, s Spec) (Counts, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Duration)
	defer cancel()
	var t *Tally
	switch s.Kind {
	case KindHalfSent:
		t = HalfSentCalls(ctx, s.Addr, s.Conns, s.Size, s.Sent)
	case KindHalfOpen:
		t = HalfOpenStreams(ctx, s.Addr, s.Conns, s.Streams)
	case KindContinuation:
		t = ContinuationFlood(ctx, s.Addr, s.Conns)
	case KindEmptyFrames:
		t = EmptyFrameFlood(ctx, s.Addr, s.Conns, s.Frame)
	case KindRapidReset:
		t = RapidReset(ctx, s.Addr, s.Conns, s.Msg)
	case KindHPACKBomb:
		t = HPACKBomb(ctx, s.Addr, s.Conns)
	case KindZeroWindow:
		t = ZeroWindow(ctx, s.Addr, s.Conns, s.Calls, s.Msg)
	case KindSlowReader:
		t = SlowReader(ctx, s.Addr, s.Conns, s.Msg)
	case KindConnFloodH2:
		t = ConnFloodH2(ctx, s.Addr, s.Conns)
	case KindWholeCalls:
		t = WholeCalls(ctx, s.Addr, s.Conns, s.Msg)
	case KindHeldHeaders:
		t = HeldHeaders(ctx, s.Addr, s.Path, s.Conns, s.Size)
	case KindSlowLoris:
		t = SlowLoris(ctx, s.Addr, s.Path, s.Conns, s.Interval)
	case KindConnFloodTCP:
		t = ConnFloodTCP(ctx, s.Addr, s.Conns)
	default:
		return Counts{}, fmt.Errorf("hostile: no attack %q", s.Kind)
	}
	return t.Counts(), nil
}
