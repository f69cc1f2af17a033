// Package algotest holds what the tests of the stores share: a clock moved
// by hand, the conformance table worked by hand from each algorithm's
// definition, and small helpers. Package algo tests the memory store with
// it, package store/redis the Redis store.
package algotest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
)

// Clock is a clock the test moves by hand.
type Clock struct{ us atomic.Int64 }

// NewClock returns a clock reading t.
func NewClock(t time.Time) *Clock {
	c := &Clock{}
	c.Set(t)
	return c
}

// Now reads the clock.
func (c *Clock) Now() time.Time { return time.UnixMicro(c.us.Load()) }

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) { c.us.Store(t.UnixMicro()) }

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) { c.us.Add(d.Microseconds()) }

// Micros reads the clock in Unix microseconds.
func (c *Clock) Micros() int64 { return c.us.Load() }

// SetMicros moves the clock to us Unix microseconds.
func (c *Clock) SetMicros(us int64) { c.us.Store(us) }

// Epoch is a pinned start aligned to a day, so every window in the tables
// begins at it.
var Epoch = time.Unix(1799971200, 0)

// MustPolicy returns the policy of s, or fails the test.
func MustPolicy(t testing.TB, s algo.Spec) *algo.Policy {
	t.Helper()
	r, err := algo.NewPolicy(s)
	if err != nil {
		t.Fatalf("NewPolicy(%+v): %v", s, err)
	}
	return r
}

// DecideOne decides q alone with d, or fails the test.
func DecideOne(t testing.TB, d algo.Decider, q algo.Request) algo.Result {
	t.Helper()
	var res [1]algo.Result
	if _, err := d.Decide(context.Background(), []algo.Request{q}, res[:]); err != nil {
		t.Fatalf("Decide(%s, %q): %v", q.Policy.Name(), q.Key, err)
	}
	return res[0]
}
