//go:build callgrind

package algo

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestCallgrind counts the instructions redis-server executes per decision,
// under valgrind's callgrind, which counts them the same however loaded the
// machine: one decision at a time (a batch of one, as at low load), after
// every key exists. Run it with
//
//	go test -tags callgrind -run TestCallgrind -v ./algo
//
// It needs valgrind and callgrind_control on PATH. Each shape is measured
// twice over the same keys; the two counts per decision must agree within
// 3%, or the figures are not the script's (a server cron, say).
func TestCallgrind(t *testing.T) {
	for _, bin := range []string{"valgrind", "callgrind_control", "redis-server"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not on PATH", bin)
		}
	}
	srv := startCallgrindRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 2, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	rs := NewRedis(client, RedisOptions{Prefix: "cg", Timeout: time.Minute, Conns: 1})
	t.Cleanup(func() { _ = rs.Close() })
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	const keys, n = 200, 1000
	pol := func(name string, a Algorithm) *Policy {
		s := Spec{Name: name, Algorithm: a, Limit: 1 << 40, Window: time.Hour}
		if a.UsesBurst() {
			s.Burst = 1 << 40
		}
		return mustPolicy(t, s)
	}
	shapes := []struct {
		name  string
		rules []*Policy
	}{
		{"1 rule fixed_window", []*Policy{pol("fw", FixedWindow)}},
		{"1 rule sliding_window_counter", []*Policy{pol("swc", SlidingWindowCounter)}},
		{"3 rules (sliding_window_counter, token_bucket, gcra)", []*Policy{pol("a", SlidingWindowCounter), pol("b", TokenBucket), pol("c", GCRA)}},
	}
	for _, sh := range shapes {
		reqs := make([][]Request, keys)
		for k := range reqs {
			for _, p := range sh.rules {
				reqs[k] = append(reqs[k], Request{Policy: p, Key: []byte("198.51.100." + strconv.Itoa(k))})
			}
		}
		var res [MaxRules]Result
		run := func(count int) {
			for i := 0; i < count; i++ {
				ok, err := rs.Decide(ctx, reqs[i%keys], res[:])
				if err != nil || !ok {
					t.Fatalf("%s: Decide = %v, %v", sh.name, ok, err)
				}
			}
		}
		run(keys)
		var per [2]float64
		for i := range per {
			srv.zero(t)
			run(n)
			per[i] = float64(srv.dump(t)) / n
		}
		if d := per[0]/per[1] - 1; d > 0.03 || d < -0.03 {
			t.Errorf("%s: %.0f and %.0f instructions per decision: too far apart to be the script's", sh.name, per[0], per[1])
		}
		t.Logf("%s: %.0f instructions per decision (%.0f, %.0f)", sh.name, (per[0]+per[1])/2, per[0], per[1])
	}
	// A batch, as under load: 32 requests of one rule in one script call.
	{
		const size = 32
		p := pol("batch", SlidingWindowCounter)
		calls := make([]*call, size)
		w := &worker{}
		batch := func(round int) {
			w.batch = w.batch[:0]
			for i := range calls {
				if calls[i] == nil {
					calls[i] = &call{done: make(chan struct{}, 1)}
				}
				key := []byte("198.51.100." + strconv.Itoa((round*size+i)%keys))
				if err := rs.encode(ctx, calls[i], []Request{{Policy: p, Key: key}}); err != nil {
					t.Fatal(err)
				}
				calls[i].deadline = time.Now().Add(time.Minute)
				w.batch = append(w.batch, calls[i])
			}
			rs.run(w, time.Now().Add(time.Minute))
			for _, c := range calls {
				<-c.done
				if c.err != nil || !c.admitted {
					t.Fatalf("batch: admitted %v, %v", c.admitted, c.err)
				}
			}
		}
		for i := 0; i < keys/size+1; i++ {
			batch(i)
		}
		srv.zero(t)
		for i := 0; i < n/size; i++ {
			batch(i)
		}
		t.Logf("1 rule sliding_window_counter, batches of %d: %.0f instructions per decision", size, float64(srv.dump(t))/float64(n/size*size))
	}
	// The floor, for comparison: what a limiter that runs INCRBY and
	// PEXPIRE in one script costs.
	naive := redis.NewScript("local n = redis.call('INCRBY', KEYS[1], ARGV[1]) if n == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return n")
	if err := naive.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	runNaive := func(count int) {
		for i := 0; i < count; i++ {
			if err := naive.EvalSha(ctx, client, []string{"naive:198.51.100." + strconv.Itoa(i%keys)}, 1, 3600000).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	runNaive(keys)
	srv.zero(t)
	runNaive(n)
	t.Logf("naive EVALSHA of INCRBY (+ PEXPIRE on the first): %.0f instructions per call", float64(srv.dump(t))/n)
}

var callgrindDir = flag.String("callgrind.dir", "", "keep TestCallgrind's callgrind dumps here, one per measure, for callgrind_annotate")

// callgrindRedis is a redis-server run under callgrind.
type callgrindRedis struct {
	addr  string
	pid   int
	dir   string
	dumps int
}

func startCallgrindRedis(t *testing.T) *callgrindRedis {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, port, _ := net.SplitHostPort(addr)
	dir := *callgrindDir
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+filepath.Join(dir, "cg.out"),
		"redis-server", "--save", "", "--appendonly", "no", "--port", port, "--bind", "127.0.0.1", "--dir", dir, "--hz", "1")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	s := &callgrindRedis{addr: addr, pid: cmd.Process.Pid, dir: dir}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis-server under valgrind did not answer PING in 2 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

func (s *callgrindRedis) control(t *testing.T, flag string) {
	t.Helper()
	if out, err := exec.Command("callgrind_control", flag, strconv.Itoa(s.pid)).CombinedOutput(); err != nil {
		t.Fatalf("callgrind_control %s: %v: %s", flag, err, out)
	}
}

// zero sets the server's counts to zero.
func (s *callgrindRedis) zero(t *testing.T) { s.control(t, "-z") }

// dump writes the counts since the last zero and returns the instructions.
func (s *callgrindRedis) dump(t *testing.T) int64 {
	t.Helper()
	s.control(t, "-d")
	s.dumps++
	path := filepath.Join(s.dir, fmt.Sprintf("cg.out.%d", s.dumps))
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "summary: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("%s: summary %q", path, v)
			}
			return n
		}
	}
	t.Fatalf("%s: no summary line", path)
	return 0
}
