package algo

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// benchKeys is how many distinct keys a benchmark cycles through, generated
// before the timer starts.
const benchKeys = 4096

func benchRules(b *testing.B, a Algorithm, n int) []*Policy {
	rules := make([]*Policy, n)
	for i := range rules {
		// Limits above the benchmark's rate, so it measures admissions,
		// and a short window, so state is in a steady state: a
		// sliding_window_log key holds about a second of entries.
		rules[i] = mustPolicy(b, Spec{Name: fmt.Sprintf("bench%d", i), Algorithm: a, Limit: 1 << 16, Window: time.Second})
	}
	return rules
}

func benchRequests(rules []*Policy) [][]Request {
	all := make([][]Request, benchKeys)
	for k := range all {
		key := "198.51.100." + strconv.Itoa(k)
		for _, r := range rules {
			all[k] = append(all[k], Request{Policy: r, Key: []byte(key)})
		}
	}
	return all
}

// BenchmarkDecide measures one decision of one rule and of three rules, per
// algorithm and store (memory, Redis, a Redis Cluster of three primaries),
// serially and from parallel goroutines.
func BenchmarkDecide(b *testing.B) {
	rs, client, _ := newRedisStore(b, &redis.Options{PoolSize: 16})
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
		for _, a := range Algorithms() {
			for _, n := range []int{1, 3} {
				reqs := benchRequests(benchRules(b, a, n))
				name := fmt.Sprintf("%s/%s/rules=%d", st.name, a, n)
				b.Run(name+"/serial", func(b *testing.B) {
					store := st.store
					if store == nil {
						store = newBenchMemory(b)
					}
					res := make([]Result, n)
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
						res := make([]Result, n)
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

func newBenchMemory(b *testing.B) *Memory {
	m := NewMemory(MemoryOptions{SweepInterval: -1})
	b.Cleanup(func() { _ = m.Close() })
	return m
}

// BenchmarkMemoryLiveKeys reports the heap the memory store holds per live
// key, with a million keys of IPv4 addresses, per algorithm.
func BenchmarkMemoryLiveKeys(b *testing.B) {
	const n = 1 << 20
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&255, i&255))
	}
	for _, a := range Algorithms() {
		b.Run(a.String(), func(b *testing.B) {
			p := mustPolicy(b, Spec{Name: "live", Algorithm: a, Limit: 100, Window: time.Hour})
			var res [1]Result
			for i := 0; i < b.N; i++ {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				m := NewMemory(MemoryOptions{MaxKeys: n, SweepInterval: -1})
				for _, k := range keys {
					if _, err := m.Decide(context.Background(), []Request{{Policy: p, Key: k}}, res[:]); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				if m.Len() != n {
					b.Fatalf("Len = %d, want %d", m.Len(), n)
				}
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/key")
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB/1M-keys")
				_ = m.Close()
			}
		})
	}
}

// BenchmarkMemoryManyKeys decides requests of 1 and 3 rules for 10,000
// clients in turn, as a replica's local mirror does under the bench's ips
// workload: every lookup is of a state not touched for 10,000 decisions,
// so it measures the store's cache misses more than its arithmetic.
func BenchmarkMemoryManyKeys(b *testing.B) {
	const clients = 10000
	keys := make([][]byte, clients)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("198.18.%d.%d", i>>8, i&255))
	}
	for _, rules := range []int{1, 3} {
		b.Run(fmt.Sprintf("rules=%d", rules), func(b *testing.B) {
			m := newBenchMemory(b)
			var ps []*Policy
			for i, a := range []Algorithm{SlidingWindowCounter, TokenBucket, GCRA}[:rules] {
				ps = append(ps, mustPolicy(b, Spec{Name: fmt.Sprintf("many-%d", i), Algorithm: a, Limit: 1 << 40, Window: time.Minute}))
			}
			reqs := make([]Request, rules)
			res := make([]Result, rules)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := keys[i%clients]
				for j := range reqs {
					reqs[j] = Request{Policy: ps[j], Key: k}
				}
				if _, err := m.Decide(ctx, reqs, res); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
