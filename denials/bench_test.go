package denials

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/authlimit/authlimit/decide"
)

// noHeaders is a request without headers.
var noHeaders = headers{}

// BenchmarkDecide measures what the recorder adds to an engine decision on
// the memory store: without an observer, then with the recorder, for a
// denied client (the hot path of a flood) and for admitted clients, one
// goroutine and in parallel.
func BenchmarkDecide(b *testing.B) {
	for _, observed := range []bool{false, true} {
		for _, tc := range []struct {
			name  string
			rules string
		}{
			{"denied", "name=a key=ip limit=1/1h"},
			{"admitted", "name=a key=ip limit=1000000000/1h"},
		} {
			for _, parallel := range []bool{false, true} {
				name := fmt.Sprintf("observed=%v/%s/parallel=%v", observed, tc.name, parallel)
				b.Run(name, func(b *testing.B) {
					var obs *Recorder
					if observed {
						var err error
						if obs, err = New(Options{Size: DefaultSize, Window: DefaultWindow, LogRate: DefaultLogRate}); err != nil {
							b.Fatal(err)
						}
						// A denied key, so that admissions look theirs up.
						obs.Observe(&decide.Decision{Rule: "a", Tag: []byte("198.51.100.1"), Denied: true, Now: time.Now()})
					}
					e := engineWith(b, obs, tc.rules)
					addrs := make([]netip.Addr, 1024)
					for i := range addrs {
						addrs[i] = netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
					}
					b.ReportAllocs()
					b.ResetTimer()
					if parallel {
						b.RunParallel(func(pb *testing.PB) {
							var in decide.Input
							var o decide.Outcome
							i := 0
							for pb.Next() {
								i++
								e.Read(&in, addrs[i%len(addrs)], []byte("GET"), []byte("/"), nil, noHeaders)
								e.Decide(context.Background(), &in, &o)
							}
						})
						return
					}
					var in decide.Input
					var o decide.Outcome
					for i := 0; i < b.N; i++ {
						e.Read(&in, addrs[i%len(addrs)], []byte("GET"), []byte("/"), nil, noHeaders)
						e.Decide(context.Background(), &in, &o)
					}
				})
			}
		}
	}
}
