package redis

import (
	"testing"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
	"github.com/authlimit/authlimit/internal/redistest"
)

// TestConformance holds the Redis store to the hand-worked table, with the
// scripts reading the test's clock.
func TestConformance(t *testing.T) {
	srv := redistest.New(t)
	algotest.Conformance(t, "redis", func(t *testing.T, clock *algotest.Clock) algo.Decider {
		rs := newRedis(t, srv.Client(t), srv.Prefix(t))
		rs.clock = clock.Now
		return rs
	})
}
