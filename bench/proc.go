package main

// This file starts, watches and stops the processes under test, and reads
// their CPU time from /proc.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/authlimit/authlimit/internal/freeport"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// readyTimeout bounds the wait for a started process to answer.
const readyTimeout = 15 * time.Second

// proc is a child process leading its own process group, so that stopping
// it also stops whatever it started (nginx workers).
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	waitErr error         // valid after done
}

// startProc starts bin with args and env (nil: this process's), its output
// in dir/name.log.
func startProc(dir, name, bin string, args, env []string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	log, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer log.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	// Pdeathsig is a safety net should this program be killed outright;
	// the normal way out is stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// pid is the process's id, which is also its process group's.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop ends the process group: SIGTERM, then SIGKILL to whatever is left
// after a few seconds. It is safe to call more than once.
func (p *proc) stop() {
	pgid := p.pid()
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
	// Members that outlive the leader (or a leader that ignored SIGTERM).
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

// exitedError reports the process's exit with the tail of its output, or
// nil if it still runs.
func (p *proc) exitedError() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); its output ends:\n%s", p.name, p.waitErr, p.logTail())
	default:
		return nil
	}
}

// logTail is the end of the process's output.
func (p *proc) logTail() string { return fileTail(p.logPath, 4096) }

// fileTail is up to n bytes from the end of a file, or why it could not be
// read.
func fileTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	if len(b) == 0 {
		return "(nothing)"
	}
	return strings.TrimRight(string(b), "\n")
}

// waitReady polls check until it succeeds, failing early if one of procs
// exits and late after timeout. Readiness is polled, never slept on.
func waitReady(ctx context.Context, what string, timeout time.Duration, check func() error, procs ...*proc) error {
	deadline := time.Now().Add(timeout)
	for {
		for _, p := range procs {
			if err := p.exitedError(); err != nil {
				return fmt.Errorf("wait for %s: %w", what, err)
			}
		}
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			var tails []string
			for _, p := range procs {
				tails = append(tails, fmt.Sprintf("%s output:\n%s", p.name, p.logTail()))
			}
			return fmt.Errorf("wait for %s: not ready after %v: %w\n%s", what, timeout, err, strings.Join(tails, "\n"))
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// httpGet fetches a URL on a fresh connection: the status and body.
func httpGet(url string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// wantStatus is a readiness check: GET url answers want (0: any status).
func wantStatus(url string, want int) func() error {
	return func() error {
		status, _, err := httpGet(url)
		if err != nil {
			return err
		}
		if want != 0 && status != want {
			return fmt.Errorf("GET %s: status %d, want %d", url, status, want)
		}
		return nil
	}
}

// freeAddr returns a loopback address with a port free right now, for a
// process started next to bind (see package freeport).
func freeAddr() (string, error) {
	port, err := freeport.Get()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
}

// procStat reads a process's parent and its CPU time (user + system, all
// threads) in clock ticks.
func procStat(pid int) (ppid int, ticks uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name is in parentheses and may hold anything: fields
	// count from the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0, errors.New("malformed /proc stat")
	}
	ppid, err1 := strconv.Atoi(f[1])
	utime, err2 := strconv.ParseUint(f[11], 10, 64)
	stime, err3 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return 0, 0, fmt.Errorf("malformed /proc stat: %w", err)
	}
	return ppid, utime + stime, nil
}

// processTree is roots and all their descendants.
func processTree(roots ...int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, err := procStat(pid); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := append([]int(nil), roots...)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		out = append(out, pid)
		queue = append(queue, children[pid]...)
	}
	return out
}

// cpuTime is the CPU time the processes have used; processes gone since
// are left out.
func cpuTime(pids []int) time.Duration {
	var ticks uint64
	for _, pid := range pids {
		if _, t, err := procStat(pid); err == nil {
			ticks += t
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// childEnv is this process's environment without AUTHLIMIT_* variables
// (authlimit rejects unknown ones, and the caller's must not leak in),
// plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AUTHLIMIT_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}
