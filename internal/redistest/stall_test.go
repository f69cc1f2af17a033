package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestDebugSleep(t *testing.T) {
	t.Parallel()
	srv := NewLocal(t, WithDebugCommand())
	c := srv.Client(t)
	ctx := context.Background()
	const d = 400 * time.Millisecond
	start := time.Now()
	done := DebugSleep(t, c, d)
	other := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 5 * time.Second})
	defer other.Close()
	pingStart := time.Now()
	if err := other.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ping := time.Since(pingStart)
	<-done
	t.Logf("DebugSleep(%v) returned after %v; a PING then took %v", d, pingStart.Sub(start), ping)
	if ping < d/4 {
		t.Errorf("PING during DEBUG SLEEP %v took %v, want it held", d, ping)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING after the sleep = %v", err)
	}
}

func TestPauseClients(t *testing.T) {
	t.Parallel()
	srv := NewLocal(t)
	c := srv.Client(t)
	ctx := context.Background()
	const d = 300 * time.Millisecond
	start := time.Now()
	PauseClients(t, c, d)
	other := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 5 * time.Second})
	defer other.Close()
	if err := other.Set(ctx, srv.Prefix(t)+":k", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("SET during CLIENT PAUSE %v answered after %v", d, took)
	if took < d-20*time.Millisecond {
		t.Errorf("SET answered after %v, want held for about %v", took, d)
	}
}

// TestDebugSleepTLS stalls a TLS server through a client of it.
func TestDebugSleepTLS(t *testing.T) {
	t.Parallel()
	s := StartTLS(t, WithDebugCommand())
	c := s.Client(t)
	start := time.Now()
	<-DebugSleep(t, c, 200*time.Millisecond)
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("DebugSleep(200ms) over TLS over after %v", took)
	}
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Errorf("PING after the sleep = %v", err)
	}
}
