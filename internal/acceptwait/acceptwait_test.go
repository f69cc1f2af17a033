package acceptwait

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"out of descriptors", &net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.EMFILE)}, true},
		{"system out of descriptors", fmt.Errorf("accept: %w", syscall.ENFILE), true},
		{"aborted before accepted", syscall.ECONNABORTED, true},
		{"no memory", syscall.ENOMEM, true},
		{"timeout", timeoutErr{}, true},
		{"closed listener", fmt.Errorf("accept: %w", net.ErrClosed), false},
		{"anything else", errors.New("bad"), false},
		{"permission", syscall.EPERM, false},
	} {
		if got := Retryable(tc.err); got != tc.want {
			t.Errorf("%s: Retryable = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestNextDoublesUpToLongest(t *testing.T) {
	var got []time.Duration
	w := time.Duration(0)
	for range 10 {
		w = Next(w)
		got = append(got, w)
	}
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", got, want)
		}
	}
}
