//go:build linux || darwin || freebsd || netbsd || openbsd

package redis

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
)

// BenchmarkDecideConns compares one rule's decisions on the store's own
// connections with the same decisions through go-redis's pool, serially
// and from parallel goroutines, with the test process's CPU time per
// decision (cpu-µs/op: the store's and go-redis's work, not Redis's).
func BenchmarkDecideConns(b *testing.B) {
	reqs := benchRequests(benchRules(b, algo.FixedWindow, 1))
	for _, path := range []string{"go-redis", "direct"} {
		rs, _, _ := newRedisStore(b, &goredis.Options{PoolSize: 8, MaxRetries: -1, ContextTimeoutEnabled: true})
		if path == "go-redis" {
			rs.direct = nil
		}
		if err := rs.Warm(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.Run(path+"/serial", func(b *testing.B) {
			res := make([]algo.Result, 1)
			ctx := context.Background()
			b.ReportAllocs()
			stop := reportCPU(b)
			for i := 0; i < b.N; i++ {
				if _, err := rs.Decide(ctx, reqs[i%benchKeys], res); err != nil {
					b.Fatal(err)
				}
			}
			stop()
		})
		b.Run(path+"/parallel", func(b *testing.B) {
			var next atomic.Int64
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(4)
			stop := reportCPU(b)
			b.RunParallel(func(pb *testing.PB) {
				res := make([]algo.Result, 1)
				for pb.Next() {
					if _, err := rs.Decide(ctx, reqs[next.Add(1)%benchKeys], res); err != nil {
						b.Error(err)
						return
					}
				}
			})
			stop()
		})
	}
}

// reportCPU resets b's timer and returns a function that reports the
// process's CPU time (user and system) per op since.
func reportCPU(b *testing.B) func() {
	cpu := func() time.Duration {
		var u syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
			b.Fatal(err)
		}
		return time.Duration(u.Utime.Nano() + u.Stime.Nano())
	}
	start := cpu()
	b.ResetTimer()
	return func() {
		b.StopTimer()
		b.ReportMetric(float64(cpu()-start)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	}
}
