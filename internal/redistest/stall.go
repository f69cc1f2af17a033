package redistest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// PauseClients runs CLIENT PAUSE <d> ALL through c: the server holds every
// command of every client but its replicas for d, then runs them. The
// connections stay open and the server keeps answering its replicas, so
// this is a stall, not an outage. The pause is in force when PauseClients
// returns, c included.
//
// Found on Redis 7.0.15: CLIENT UNPAUSE is held like any other command
// during a pause in ALL mode, so a pause cannot be cut short; choose d
// accordingly.
func PauseClients(t testing.TB, c *redis.Client, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := c.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatalf("redistest: CLIENT PAUSE %d ALL on %s: %v", d.Milliseconds(), c.Options().Addr, err)
	}
}

// DebugSleep blocks the whole server behind c for d with DEBUG SLEEP: it
// answers nobody, not even PING, and accepts no connection, as a server
// stuck in a long command or a fork. The command goes on a connection of
// its own made from c's options, so TLS and ACL users work (the user needs
// +debug). The server must allow DEBUG: start it with WithDebugCommand.
//
// DebugSleep returns once a probe has seen the server stop answering, and
// the channel it returns closes when the sleep is over. The test waits for
// that before it ends.
func DebugSleep(t testing.TB, c *redis.Client, d time.Duration) <-chan struct{} {
	t.Helper()
	opts := soloOptions(c)
	opts.ReadTimeout = d + 10*time.Second
	sleeper := redis.NewClient(opts)
	ctx := context.Background()
	if err := sleeper.Ping(ctx).Err(); err != nil { // connect before the stall
		_ = sleeper.Close()
		t.Fatalf("redistest: DebugSleep: connect to %s: %v", opts.Addr, err)
	}
	done := make(chan struct{})
	var sleepErr error
	go func() {
		defer close(done)
		defer sleeper.Close()
		sleepErr = sleeper.Do(ctx, "DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', 3, 64)).Err()
	}()
	t.Cleanup(func() { <-done })

	probeOpts := soloOptions(c)
	probeOpts.DialTimeout, probeOpts.ReadTimeout, probeOpts.WriteTimeout = 30*time.Millisecond, 30*time.Millisecond, 30*time.Millisecond
	probe := redis.NewClient(probeOpts)
	defer probe.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case <-done:
			if sleepErr != nil {
				t.Fatalf("redistest: DEBUG SLEEP on %s: %v (start the server with WithDebugCommand)", opts.Addr, sleepErr)
			}
			return done // slept and woke before the probe noticed: d was short
		default:
		}
		err := probe.Ping(ctx).Err()
		if isTimeout(err) {
			return done
		}
		if err != nil {
			t.Fatalf("redistest: DebugSleep: probe PING on %s: %v", opts.Addr, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: DebugSleep: %s still answers PING 5s after DEBUG SLEEP was sent", opts.Addr)
		}
	}
}

// soloOptions returns options for a one-connection client of the same
// server as c, with its address, credentials, database and TLS settings.
// Copying c's whole Options would share go-redis's internal state between
// the two clients, which it refuses.
func soloOptions(c *redis.Client) *redis.Options {
	o := c.Options()
	return &redis.Options{
		Addr:       o.Addr,
		Username:   o.Username,
		Password:   o.Password,
		DB:         o.DB,
		TLSConfig:  o.TLSConfig,
		Protocol:   o.Protocol,
		PoolSize:   1,
		MaxRetries: -1,
	}
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}
