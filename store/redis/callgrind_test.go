//go:build callgrind

package redis

import (
	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/algo/algotest"
)

// TestCallgrind counts the instructions redis-server executes per decision,
// under valgrind's callgrind, which counts them the same however loaded the
// machine: one decision at a time (a batch of one, as at low load), after
// every key exists, for one rule of each algorithm, two and three rules on
// one key, and three with a sliding_window_log among them; then batches of
// 1, 16 and 50 requests of one rule, and of 16 and 50 of three, as under
// load; and, in the same run, the shapes
// authlimit is measured against: an empty script, a script that only reads
// TIME, the naive limiter's script (INCRBY, PEXPIRE on the
// first), envoyproxy/ratelimit's pipeline (INCRBY and EXPIRE, no script),
// the least a fixed window in decide.lua's key format costs (TIME, GET
// and a SETRANGE over the value in a script that does no arithmetic), in a
// key per window index, and with three rules' state in one key. The
// policies admit a million an hour, so every decision is admitted and its
// answer fits decide.lua's one integer. Run it with
//
//	go test -tags callgrind -run TestCallgrind -v ./store/redis/
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
	client := goredis.NewClient(&goredis.Options{Addr: srv.addr, PoolSize: 2, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	rs := New(client, Options{Prefix: "cg", Timeout: time.Minute, Conns: 1})
	t.Cleanup(func() { _ = rs.Close() })
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	const keys, n = 200, 1000
	key := func(i int) string { return "198.51.100." + strconv.Itoa(i%keys) }
	// measure runs one decision (or reference call) per key to create the
	// keys, then n (and at least 100 calls of per) twice, and returns the
	// instructions per decision. Redis steps Lua's garbage collector every
	// 50 script calls, so both runs make a multiple of 50 calls.
	measure := func(name string, per int, do func(i int)) float64 {
		t.Helper()
		for i := 0; i < keys; i += per {
			do(i)
		}
		calls := max(n/per, 100) / 50 * 50
		var got [2]float64
		for r := range got {
			srv.zero(t)
			for j := 0; j < calls; j++ {
				do(j * per)
			}
			got[r] = float64(srv.dump(t)) / float64(calls*per)
		}
		if d := got[0]/got[1] - 1; d > 0.03 || d < -0.03 {
			t.Errorf("%s: %.0f and %.0f instructions per decision: too far apart to be the script's", name, got[0], got[1])
		}
		avg := (got[0] + got[1]) / 2
		t.Logf("%-58s %6.0f instructions per decision", name+":", avg)
		return avg
	}
	script := func(name, src string, nkeys int, args ...any) float64 {
		t.Helper()
		s := goredis.NewScript(src)
		if err := s.Load(ctx, client).Err(); err != nil {
			t.Fatal(err)
		}
		return measure(name, 1, func(i int) {
			ks := make([]string, nkeys)
			for j := range ks {
				ks[j] = "ref:" + strconv.Itoa(j) + ":" + key(i)
			}
			if err := s.EvalSha(ctx, client, ks, args...).Err(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		})
	}

	script("reference: empty script", "return 1", 0, "x")
	script("reference: TIME", "redis.call('TIME') return 1", 0, "x")
	naive := script("reference: naive (INCRBY, PEXPIRE on the first)",
		"local n = redis.call('INCRBY', KEYS[1], ARGV[1]) if n == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return n", 1, 1, 3600000)
	envoy := measure("reference: envoyproxy/ratelimit (INCRBY, EXPIRE pipelined)", 1, func(i int) {
		k := "envoy:" + key(i)
		p := client.Pipeline()
		p.IncrBy(ctx, k, 1)
		p.Expire(ctx, k, time.Hour)
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	})
	script("reference: TIME, GET, SETRANGE (a fixed window's floor)",
		"local t = redis.call('TIME') local v = redis.call('GET', KEYS[1]) redis.call('SETRANGE', KEYS[1], '0', '1e:5') return 1", 1, "x")

	// The least a fixed window in a key per window index could cost Redis
	// in a batch: one TIME per call, then per request an unpack of its key
	// and cost, INCRBY on the key and the window index (PEXPIRE on the
	// first), and its remaining count, answered with the window's reset in
	// one packed string; no decision's arithmetic, nothing left unconsumed
	// when denied. make bench's batches at 50 connections hold about 6
	// requests.
	perWindow := goredis.NewScript(`local call = redis.call
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local ws = ':' .. math.floor(now / 3600000000)
local blob, out = ARGV[1], {}
local n, pos = struct.unpack('<H', blob)
for i = 1, n do
  local k, c
  k, c, pos = struct.unpack('<Hc0d', blob, pos)
  local key = k .. ws
  local v = call('INCRBY', key, c)
  if v == c then call('PEXPIRE', key, 3600000) end
  out[i] = 1000000 - v
end
return struct.pack('<d' .. string.rep('d', n), 3600000000 - now % 3600000000, unpack(out))`)
	if err := perWindow.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	var perWindow50 float64
	for _, size := range []int{1, 6, 50} {
		perWindow50 = measure(fmt.Sprintf("reference: a key per window, INCRBY, batches of %d", size), size, func(i int) {
			b := binary.LittleEndian.AppendUint16(nil, uint16(size))
			for j := 0; j < size; j++ {
				k := "pw:{" + key(i+j) + "}"
				b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
				b = append(b, k...)
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(1))
			}
			if err := perWindow.EvalSha(ctx, client, nil, string(b)).Err(); err != nil {
				t.Fatal(err)
			}
		})
	}

	// The least three rules on one key could cost Redis were their states
	// one value under one key: one TIME, the three rules' arguments
	// unpacked as the flat layout's are, one GET, one SET ... PX of the
	// three states packed ([dd] each, as a bucket's), and an integer
	// answer; no decision's arithmetic. decide.lua keeps a key per rule,
	// so that a rule added or removed by a reload leaves the others'
	// state as it is.
	mergedScript := goredis.NewScript(`local call = redis.call
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local V = { struct.unpack('<BBddddddBBddddddBBddddddHc0', ARGV[1]) }
local k = V[25]
local v = call('GET', k)
local a, b, c = 0, 0, 0
if v then
  local _
  _, a, _, b, _, c = struct.unpack('<dddddd', v)
end
call('SET', k, struct.pack('<dddddd', now, a + V[8], now, b + V[16], now, c + V[24]), 'PX', 3600000)
return 1000000 - a`)
	if err := mergedScript.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	merged := measure("reference: 3 rules' state in one key (TIME, GET, SET PX)", 1, func(i int) {
		if err := mergedScript.EvalSha(ctx, client, nil, mergedArgs(key(i))).Err(); err != nil {
			t.Fatal(err)
		}
	})

	pol := func(name string, a algo.Algorithm) *algo.Policy {
		s := algo.Spec{Name: name, Algorithm: a, Limit: 1_000_000, Window: time.Hour}
		if a.UsesBurst() {
			s.Burst = 1_000_000
		}
		return algotest.MustPolicy(t, s)
	}
	var res [algo.MaxRules]algo.Result
	decide := func(name string, rules ...*algo.Policy) float64 {
		t.Helper()
		reqs := make([][]algo.Request, keys)
		for k := range reqs {
			for _, p := range rules {
				reqs[k] = append(reqs[k], algo.Request{Policy: p, Key: []byte(key(k))})
			}
		}
		return measure(name, 1, func(i int) {
			ok, err := rs.Decide(ctx, reqs[i%keys], res[:])
			if err != nil || !ok {
				t.Fatalf("%s: Decide = %v, %v", name, ok, err)
			}
		})
	}
	algs := map[algo.Algorithm]float64{}
	for _, a := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowLog, algo.SlidingWindowCounter, algo.TokenBucket, algo.LeakyBucket, algo.GCRA} {
		algs[a] = decide("1 rule "+a.String(), pol(a.String(), a))
	}
	decide("2 rules on one key (sliding_window_counter, token_bucket)",
		pol("a", algo.SlidingWindowCounter), pol("b", algo.TokenBucket))
	three := decide("3 rules on one key (sliding_window_counter, token_bucket, gcra)",
		pol("a", algo.SlidingWindowCounter), pol("b", algo.TokenBucket), pol("c", algo.GCRA))
	decide("3 rules on one key (fixed_window, sliding_window_log, token_bucket)",
		pol("a", algo.FixedWindow), pol("l", algo.SlidingWindowLog), pol("b", algo.TokenBucket))

	// Batches, as under load: requests of one rule in one script call.
	w := &worker{}
	var batched float64 // the last: fixed_window in batches of 50
	three3 := []algo.Algorithm{algo.SlidingWindowCounter, algo.TokenBucket, algo.GCRA}
	for _, b := range []struct {
		algs []algo.Algorithm
		size int
	}{
		{[]algo.Algorithm{algo.SlidingWindowCounter}, 1}, {[]algo.Algorithm{algo.SlidingWindowCounter}, 16}, {[]algo.Algorithm{algo.SlidingWindowCounter}, 50},
		{three3, 16}, {three3, 50}, {[]algo.Algorithm{algo.FixedWindow}, 50},
	} {
		var rules []*algo.Policy
		for _, a := range b.algs {
			rules = append(rules, pol("batch-"+a.String(), a))
		}
		calls := make([]*call, b.size)
		for i := range calls {
			calls[i] = &call{done: make(chan struct{}, 1)}
		}
		name := fmt.Sprintf("1 rule %s, batches of %d", b.algs[0], b.size)
		if len(b.algs) == 3 {
			name = fmt.Sprintf("3 rules on one key, batches of %d", b.size)
		}
		// A decision is a request, of one rule or of three.
		batched = measure(name, b.size, func(i int) {
			w.batch = w.batch[:0]
			for j, c := range calls {
				reqs := make([]algo.Request, len(rules))
				for r, p := range rules {
					reqs[r] = algo.Request{Policy: p, Key: []byte(key(i + j))}
				}
				if err := rs.encode(ctx, c, reqs); err != nil {
					t.Fatal(err)
				}
				c.deadline = time.Now().Add(time.Minute)
				w.batch = append(w.batch, c)
			}
			rs.run(w, time.Now().Add(time.Minute))
			for _, c := range calls {
				<-c.done
				if c.err != nil || !c.admitted {
					t.Fatalf("batch: admitted %v, %v", c.admitted, c.err)
				}
			}
		})
	}
	t.Logf("ratios: fixed_window / naive %.2f, sliding_window_counter / naive %.2f, 3 rules / 1 rule (sliding_window_counter) %.2f, fixed_window in batches of 50 / envoyproxy/ratelimit %.2f, a key per window in batches of 50 / envoyproxy/ratelimit %.2f, 3 rules' state in one key (no arithmetic) / 1 rule (sliding_window_counter) %.2f",
		algs[algo.FixedWindow]/naive, algs[algo.SlidingWindowCounter]/naive, three/algs[algo.SlidingWindowCounter], batched/envoy, perWindow50/envoy, merged/algs[algo.SlidingWindowCounter])
}

// mergedArgs is the argument of the reference of three rules' state in
// one key: three rules as the flat layout sends them ([BBdddddd]:
// algorithm, shadow, limit, window, burst, delay, max cost, cost), then
// the key.
func mergedArgs(key string) string {
	var b []byte
	for _, a := range []byte{3, 4, 6} {
		b = append(b, a, 0)
		for _, f := range []float64{1_000_000, 3_600_000_000, 1_000_000, 3600, 1_000_000, 1} {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
		}
	}
	k := "merged:{" + key + "}"
	b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
	return string(append(b, k...))
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
	c := goredis.NewClient(&goredis.Options{Addr: addr})
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
