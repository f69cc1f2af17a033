package algo_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

func newBenchMemory(b *testing.B) *algo.Memory {
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
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
	for _, a := range algo.Algorithms() {
		b.Run(a.String(), func(b *testing.B) {
			p := algotest.MustPolicy(b, algo.Spec{Name: "live", Algorithm: a, Limit: 100, Window: time.Hour})
			var res [1]algo.Result
			for i := 0; i < b.N; i++ {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				m := algo.NewMemory(algo.MemoryOptions{MaxKeys: n, SweepInterval: -1})
				for _, k := range keys {
					if _, err := m.Decide(context.Background(), []algo.Request{{Policy: p, Key: k}}, res[:]); err != nil {
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
			var ps []*algo.Policy
			for i, a := range []algo.Algorithm{algo.SlidingWindowCounter, algo.TokenBucket, algo.GCRA}[:rules] {
				ps = append(ps, algotest.MustPolicy(b, algo.Spec{Name: fmt.Sprintf("many-%d", i), Algorithm: a, Limit: 1 << 40, Window: time.Minute}))
			}
			reqs := make([]algo.Request, rules)
			res := make([]algo.Result, rules)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := keys[i%clients]
				for j := range reqs {
					reqs[j] = algo.Request{Policy: ps[j], Key: k}
				}
				if _, err := m.Decide(ctx, reqs, res); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
