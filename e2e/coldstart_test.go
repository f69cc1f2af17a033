//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/internal/redistest"
)

// TestColdStartExact starts authlimit cold 20 times, each time firing 64
// concurrent clients at one key of every algorithm the moment it is ready,
// while other processes keep every CPU busy: every run admits exactly the
// limit, with default settings, and no decision fails or takes the fail
// mode. A healthy Redis that is merely busy must never turn into
// over-admission.
func TestColdStartExact(t *testing.T) {
	const starts, clients, limit = 20, 64, 40
	redis, err := redistest.Start(t, bins.redis)
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.Client(t)
	busy(t, runtime.NumCPU())
	algorithms := []string{"fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "leaky_bucket", "gcra"}
	var rules []string
	for _, a := range algorithms {
		rules = append(rules, fmt.Sprintf("name=%s key=ip limit=%d/1h algorithm=%s path=/%s", strings.ReplaceAll(a, "_", "-"), limit, a, a))
	}
	for run := 0; run < starts; run++ {
		a := startAuthlimit(t, fmt.Sprintf("authlimit-cold-%d", run), map[string]string{
			"AUTHLIMIT_REDIS_URL":  redis.URL,
			"AUTHLIMIT_KEY_PREFIX": fmt.Sprintf("cold%d", run),
			"AUTHLIMIT_RULES":      strings.Join(rules, ";"),
			"AUTHLIMIT_LOG_LEVEL":  "warn",
		})
		waitReady(t, a)
		dialed := connectionsReceived(t, admin)
		for _, alg := range algorithms {
			statuses := burst(t, a.addr, "/"+alg, clients)
			if statuses[200] != limit || statuses[429] != clients-limit {
				t.Errorf("start %d, %s: %d concurrent clients got %v, want exactly %d admitted and the rest 429", run+1, alg, clients, statuses, limit)
			}
		}
		if got := connectionsReceived(t, admin) - dialed; got != 0 {
			t.Errorf("start %d: authlimit dialed Redis %d times during the first bursts, want 0 (connections open before it is ready)", run+1, got)
		}
		m := scrape(t, a.addr)
		for _, name := range []string{"authlimit_store_errors_total", "authlimit_fail_mode_decisions_total", "authlimit_store_unavailable_total"} {
			if v := m.sum(name); v != 0 {
				t.Errorf("start %d: %s = %v, want 0 with a healthy Redis", run+1, name, v)
			}
		}
		a.stop()
		if t.Failed() {
			return
		}
	}
}

// connectionsReceived reads how many connections Redis has accepted.
func connectionsReceived(t *testing.T, c *goredis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("INFO stats has no total_connections_received")
	return 0
}

// busy keeps n processes spinning until the test ends.
func busy(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		})
	}
}

// waitReady polls /readyz until it answers 200 "ready".
func waitReady(t *testing.T, a *authlimit) {
	t.Helper()
	waitFor(t, a.proc, "ready", func() bool {
		r, err := http.Get("http://" + a.addr + "/readyz")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		return r.StatusCode == 200 && strings.HasPrefix(string(b), "ready")
	})
}

// burst sends n requests for one client at once, each on its own
// connection, released together, and counts the statuses.
func burst(t *testing.T, addr, path string, n int) map[int]int {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
		defer c.Close()
	}
	req := "GET /auth HTTP/1.1\r\nHost: authlimit\r\nX-Forwarded-For: 203.0.113.77\r\nX-Forwarded-Uri: " + path + "\r\nConnection: close\r\n\r\n"
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, req); err != nil {
				t.Error(err)
				return
			}
			b, err := io.ReadAll(c)
			status := 0
			if err == nil && len(b) > 12 {
				status, _ = strconv.Atoi(string(b[9:12]))
			}
			mu.Lock()
			statuses[status]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return statuses
}

// metrics are one /metrics scrape.
type metrics map[string]float64

func scrape(t *testing.T, addr string) metrics {
	t.Helper()
	r, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	m := metrics{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

// sum adds every series of a metric, whatever its labels.
// maxSeries is the largest value of the series of name, whatever their
// labels (0 when there are none).
func maxSeries(m map[string]float64, name string) float64 {
	var v float64
	for k, x := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			v = max(v, x)
		}
	}
	return v
}

func (m metrics) sum(name string) float64 {
	var s float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			s += v
		}
	}
	return s
}
