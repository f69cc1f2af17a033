//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/authlimit/authlimit/internal/hostile"
)

// hostileLog collects the hostile-client tests' outcomes into
// e2e/HOSTILE.md.
var hostileLog = hostile.NewLog("make e2e")

// The hostile suite's bounds (README: Security).
const (
	// hostileRSS is the most authlimit may hold during any attack: half
	// the 256 Mi the Helm chart gives the pod.
	hostileRSS = 128 << 20
	// hostileSettle is how close to its level before an attack
	// authlimit's memory must be a minute after it ended.
	hostileSettle = 32 << 20
	// hostileLater is how long after an attack its memory is measured
	// again.
	hostileLater = time.Minute
	// hostileKill is where an attacked authlimit is killed, so that a
	// build that does not hold does not take the machine down with it.
	hostileKill = 1 << 30
	// legitTimeout is how long a well-behaved client's call may take
	// before it counts as failed: long, as the attack and the client
	// share the machine's cores.
	legitTimeout = 15 * time.Second
	// legitEvery is how often the well-behaved clients call.
	legitEvery = 20 * time.Millisecond
)

// hostileTarget is one authlimit under attack.
type hostileTarget struct {
	*authlimit
	grpc, admin string
}

// The ports an attack aims at.
const (
	portGRPC  = "gRPC"
	portHTTP  = "decision (HTTP)"
	portAdmin = "admin"
)

// attackCase is one row of the table: an attack on one port, and what
// must hold during it.
type attackCase struct {
	name, port string
	env        map[string]string
	// spec is the attack, run in a process of its own (attackChild);
	// its address is the port's.
	spec hostile.Spec
	// memory: the attack aims at memory; RSS is held to hostileRSS and,
	// a minute later, to hostileSettle above where it began.
	memory bool
	// maxCPU, if set, bounds authlimit's CPU time during the attack.
	maxCPU time.Duration
	// legitSource is the address the well-behaved clients call from
	// ("" any).
	legitSource string
	// check, if set, asserts what the attacker saw.
	check func(t *testing.T, seen hostile.Counts, a *hostileTarget)
}

// attackRun is an attack done, waiting for its minute-later sample.
type attackRun struct {
	c        attackCase
	row      hostile.Row
	failed   bool
	target   *hostileTarget
	ended    time.Time
	afterErr error
}

// checkMessage is a Check request message as Envoy sends one, framed for
// gRPC.
func checkMessage(t *testing.T) []byte {
	t.Helper()
	b, err := proto.Marshal(hostile.CheckRequest("198.51.100.7"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{0, byte(len(b) >> 24), byte(len(b) >> 16), byte(len(b) >> 8), byte(len(b))}, b...)
}

// TestHostile runs each attack against a fresh authlimit while a
// well-behaved client calls /auth and Check, and writes e2e/HOSTILE.md.
// The minute-later samples of all attacks are taken together at the end.
func TestHostile(t *testing.T) {
	msg := checkMessage(t)
	const mib = 1 << 20
	halfSent := func(conns int) attackCase {
		return attackCase{
			name: fmt.Sprintf("half-sent gRPC calls (4 MiB announced, 1 MiB sent, never finished) on %d connections", conns),
			port: portGRPC, memory: true,
			spec: hostile.Spec{Kind: hostile.KindHalfSent, Duration: 8 * time.Second, Conns: conns, Size: 4 * mib, Sent: mib},
		}
	}
	flood := func(kind hostile.EmptyFrame) attackCase {
		return attackCase{
			name: fmt.Sprintf("%s flood on 2 connections", kind), port: portGRPC, check: calmed,
			spec: hostile.Spec{Kind: hostile.KindEmptyFrames, Duration: 4 * time.Second, Conns: 2, Frame: kind},
		}
	}
	cases := []attackCase{
		halfSent(16), halfSent(64), halfSent(400),
		{
			name: "half-open streams (HEADERS, then nothing) up to 1024 a connection on 64 connections", port: portGRPC, memory: true,
			spec: hostile.Spec{Kind: hostile.KindHalfOpen, Duration: 8 * time.Second, Conns: 64, Streams: 1024},
		},
		{
			name: "empty CONTINUATION flood on 2 connections", port: portGRPC, maxCPU: time.Second, check: calmed,
			spec: hostile.Spec{Kind: hostile.KindContinuation, Duration: 8 * time.Second, Conns: 2},
		},
		flood(hostile.EmptyData), flood(hostile.ZeroWindowUpdate), flood(hostile.Priority), flood(hostile.UnknownType),
		flood(hostile.EmptySettings), flood(hostile.Ping), flood(hostile.UnsolicitedPingAck),
		{
			name: "rapid reset (whole Check calls reset at once) on 4 connections", port: portGRPC,
			spec: hostile.Spec{Kind: hostile.KindRapidReset, Duration: 4 * time.Second, Conns: 4, Msg: msg},
		},
		{
			name: "HPACK bomb (16 KiB blocks naming a 3.9 KB field 16,000 times) on 4 connections", port: portGRPC,
			spec: hostile.Spec{Kind: hostile.KindHPACKBomb, Duration: 4 * time.Second, Conns: 4},
		},
		{
			name: "zero window (SETTINGS_INITIAL_WINDOW_SIZE 0, 2000 calls a connection) on 16 connections", port: portGRPC, memory: true,
			spec: hostile.Spec{Kind: hostile.KindZeroWindow, Duration: 8 * time.Second, Conns: 16, Calls: 2000, Msg: msg},
		},
		{
			name: "slow reader (whole calls, answers never read) on 16 connections", port: portGRPC, memory: true,
			spec: hostile.Spec{Kind: hostile.KindSlowReader, Duration: 8 * time.Second, Conns: 16, Msg: msg},
		},
		{
			name: "connection flood (preface and SETTINGS, then nothing) to the cap of 4000", port: portGRPC, memory: true,
			env:  map[string]string{"AUTHLIMIT_MAX_CONNS": "4000"},
			spec: hostile.Spec{Kind: hostile.KindConnFloodH2, Duration: 8 * time.Second, Conns: 4200},
		},
		{
			name: "untrusted peer (whole Check calls for another client, from outside AUTHLIMIT_GRPC_TRUSTED_PEERS) on 4 connections", port: portGRPC,
			env:         map[string]string{"AUTHLIMIT_GRPC_TRUSTED_PEERS": "127.0.0.2"},
			legitSource: "127.0.0.2",
			spec:        hostile.Spec{Kind: hostile.KindWholeCalls, Duration: 4 * time.Second, Conns: 4, Msg: msg},
			check: func(t *testing.T, seen hostile.Counts, _ *hostileTarget) {
				if seen.Answers > 0 || seen.Closed == 0 {
					t.Errorf("the untrusted peer: %s; want every connection closed, no call answered", seen)
				}
			},
		},
		{
			name: "unfinished headers (30 KB, never ended) on 2000 connections", port: portHTTP, memory: true,
			spec: hostile.Spec{Kind: hostile.KindHeldHeaders, Duration: 8 * time.Second, Conns: 2000, Size: 30_000, Path: "/auth"},
		},
		{
			name: "slowloris (a header byte a second) on 2000 connections", port: portHTTP, memory: true,
			spec: hostile.Spec{Kind: hostile.KindSlowLoris, Duration: 8 * time.Second, Conns: 2000, Interval: time.Second, Path: "/auth"},
		},
		{
			name: "connection flood (nothing sent) to the cap of 4000", port: portHTTP, memory: true,
			env:  map[string]string{"AUTHLIMIT_MAX_CONNS": "4000"},
			spec: hostile.Spec{Kind: hostile.KindConnFloodTCP, Duration: 8 * time.Second, Conns: 4200},
		},
		{
			name: "unfinished headers (30 KB, never ended) on 2000 connections", port: portAdmin, memory: true,
			spec: hostile.Spec{Kind: hostile.KindHeldHeaders, Duration: 8 * time.Second, Conns: 2000, Size: 30_000, Path: "/v1/config"},
		},
	}
	var runs []*attackRun
	parent := t
	for _, c := range cases {
		t.Run(c.name+" ("+c.port+")", func(t *testing.T) {
			// The process outlives the subtest: it is measured again a
			// minute later, and stopped when the whole test ends.
			r := &attackRun{c: c, target: startTarget(t, parent, c.env), row: hostile.Row{Attack: c.name, Port: c.port, Duration: c.spec.Duration}}
			runs = append(runs, r)
			runAttack(t, r)
		})
	}
	t.Run("a minute later", func(t *testing.T) {
		var wg sync.WaitGroup
		for _, r := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sleepUntil(r.ended.Add(hostileLater))
				u, err := hostile.ReadUsage(r.target.cmd.Process.Pid)
				r.row.RSSAfter = u.RSS
				r.afterErr = err
			}()
		}
		wg.Wait()
		for _, r := range runs {
			if r.afterErr != nil {
				t.Errorf("%s (%s): a minute later: %v", r.c.name, r.c.port, r.afterErr)
				r.failed = true
			}
			if r.c.memory && r.row.RSSAfter > r.row.RSSBefore+hostileSettle {
				t.Errorf("%s (%s): RSS %s a minute after the attack, %s before: more than %s above", r.c.name, r.c.port,
					hostile.MiB(r.row.RSSAfter), hostile.MiB(r.row.RSSBefore), hostile.MiB(hostileSettle))
				r.failed = true
			}
			r.row.Passed = !r.failed
			hostileLog.Add(r.row)
		}
	})
}

// calmed asserts that the server ended the flooding connections with
// GOAWAY ENHANCE_YOUR_CALM.
func calmed(t *testing.T, seen hostile.Counts, _ *hostileTarget) {
	t.Helper()
	if seen.Calm == 0 {
		t.Errorf("no GOAWAY ENHANCE_YOUR_CALM: %s", seen)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func sleepUntil(at time.Time) {
	if d := time.Until(at); d > 0 {
		time.Sleep(d)
	}
}

// startTarget starts an authlimit to attack, with the gRPC and admin
// ports on, and env.
func startTarget(t, owner *testing.T, extra map[string]string) *hostileTarget {
	t.Helper()
	env := map[string]string{
		"AUTHLIMIT_GRPC_LISTEN":  freeAddr(t),
		"AUTHLIMIT_ADMIN_LISTEN": freeAddr(t),
		"AUTHLIMIT_ADMIN_TOKEN":  "hostile-admin-token-0123456789",
		"AUTHLIMIT_LOG_LEVEL":    "info",
		"AUTHLIMIT_RULES":        "name=per-ip key=ip limit=1000000/1m",
	}
	for k, v := range extra {
		env[k] = v
	}
	a := startAuthlimitOwned(t, owner, "authlimit", env)
	return &hostileTarget{authlimit: a, grpc: env["AUTHLIMIT_GRPC_LISTEN"], admin: env["AUTHLIMIT_ADMIN_LISTEN"]}
}

// runAttack measures run's target, runs its attack on it with the
// well-behaved clients alongside, and checks what must hold.
func runAttack(t *testing.T, run *attackRun) {
	c, target, a := run.c, run.target, run.target.authlimit
	run.row.Test = t.Name()
	run.ended = time.Now()
	t.Cleanup(func() { run.failed = run.failed || t.Failed() })

	// Warm up: a few calls of each kind, so that what they allocate once
	// is in the figure before.
	warm, cancelWarm := context.WithTimeout(context.Background(), 500*time.Millisecond)
	go hostile.LegitHTTP(warm, "http://"+a.addr+"/auth", c.legitSource, legitEvery, legitTimeout, []int{200, 429})
	hostile.LegitCheck(warm, target.grpc, c.legitSource, "198.51.100.9", legitEvery, legitTimeout, nil)
	cancelWarm()
	pid := a.cmd.Process.Pid
	before, err := hostile.ReadUsage(pid)
	if err != nil {
		t.Fatal(err)
	}
	run.row.RSSBefore = before.RSS
	w, err := hostile.StartWatch(pid, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), c.spec.Duration)
	defer cancel()
	// A build that does not hold is stopped before it takes the
	// machine's memory.
	go func() {
		for ctx.Err() == nil {
			if w.Peak() > hostileKill {
				t.Errorf("RSS above %s: authlimit killed", hostile.MiB(hostileKill))
				_ = a.cmd.Process.Kill()
				return
			}
			sleep(ctx, 50*time.Millisecond)
		}
	}()
	var auth, check *hostile.Latencies
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		auth = hostile.LegitHTTP(ctx, "http://"+a.addr+"/auth", c.legitSource, legitEvery, legitTimeout, []int{200, 429})
	}()
	go func() {
		defer wg.Done()
		check = hostile.LegitCheck(ctx, target.grpc, c.legitSource, "198.51.100.10", legitEvery, legitTimeout, nil)
	}()
	spec := c.spec
	spec.Addr = map[string]string{portGRPC: target.grpc, portHTTP: a.addr, portAdmin: target.admin}[c.port]
	seen, err := runAttackChild(spec)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatalf("the attacker: %v", err)
	}
	run.ended = time.Now()
	peak, cpu, werr := w.Stop()
	run.row.PeakRSS, run.row.CPU = peak, cpu
	run.row.AuthP99, run.row.CheckP99 = auth.String(), check.String()
	run.row.Outcome = seen.String()
	t.Logf("%s: RSS %s → peak %s; CPU %.2fs; /auth %s; Check %s; attacker: %s", c.name, hostile.MiB(before.RSS), hostile.MiB(peak), cpu.Seconds(), auth, check, seen)
	if werr != nil {
		t.Fatalf("authlimit: %v (it ended during the attack?)\n%s", werr, tail(a.log, 20))
	}
	if c.memory && peak > hostileRSS {
		t.Errorf("peak RSS %s, want at most %s", hostile.MiB(peak), hostile.MiB(hostileRSS))
	}
	if c.maxCPU > 0 && cpu > c.maxCPU {
		t.Errorf("authlimit used %.2fs of CPU in %s, want at most %.2fs", cpu.Seconds(), c.spec.Duration, c.maxCPU.Seconds())
	}
	if auth.Failures() > 0 || auth.Calls() == 0 {
		t.Errorf("/auth during the attack: %s", auth)
	}
	if check.Failures() > 0 || check.Calls() == 0 {
		t.Errorf("Check during the attack: %s", check)
	}
	if c.check != nil {
		c.check(t, seen, target)
	}
	if a.exited() {
		t.Fatalf("authlimit exited during the attack:\n%s", tail(a.log, 20))
	}
}

// attackEnv, set in the environment of the test binary, makes it the
// attacker: it runs the attack the variable's JSON names (a hostile.Spec)
// and writes what it saw (hostile.Counts, JSON) to its standard output.
const attackEnv = "AUTHLIMIT_E2E_ATTACK"

// runAttackChild runs spec in a process of its own, the test binary
// again, so that the attacker's goroutines do not take the well-behaved
// clients' share of this process's scheduler.
func runAttackChild(spec hostile.Spec) (hostile.Counts, error) {
	var seen hostile.Counts
	b, err := json.Marshal(spec)
	if err != nil {
		return seen, err
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), attackEnv+"="+string(b))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return seen, fmt.Errorf("%v: %s", err, stderr.String())
	}
	if err := json.Unmarshal(out, &seen); err != nil {
		return seen, fmt.Errorf("its report %q: %v", out, err)
	}
	return seen, nil
}

// attackChild is the attacker process's whole work; its result is the
// process's exit code.
func attackChild(specJSON string) int {
	var spec hostile.Spec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "attack:", err)
		return 2
	}
	seen, err := hostile.Run(context.Background(), spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "attack:", err)
		return 2
	}
	if err := json.NewEncoder(os.Stdout).Encode(seen); err != nil {
		fmt.Fprintln(os.Stderr, "attack:", err)
		return 2
	}
	return 0
}
