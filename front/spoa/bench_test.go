package spoa

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/internal/redistest"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
	"github.com/authlimit/authlimit/store/redis"
)

// BenchmarkAgent: NOTIFY frames for distinct clients, decided on the
// memory store (answered on the reader) or on Redis (answered by the
// store's goroutines) and answered, over one connection with depth frames
// in flight, as HAProxy pipelines them: the agent's cost per decision,
// protocol included.
func BenchmarkAgent(b *testing.B) {
	const rules = "name=per-ip key=ip limit=1000000/1m"
	for _, store := range []string{"memory", "redis"} {
		for _, depth := range []int{1, 20} {
			b.Run(fmt.Sprintf("%s/depth=%d", store, depth), func(b *testing.B) {
				e := newEngine(b, rules)
				if store == "redis" {
					e = newRedisEngine(b, rules)
				}
				benchAgent(b, e, depth)
			})
		}
	}
}

// newRedisEngine is newEngine on Redis (internal/redistest's).
func newRedisEngine(b *testing.B, src string) *decide.Engine {
	b.Helper()
	rs, err := rules.Parse(src)
	if err != nil {
		b.Fatal(err)
	}
	srv := redistest.New(b)
	store := redis.New(srv.Client(b), redis.Options{Prefix: srv.Prefix(b), Timeout: time.Second})
	b.Cleanup(func() { _ = store.Close() })
	h := rulesettest.Holder(b, rs)
	g, err := guard.New(guard.Options{Store: store, Remote: true, FailMode: guard.FailClosed, Rules: h,
		BreakerFailures: 5, BreakerBackoff: 100 * time.Millisecond, BreakerMaxBackoff: 500 * time.Millisecond, ProbeTimeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	e, err := decide.New(decide.Options{Rules: h, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429})
	if err != nil {
		b.Fatal(err)
	}
	return e
}

func benchAgent(b *testing.B, e *decide.Engine, depth int) {
	{
		{
			a, err := NewAgent(AgentOptions{Engine: e})
			if err != nil {
				b.Fatal(err)
			}
			addr, _ := startServer(b, a, nil)
			p := dial(b, addr)
			p.hello(16380)
			frames := make([][]byte, 1024)
			for i := range frames {
				c := get(fmt.Sprintf("198.18.%d.%d", i/256, i%256), "/api/v1/items?page=2",
					"User-Agent", "bench/1.0", "Accept", "*/*", "Accept-Encoding", "gzip")
				frames[i] = frame(frameNotify, flagFin, uint64(i+1), 1, c.spoeMessage())
			}
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			done := make(chan error, 1)
			go func() { done <- readAcks(p.br, b.N) }()
			w := bufio.NewWriterSize(p.nc, 64<<10)
			for i := 0; i < b.N; i++ {
				if _, err := w.Write(frames[i%len(frames)]); err != nil {
					b.Fatal(err)
				}
				if i%depth == depth-1 {
					if err := w.Flush(); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := w.Flush(); err != nil {
				b.Fatal(err)
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			// The process's CPU (agent and test client together), which
			// a shared machine's load does not inflate as it does the
			// wall time.
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		}
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// readAcks reads n ACK frames.
func readAcks(br *bufio.Reader, n int) error {
	buf := make([]byte, 4096)
	for i := 0; i < n; i++ {
		if _, err := io.ReadFull(br, buf[:4]); err != nil {
			return err
		}
		size := int(binary.BigEndian.Uint32(buf[:4]))
		if cap(buf) < size {
			buf = make([]byte, size)
		}
		if _, err := io.ReadFull(br, buf[:size]); err != nil {
			return err
		}
		if buf[0] != frameAck {
			return fmt.Errorf("frame of type %d", buf[0])
		}
	}
	return nil
}

// TestAgentAllocatesNothing: a NOTIFY decided on the memory store and
// answered allocates nothing once the pools are warm, the agent's side
// and the connection's together (the test's own reads allocate nothing
// either).
func TestAgentAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts mean nothing under the race detector; make test runs this test without it")
	}
	e := newEngine(t, "name=per-ip key=ip limit=1000000/1m; name=api key=header:X-Api-Key limit=1000000/1m path=/api")
	a, err := NewAgent(AgentOptions{Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startServer(t, a, nil)
	p := dial(t, addr)
	p.hello(16380)
	f := frame(frameNotify, flagFin, 1, 1, get("203.0.113.7", "/api/x", "X-Api-Key", "k1", "User-Agent", "t").spoeMessage())
	buf := make([]byte, 4096)
	run := func() {
		if _, err := p.nc.Write(f); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p.br, buf[:4]); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p.br, buf[:binary.BigEndian.Uint32(buf[:4])]); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 100; i++ {
		run()
	}
	if got := testing.AllocsPerRun(500, run); got > 0.05 {
		t.Errorf("%v allocations per decision, want 0", got)
	}
}
