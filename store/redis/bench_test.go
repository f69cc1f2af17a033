package redis

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// benchKeys is how many distinct keys a benchmark cycles through, generated
// before the timer starts.
const benchKeys = 4096

func benchRules(b *testing.B, a algo.Algorithm, n int) []*algo.Policy {
	rules := make([]*algo.Policy, n)
	for i := range rules {
		// Limits above the benchmark's rate, so it measures admissions,
		// and a short window, so state is in a steady state: a
		// sliding_window_log key holds about a second of entries.
		rules[i] = algotest.MustPolicy(b, algo.Spec{Name: fmt.Sprintf("bench%d", i), Algorithm: a, Limit: 1 << 16, Window: time.Second})
	}
	return rules
}

func benchRequests(rules []*algo.Policy) [][]algo.Request {
	all := make([][]algo.Request, benchKeys)
	for k := range all {
		key := "198.51.100." + strconv.Itoa(k)
		for _, r := range rules {
			all[k] = append(all[k], algo.Request{Policy: r, Key: []byte(key)})
		}
	}
	return all
}

// BenchmarkDecide measures one decision of one rule and of three rules, per
// algorithm and store (memory, Redis, a Redis Cluster of three primaries),
// serially and from parallel goroutines.
func BenchmarkDecide(b *testing.B) {
	rs, client, _ := newRedisStore(b, &goredis.Options{PoolSize: 16})
	if err := rs.Warm(context.Background()); err != nil {
		b.Fatal(err)
	}
	// The floor for any Redis store: one PING round trip on the same client.
	b.Run("redis/ping-baseline", func(b *testing.B) {
		ctx := context.Background()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if err := client.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	crs, _ := newClusterStore(b)
	for _, st := range []namedStore{{"memory", nil}, {"redis", rs}, {"cluster", crs}} {
		for _, a := range algo.Algorithms() {
			for _, n := range []int{1, 3} {
				reqs := benchRequests(benchRules(b, a, n))
				name := fmt.Sprintf("%s/%s/rules=%d", st.name, a, n)
				b.Run(name+"/serial", func(b *testing.B) {
					store := st.store
					if store == nil {
						store = newBenchMemory(b)
					}
					res := make([]algo.Result, n)
					ctx := context.Background()
					b.ReportAllocs()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						if _, err := store.Decide(ctx, reqs[i%benchKeys], res); err != nil {
							b.Fatal(err)
						}
					}
				})
				b.Run(name+"/parallel", func(b *testing.B) {
					store := st.store
					if store == nil {
						store = newBenchMemory(b)
					}
					var next atomic.Int64
					ctx := context.Background()
					b.ReportAllocs()
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						res := make([]algo.Result, n)
						for pb.Next() {
							if _, err := store.Decide(ctx, reqs[next.Add(1)%benchKeys], res); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			}
		}
	}
}

func newBenchMemory(b *testing.B) *algo.Memory {
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	b.Cleanup(func() { _ = m.Close() })
	return m
}
