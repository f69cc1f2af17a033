package handler

import (
	"strings"
	"testing"
	"time"
)

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var changes []string
	b := newBreaker(3, time.Second, 4*time.Second, func() time.Time { return now }, func(from, to int32) {
		changes = append(changes, circuitName(from)+">"+circuitName(to))
	})
	steps := []struct {
		do        string // "fail", "ok", or "wait <duration>"
		wantAllow bool
		wantState int32
	}{
		{"fail", true, circuitClosed},
		{"ok", true, circuitClosed}, // a success resets the count
		{"fail", true, circuitClosed},
		{"fail", true, circuitClosed},
		{"fail", false, circuitOpen}, // third in a row
		{"wait 999ms", false, circuitOpen},
		{"wait 1ms", true, circuitHalfOpen}, // the probe
		{"fail", false, circuitOpen},        // probe failed: backoff doubles to 2s
		{"wait 1999ms", false, circuitOpen},
		{"wait 1ms", true, circuitHalfOpen},
		{"fail", false, circuitOpen}, // 4s, the maximum
		{"wait 4s", true, circuitHalfOpen},
		{"ok", true, circuitClosed},
	}
	for i, s := range steps {
		switch {
		case s.do == "fail":
			b.failure()
		case s.do == "ok":
			b.success()
		default:
			d, _ := time.ParseDuration(s.do[5:])
			now = now.Add(d)
		}
		allow := b.allow()
		if allow != s.wantAllow || b.state.Load() != s.wantState {
			t.Fatalf("step %d (%s): allow %v state %s; want %v %s", i, s.do, allow, circuitName(b.state.Load()), s.wantAllow, circuitName(s.wantState))
		}
		if b.state.Load() == circuitHalfOpen && b.allow() {
			t.Fatalf("step %d: a second caller got through while the probe is out", i)
		}
	}
	want := "closed>open open>half_open half_open>open open>half_open half_open>open open>half_open half_open>closed"
	if got := strings.Join(changes, " "); got != want {
		t.Errorf("changes:\n got %s\nwant %s", got, want)
	}
}
