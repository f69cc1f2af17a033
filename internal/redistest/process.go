package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startTimeout bounds how long a redis-server may take to answer PING.
const startTimeout = 10 * time.Second

// procSpec says how to run one redis-server (or sentinel) process. A
// restart runs the same spec again, so a node keeps its port, its directory
// and with it its nodes.conf.
type procSpec struct {
	path string
	port int
	dir  string
	// config, when set, is a config file; redis-server wants it first on
	// its command line.
	config string
	// extra goes after the standard arguments; a later argument overrides
	// an earlier one of the same name (checked on Redis 7.0: "--port 0"
	// after "--port N" leaves only TLS listening).
	extra []string
	// dial connects to the server; plain TCP when nil.
	dial func(addr string) (net.Conn, error)
}

func (s procSpec) addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

func (s procSpec) logPath() string {
	return filepath.Join(s.dir, "redis.log")
}

// process is one running redis-server.
type process struct {
	spec procSpec
	cmd  *exec.Cmd
	done chan struct{}
}

// startProcess runs spec and waits until the server answers, or fails with
// the tail of its log.
func startProcess(spec procSpec) (*process, error) {
	var args []string
	if spec.config != "" {
		args = append(args, spec.config)
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(spec.port),
		"--save", "",
		"--appendonly", "no",
		"--dir", spec.dir,
		"--daemonize", "no",
		"--logfile", spec.logPath(),
	)
	args = append(args, spec.extra...)
	cmd := exec.Command(spec.path, args...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.path, err)
	}
	p := &process{spec: spec, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	deadline := time.Now().Add(startTimeout)
	for {
		err := serving(spec, cmd.Process.Pid)
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("redis-server on port %d exited at start: %s", spec.port, tail(spec.logPath()))
		default:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("redis-server on port %d not ready after %v (last: %v): %s", spec.port, startTimeout, err, tail(spec.logPath()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop kills the process, as a crash would, and waits until it is gone.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// alive reports whether the process still runs.
func (p *process) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// startOwned starts spec on ports from FreePort, retrying when another
// process took the port in between, and stops it when t ends. ports gives
// the number of ports to pick; spec.port gets the first and withPorts
// builds the extra arguments from all of them.
func startOwned(t testing.TB, spec procSpec, ports int, withPorts func(ports []int) []string) (*process, error) {
	t.Helper()
	base := spec.extra
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		picked := make([]int, ports)
		for i := range picked {
			p, err := FreePort()
			if err != nil {
				return nil, err
			}
			picked[i] = p
		}
		spec.port = picked[0]
		spec.extra = base
		if withPorts != nil {
			spec.extra = append(append([]string(nil), base...), withPorts(picked)...)
		}
		p, err := startProcess(spec)
		if err != nil {
			lastErr = err
			continue // most likely another process took a port
		}
		t.Cleanup(p.stop)
		return p, nil
	}
	return nil, lastErr
}

// serving tells whether the process pid serves spec's address. It checks
// the pid because another test may have started a server on the same port
// a moment earlier, and then it is that server that answers while this one
// fails to bind.
func serving(spec procSpec, pid int) error {
	dial := spec.dial
	if dial == nil {
		dial = func(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, 200*time.Millisecond) }
	}
	c, err := dial(spec.addr())
	if err != nil {
		return err
	}
	rc := &respConn{conn: c, r: bufio.NewReader(c)}
	defer rc.close()
	if _, err := rc.do("PING"); err != nil {
		return err
	}
	v, err := rc.do("INFO", "server")
	if err != nil {
		return err
	}
	info, _ := v.(string)
	if got := infoField(info, "process_id"); got != strconv.Itoa(pid) {
		return fmt.Errorf("another process (pid %s) answers on port %d", got, spec.port)
	}
	return nil
}

// tail returns the end of the log at path, for failure messages.
func tail(path string) string { return tailN(path, 800) }

// tailN returns the last n bytes or so of the log at path.
func tailN(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return "log " + path + ":\n" + s
}

// poll calls check every 25ms until it returns nil, and returns nil, or
// until timeout passes, and returns check's last error.
func poll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// serverPath returns redis-server from PATH or fails t.
func serverPath(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: no redis-server on PATH (Debian: apt-get install redis-server)")
	}
	return path
}
