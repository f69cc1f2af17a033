package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
)

// The reload tests run the built binary, as a deployment does: the file
// watch, SIGHUP and the swap under load are the process's own.

// builtBinary is cmd/authlimit built once per test run, in a directory
// TestMain removes.
var builtBinary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// authlimitBinary builds cmd/authlimit once per test run (without the race
// detector, as make build does) and returns its path.
func authlimitBinary(t *testing.T) string {
	t.Helper()
	buildBinaryOnce()
	if builtBinary.err != nil {
		t.Fatal(builtBinary.err)
	}
	return builtBinary.path
}

// buildBinaryOnce builds cmd/authlimit into builtBinary, once.
func buildBinaryOnce() {
	builtBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "authlimit-test-")
		if err != nil {
			builtBinary.err = err
			return
		}
		builtBinary.dir, builtBinary.path = dir, filepath.Join(dir, "authlimit")
		if out, err := exec.Command("go", "build", "-o", builtBinary.path, ".").CombinedOutput(); err != nil {
			builtBinary.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
}

// removeBuiltBinary removes the built binary's directory, if any.
func removeBuiltBinary() {
	builtBinary.once.Do(func() {}) // waits for a build under way
	if builtBinary.dir != "" {
		_ = os.RemoveAll(builtBinary.dir)
	}
}

// liveAuthlimit is a running authlimit process.
type liveAuthlimit struct {
	url  string
	cmd  *exec.Cmd
	logs *syncBuffer
	http *http.Client
}

// startBinary starts authlimit with env on a free loopback port and waits
// until it serves; it is stopped with SIGTERM when the test ends.
func startBinary(t *testing.T, env map[string]string) *liveAuthlimit {
	t.Helper()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(authlimitBinary(t))
	cmd.Env = []string{"AUTHLIMIT_LISTEN=" + addr, "AUTHLIMIT_LOG_FORMAT=text", "AUTHLIMIT_LOG_LEVEL=debug"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	a := &liveAuthlimit{url: "http://" + addr, cmd: cmd, logs: logs, http: &http.Client{Timeout: 15 * time.Second}}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("authlimit logs:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if r, err := a.http.Get(a.url + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return a
			}
		}
		select {
		case <-exited:
			t.Fatalf("authlimit exited at start:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("authlimit not serving after 20s:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// auth sends an auth subrequest with the header name: value and returns the
// status and the rate-limit headers.
func (a *liveAuthlimit) auth(name, value string) (int, http.Header, error) {
	req, err := http.NewRequest(http.MethodGet, a.url+"/auth", nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set(name, value)
	r, err := a.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	_, _ = io.Copy(io.Discard, r.Body)
	r.Body.Close()
	return r.StatusCode, r.Header, nil
}

// metric returns the value of a sample of /metrics, by its line's start
// (name and labels), or -1 when there is none.
func (a *liveAuthlimit) metric(t *testing.T, sample string) float64 {
	t.Helper()
	r, err := a.http.Get(a.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v
			}
		}
	}
	return -1
}

// configHash returns the hash label of authlimit_config_info.
func (a *liveAuthlimit) configHash(t *testing.T) string {
	t.Helper()
	r, err := a.http.Get(a.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	m := regexp.MustCompile(`(?m)^authlimit_config_info\{config="rules",hash="([0-9a-f]+)"\} 1$`).FindAllStringSubmatch(string(b), -1)
	if len(m) != 1 {
		t.Fatalf("authlimit_config_info has %d series, want 1", len(m))
	}
	return m[0][1]
}

// rulesV1 and rulesV2 differ in the carry rule's limit only: its name, key
// and algorithm stay, so its counts carry over.
const (
	rulesV1 = "# v1\nname=carry key=header:X-Key limit=10/1h algorithm=gcra\nname=load key=header:X-Load limit=1000000/1h\n"
	rulesV2 = "# v2\nname=carry key=header:X-Key limit=8/1h algorithm=gcra\nname=load key=header:X-Load limit=1000000/1h\n"
	// rulesBad has two mistakes, each to be logged.
	rulesBad = "name=carry key=header:X-Key limit=8/1x algorithm=gcra\nname=load key=header:X-Load limit=1000000/1h algorithm=nope\n"
)

// rulesDir is a directory holding the rules file, changed in one of the
// ways files are changed.
type rulesDir struct {
	dir, file string
	n         int
}

// newRulesDir writes text as the rules file; configMap lays it out as the
// kubelet does a ConfigMap volume: rules.conf → ..data/rules.conf, ..data
// → ..<n>, a directory holding the file.
func newRulesDir(t *testing.T, text string, configMap bool) *rulesDir {
	t.Helper()
	d := &rulesDir{dir: t.TempDir()}
	d.file = filepath.Join(d.dir, "rules.conf")
	if !configMap {
		d.write(t, text)
		return d
	}
	d.swap(t, text)
	if err := os.Symlink(filepath.Join("..data", "rules.conf"), d.file); err != nil {
		t.Fatal(err)
	}
	return d
}

// write writes the file in place: truncated, then written.
func (d *rulesDir) write(t *testing.T, text string) {
	t.Helper()
	if err := os.WriteFile(d.file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// rename writes a new file beside it and renames it over the old one.
func (d *rulesDir) rename(t *testing.T, text string) {
	t.Helper()
	tmp := filepath.Join(d.dir, ".rules.conf.tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, d.file); err != nil {
		t.Fatal(err)
	}
}

// swap updates as the kubelet updates a ConfigMap volume: a new
// timestamped directory, a new ..data symlink renamed over the old, the
// old directory removed.
func (d *rulesDir) swap(t *testing.T, text string) {
	t.Helper()
	d.n++
	ts := fmt.Sprintf("..2026_11_25_12_00_%02d.%d", d.n, d.n)
	if err := os.Mkdir(filepath.Join(d.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.dir, ts, "rules.conf"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	old, _ := os.Readlink(filepath.Join(d.dir, "..data"))
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(d.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// load sends auth subrequests from several goroutines until stopped, and
// counts those that failed: anything but a 200 (the load rule never
// denies) or a transport error.
type load struct {
	sent, failed atomic.Int64
	firstErr     atomic.Value
	stop         chan struct{}
	done         sync.WaitGroup
}

func startLoad(a *liveAuthlimit, workers int) *load {
	l := &load{stop: make(chan struct{})}
	for w := 0; w < workers; w++ {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				status, _, err := a.auth("X-Load", fmt.Sprintf("w%d-%d", w, i%64))
				l.sent.Add(1)
				if err != nil || status != http.StatusOK {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, fmt.Sprintf("status %d, err %v", status, err))
				}
			}
		}()
	}
	return l
}

func (l *load) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.done.Wait()
	if n := l.failed.Load(); n > 0 {
		t.Errorf("%d of %d requests under load failed across the reload; the first: %v", n, l.sent.Load(), l.firstErr.Load())
	}
	if l.sent.Load() < 10 {
		t.Errorf("only %d requests under load", l.sent.Load())
	}
}

// TestRulesFileReloadUnderLoad changes the rules file as an editor, a
// deployment tool and the kubelet do, while requests keep coming: none
// fails, the carry rule's counts carry over, and the new limit holds
// within 2s. A file with mistakes changes nothing, and every mistake is
// logged.
func TestRulesFileReloadUnderLoad(t *testing.T) {
	tests := []struct {
		name      string
		configMap bool
		redis     bool
		change    func(d *rulesDir, t *testing.T, text string)
		text      string
		// after the change: the carry rule's limit, and how many more
		// requests of the carry key it admits after 6
		limit, more int
	}{
		{"in-place write", false, false, (*rulesDir).write, rulesV2, 8, 2},
		{"atomic rename", false, false, (*rulesDir).rename, rulesV2, 8, 2},
		{"configmap symlink swap", true, false, (*rulesDir).swap, rulesV2, 8, 2},
		{"configmap symlink swap, redis", true, true, (*rulesDir).swap, rulesV2, 8, 2},
		{"bad file", false, false, (*rulesDir).write, rulesBad, 10, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newRulesDir(t, rulesV1, tt.configMap)
			env := map[string]string{"AUTHLIMIT_RULES_FILE": d.file}
			if tt.redis {
				srv := redistest.New(t)
				env["AUTHLIMIT_REDIS_URL"] = srv.URL
				env["AUTHLIMIT_KEY_PREFIX"] = srv.Prefix(t)
			}
			a := startBinary(t, env)
			before := a.configHash(t)
			l := startLoad(a, 4)
			for i := 0; i < 6; i++ {
				if status, h, err := a.auth("X-Key", "carry"); err != nil || status != http.StatusOK {
					t.Fatalf("carry request %d: %d %v %v", i+1, status, h, err)
				}
			}

			for l.sent.Load() < 20 {
				time.Sleep(time.Millisecond)
			}
			atChange := l.sent.Load()
			changed := time.Now()
			tt.change(d, t, tt.text)
			if tt.text == rulesBad {
				for a.metric(t, `authlimit_config_reloads_total{config="rules",result="error"}`) < 1 {
					if time.Since(changed) > 2*time.Second {
						t.Fatal("no refused reload 2s after a bad file was written")
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			// Fresh keys of the carry rule show its limit, consuming
			// nothing the test counts.
			for probe := 0; ; probe++ {
				_, h, err := a.auth("X-Key", fmt.Sprintf("probe-%d", probe))
				if err == nil && h.Get("X-RateLimit-Limit") == fmt.Sprint(tt.limit) {
					break
				}
				if time.Since(changed) > 2*time.Second {
					t.Fatalf("the carry rule's limit is %q 2s after the change, want %d", h.Get("X-RateLimit-Limit"), tt.limit)
				}
				time.Sleep(5 * time.Millisecond)
			}
			// The counts carried over: 6 of the old limit are spent.
			admitted := 0
			for i := 0; i < tt.limit; i++ {
				status, h, err := a.auth("X-Key", "carry")
				if err != nil {
					t.Fatal(err)
				}
				if got := h.Get("X-RateLimit-Limit"); got != fmt.Sprint(tt.limit) {
					t.Errorf("carry request after the change: limit %s, want %d", got, tt.limit)
				}
				if status != http.StatusOK {
					break
				}
				admitted++
			}
			if admitted != tt.more {
				t.Errorf("the carry key was admitted %d more times after the change, want %d (a fresh count would admit %d)", admitted, tt.more, tt.limit)
			}
			for l.sent.Load() < atChange+20 {
				time.Sleep(time.Millisecond)
			}
			l.finish(t)

			if r, err := a.http.Get(a.url + "/readyz"); err != nil || r.StatusCode != http.StatusOK {
				t.Errorf("/readyz after the reload: %v %v", r, err)
			} else {
				r.Body.Close()
			}
			after := a.configHash(t)
			success := a.metric(t, `authlimit_config_reloads_total{config="rules",result="success"}`)
			if tt.text == rulesBad {
				if after != before || success != 0 {
					t.Errorf("after a bad file: hash %s → %s, %v successful reloads; want no change", before, after, success)
				}
				logs := a.logs.String()
				for _, want := range []string{
					`AUTHLIMIT_RULES_FILE: ` + d.file + `: rule 1 \"carry\": limit`,
					`AUTHLIMIT_RULES_FILE: ` + d.file + `: rule 2 \"load\": algorithm`,
				} {
					if !strings.Contains(logs, want) {
						t.Errorf("the logs do not say %s", want)
					}
				}
				// A good file after a bad one is taken.
				fixed := time.Now()
				d.write(t, rulesV2)
				for a.configHash(t) == before {
					if time.Since(fixed) > 2*time.Second {
						t.Fatal("a good file after a bad one not in force after 2s")
					}
					time.Sleep(10 * time.Millisecond)
				}
				return
			}
			if after == before || success != 1 {
				t.Errorf("hash %s → %s, %v successful reloads; want a new hash and 1", before, after, success)
			}
			if ts := a.metric(t, `authlimit_config_last_reload_success_timestamp_seconds{config="rules"}`); ts < float64(changed.Unix()) {
				t.Errorf("last successful reload at %v, before the change at %v", ts, changed.Unix())
			}
		})
	}
}

// TestSIGHUP: SIGHUP reloads the rules file and AUTHLIMIT_RLS_CONFIG (and
// stops nothing); with the rules in AUTHLIMIT_RULES it says there is
// nothing to reload.
func TestSIGHUP(t *testing.T) {
	t.Parallel()
	d := newRulesDir(t, rulesV1, false)
	rlsFile := filepath.Join(t.TempDir(), "ratelimit.yaml")
	if err := os.WriteFile(rlsFile, []byte(rlsYAML(5, "minute")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"rules file", map[string]string{"AUTHLIMIT_RULES_FILE": d.file}, "trigger=SIGHUP"},
		{"rules variable", map[string]string{"AUTHLIMIT_RULES": "name=a limit=1/1m"}, "nothing to reload"},
		// Only the rate-limit configuration's reload logs a hash after
		// its trigger.
		{"rls config", map[string]string{"AUTHLIMIT_RULES": "name=a limit=1/1m", "AUTHLIMIT_RLS_CONFIG": rlsFile}, "trigger=SIGHUP hash="},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := startBinary(t, tt.env)
			if err := a.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for !strings.Contains(a.logs.String(), tt.want) {
				if time.Now().After(deadline) {
					t.Fatalf("no %q logged 5s after SIGHUP", tt.want)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if status, _, err := a.auth("X-Forwarded-For", "203.0.113.9"); err != nil || status != http.StatusOK {
				t.Errorf("after SIGHUP: %d %v", status, err)
			}
		})
	}
}

// TestReloadLeavesRequestsInFlight: a request shaped (held) under the old
// rules when they are swapped finishes under them: admitted, with the old
// rules' headers.
func TestReloadLeavesRequestsInFlight(t *testing.T) {
	const (
		v1 = "name=shape key=header:X-Shape limit=1/5s algorithm=leaky_bucket burst=1 delay=10s\n"
		v2 = "name=shape key=header:X-Shape limit=3/5s algorithm=leaky_bucket burst=3 delay=10s\n"
	)
	d := newRulesDir(t, v1, false)
	a := startBinary(t, map[string]string{"AUTHLIMIT_RULES_FILE": d.file})
	if status, _, err := a.auth("X-Shape", "held"); err != nil || status != http.StatusOK {
		t.Fatalf("first request: %d %v", status, err)
	}
	type answer struct {
		status  int
		h       http.Header
		err     error
		elapsed time.Duration
	}
	held := make(chan answer, 1)
	start := time.Now()
	go func() {
		status, h, err := a.auth("X-Shape", "held")
		held <- answer{status, h, err, time.Since(start)}
	}()
	// The second request is decided at once, then held for its turn,
	// about 5s: once it is counted, it is in flight.
	for a.metric(t, `authlimit_requests_total{front="http",result="allowed"}`) < 2 {
		if time.Since(start) > 3*time.Second {
			t.Fatal("the second request not decided 3s after it was sent")
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.write(t, v2)
	for probe := 0; ; probe++ {
		_, h, err := a.auth("X-Shape", fmt.Sprintf("probe-%d", probe))
		if err == nil && h.Get("X-RateLimit-Limit") == "3" {
			break
		}
		if time.Since(start) > 4*time.Second {
			t.Fatal("the new rules not in force 4s after the held request started: too slow to tell")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(held) > 0 {
		t.Fatal("the held request finished before the swap: too fast to tell")
	}
	got := <-held
	if got.err != nil || got.status != http.StatusOK {
		t.Fatalf("the held request: %d %v", got.status, got.err)
	}
	if l := got.h.Get("X-RateLimit-Limit"); l != "1" {
		t.Errorf("the held request answered with limit %s, want the old rules' 1", l)
	}
	if got.elapsed < 3*time.Second {
		t.Errorf("the held request took %v, want its turn of about 5s under the old rules", got.elapsed)
	}
}
