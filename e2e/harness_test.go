//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/faultlog"
	"github.com/authlimit/authlimit/internal/redistest"
)

// traefikVersion is the Traefik the suite builds when none is given.
const traefikVersion = "v3.6.12"

// bins are the programs under test, found (or built) once by TestMain.
var bins struct {
	repo      string
	dir       string // the temporary directory authlimit is built into
	authlimit string
	redis     string
	nginx     string
	caddy     string
	haproxy   string
	traefik   string
	missing   map[string]error // per proxy: why it cannot be had
}

// faults collects the fault tests' outcomes into e2e/FAULTS.md.
var faults = faultlog.New("make e2e")

func TestMain(m *testing.M) {
	if spec := os.Getenv(attackEnv); spec != "" {
		os.Exit(attackChild(spec))
	}
	os.Exit(run(m))
}

// run runs the suite and removes the build directory, whatever the
// outcome; TestMain exits with its code.
func run(m *testing.M) int {
	defer func() {
		if bins.dir != "" {
			_ = os.RemoveAll(bins.dir)
		}
		removeBuiltAuthlimit()
	}()
	if err := findBinaries(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	code := m.Run()
	if hostileLog.Len() > 0 {
		path := filepath.Join(bins.repo, "e2e", "HOSTILE.md")
		if partialRun() {
			path = filepath.Join(os.TempDir(), "authlimit-HOSTILE.md")
		}
		if err := hostileLog.Write(path); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			code = 1
		} else {
			fmt.Fprintln(os.Stderr, "e2e: hostile-client table written to", path)
		}
	}
	if len(faults.Entries()) > 0 {
		// The committed table is the whole suite's: a run of some tests
		// (-run, -skip) writes its rows beside it, not over it.
		path := filepath.Join(bins.repo, "e2e", "FAULTS.md")
		if partialRun() {
			path = filepath.Join(os.TempDir(), "authlimit-FAULTS.md")
		}
		if err := faults.Write(path); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			code = 1
		} else {
			fmt.Fprintln(os.Stderr, "e2e: fault table written to", path)
		}
	}
	return code
}

// partialRun reports whether the run was told to leave tests out.
func partialRun() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return true
		}
	}
	return false
}

func findBinaries() error {
	_, file, _, _ := runtime.Caller(0)
	bins.repo = filepath.Dir(filepath.Dir(file))
	bins.missing = map[string]error{}

	// authlimit is built exactly as the Dockerfile builds it, unless
	// AUTHLIMIT_E2E_AUTHLIMIT names a binary (another build's, to compare
	// it with this one).
	out, err := os.MkdirTemp("", "authlimit-e2e-")
	if err != nil {
		return err
	}
	bins.dir = out
	bins.authlimit = filepath.Join(out, "authlimit")
	if p := os.Getenv("AUTHLIMIT_E2E_AUTHLIMIT"); p != "" {
		bins.authlimit = p
	} else {
		build := exec.Command("make", "build", "BIN="+bins.authlimit)
		build.Dir = bins.repo
		if b, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("make build: %v\n%s", err, b)
		}
	}

	if bins.redis, err = exec.LookPath("redis-server"); err != nil {
		return errors.New("redis-server is not on PATH (Debian: apt-get install redis-server)")
	}
	if bins.nginx, err = exec.LookPath("nginx"); err != nil {
		bins.nginx = "/usr/sbin/nginx"
		if _, err := os.Stat(bins.nginx); err != nil {
			bins.missing["nginx"] = errors.New("nginx is not installed (Debian: apt-get install nginx)")
			bins.missing["openresty"] = bins.missing["nginx"]
		}
	}
	if _, err := os.Stat("/usr/lib/nginx/modules/ngx_http_lua_module.so"); err != nil {
		bins.missing["openresty"] = errors.New("the nginx Lua module is not installed (Debian: apt-get install libnginx-mod-http-lua)")
	}
	if bins.caddy, err = exec.LookPath("caddy"); err != nil {
		bins.missing["caddy"] = errors.New("caddy is not installed (Debian: apt-get install caddy)")
	}
	bins.haproxy, err = findHAProxy()
	switch {
	case err != nil:
		bins.missing["haproxy"], bins.missing["haproxy-spoe"], bins.missing["haproxy-spoe-unix"] = err, err, err
	case !withLua(bins.haproxy):
		bins.missing["haproxy"] = fmt.Errorf("%s was built without Lua (USE_LUA=1), which haproxy/authlimit.lua needs (Debian's haproxy has it)", bins.haproxy)
	}
	if bins.traefik, err = traefik(); err != nil {
		bins.missing["traefik"] = err
	}
	return nil
}

// findHAProxy finds haproxy: $AUTHLIMIT_E2E_HAPROXY (to run the suite
// against another version), or Debian's.
func findHAProxy() (string, error) {
	if p := os.Getenv("AUTHLIMIT_E2E_HAPROXY"); p != "" {
		return p, nil
	}
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		bin = "/usr/sbin/haproxy"
		if _, err := os.Stat(bin); err != nil {
			return "", errors.New("haproxy is not installed (Debian: apt-get install haproxy)")
		}
	}
	return bin, nil
}

// withLua reports whether haproxy was built with Lua, which
// haproxy/authlimit.lua needs (Debian's is); SPOE needs none.
func withLua(bin string) bool {
	out, err := exec.Command(bin, "-vv").CombinedOutput()
	return err == nil && strings.Contains(string(out), "USE_LUA=1")
}

// traefik returns a Traefik binary: $AUTHLIMIT_E2E_TRAEFIK, or the one
// cached under the user cache directory by version, or one built now from
// the Go module proxy and cached (go install refuses Traefik's replace
// directives, so the module is downloaded and built in a copy).
func traefik() (string, error) {
	if p := os.Getenv("AUTHLIMIT_E2E_TRAEFIK"); p != "" {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "authlimit", "traefik-"+traefikVersion)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	unlock, err := lockBuild(bin)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // built by another run while this one waited
	}
	fmt.Fprintf(os.Stderr, "e2e: building Traefik %s into %s (several minutes, once)\n", traefikVersion, bin)
	dl := exec.Command("go", "mod", "download", "-json", "github.com/traefik/traefik/v3@"+traefikVersion)
	b, err := dl.Output()
	if err != nil {
		return "", fmt.Errorf("download Traefik %s: %v", traefikVersion, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(b, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("download Traefik %s: %s %v", traefikVersion, mod.Error, err)
	}
	src, err := os.MkdirTemp("", "traefik-src-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	if b, err := exec.Command("cp", "-r", mod.Dir+"/.", src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copy Traefik source: %v %s", err, b)
	}
	_ = exec.Command("chmod", "-R", "u+w", src).Run()
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	gb := exec.Command("go", "build", "-o", bin+".tmp", "./cmd/traefik")
	gb.Dir = src
	gb.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if b, err := gb.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build Traefik %s: %v\n%s", traefikVersion, err, b)
	}
	return bin, os.Rename(bin+".tmp", bin)
}

// proc is a process the test started; it is stopped when the test ends.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func start(t *testing.T, name, bin string, args, env []string, dir string) *proc {
	t.Helper()
	return startOwned(t, t, name, bin, args, env, dir)
}

// startOwned starts a process for t that is stopped when owner ends: t
// itself, or a parent test it must outlive.
func startOwned(t, owner *testing.T, name, bin string, args, env []string, dir string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	owner.Cleanup(func() {
		p.stop()
		if owner.Failed() {
			owner.Logf("--- %s log (last lines) ---\n%s", name, tail(logPath, 30))
		}
	})
	return p
}

// stop ends the process and its children: SIGTERM, then SIGKILL.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// waitFor polls ready until it succeeds, the process exits, or 60s pass.
func waitFor(t *testing.T, p *proc, what string, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ready() {
		if p.exited() {
			t.Fatalf("%s exited before %s:\n%s", p.name, what, tail(p.log, 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not %s after 60s:\n%s", p.name, what, tail(p.log, 30))
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// authlimit is one running authlimit.
type authlimit struct {
	*proc
	addr string
	// spoa is the SPOE agent's address (AUTHLIMIT_SPOA_LISTEN); empty
	// without one.
	spoa string
}

// target is where px asks a: the SPOE agent (a Unix socket as HAProxy
// names one, unix@<path>) or /auth.
func (a *authlimit) target(px proxy) string {
	if path, ok := strings.CutPrefix(a.spoa, "unix:"); ok && px.spoe {
		return "unix@" + path
	}
	if px.spoe {
		return a.spoa
	}
	return a.addr
}

// socketDir is a directory for Unix sockets, removed when t ends: short,
// under the system's temporary directory, as a socket's path must be
// (108 bytes on Linux), where t.TempDir's is named after the test.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "authlimit-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func startAuthlimit(t *testing.T, name string, env map[string]string) *authlimit {
	t.Helper()
	return startAuthlimitOwned(t, t, name, env)
}

// startAuthlimitOwned starts authlimit for t, stopped when owner ends.
//
// A port freeAddr found free may be taken before authlimit binds it (a
// proxy's outgoing connection can get it as its source port): if authlimit
// exits because its decision or SPOE address is in use, it starts again on
// fresh ports, which are the ones the returned authlimit names. Any other
// exit fails t.
func startAuthlimitOwned(t, owner *testing.T, name string, env map[string]string) *authlimit {
	t.Helper()
	spoa := env["AUTHLIMIT_SPOA_LISTEN"]
	dir := owner.TempDir()
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		vars := []string{"PATH=" + os.Getenv("PATH"), "AUTHLIMIT_LISTEN=" + addr, "AUTHLIMIT_LOG_LEVEL=debug", "AUTHLIMIT_LOG_FORMAT=text"}
		for k, v := range env {
			if k == "AUTHLIMIT_SPOA_LISTEN" {
				v = spoa
			}
			vars = append(vars, k+"="+v)
		}
		p := startOwned(t, owner, name, bins.authlimit, nil, vars, dir)
		if servesHealthz(t, p, addr) {
			return &authlimit{proc: p, addr: addr, spoa: spoa}
		}
		log := tail(p.log, 30)
		taken := func(a string) bool { return a != "" && strings.Contains(log, a+": bind: address already in use") }
		if attempt >= 5 || !taken(addr) && !taken(spoa) {
			t.Fatalf("%s exited before serving /healthz:\n%s", p.name, log)
		}
		if taken(spoa) {
			spoa = freeAddr(t)
		}
		t.Logf("%s: a port was taken before it could bind it (attempt %d), starting it again on fresh ports", name, attempt)
	}
}

// healthy reports whether addr's /healthz answers 200 now.
func healthy(addr string) bool {
	r, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return false
	}
	r.Body.Close()
	return r.StatusCode == 200
}

// servesHealthz polls addr's /healthz until it answers 200 (true) or p
// exits (false); it fails t after 60s.
func servesHealthz(t *testing.T, p *proc, addr string) bool {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if healthy(addr) {
			return true
		}
		if p.exited() {
			return false
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not serving /healthz after 60s:\n%s", p.name, tail(p.log, 30))
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// backend counts what reaches it, per path, and remembers body digests.
type backend struct {
	addr string
	mu   sync.Mutex
	hits map[string]int
	sums map[string][][32]byte
}

func startBackend(t *testing.T) *backend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{addr: l.Addr().String(), hits: map[string]int{}, sums: map[string][][32]byte{}}
	srv := &http.Server{Handler: b, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return b
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.hits[r.URL.Path]++
	b.sums[r.URL.Path] = append(b.sums[r.URL.Path], sha256.Sum256(body))
	b.mu.Unlock()
	w.Header().Set("X-Backend", "yes")
	_, _ = io.WriteString(w, "backend ok\n")
}

func (b *backend) count(path string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hits[path]
}

func (b *backend) bodies(path string) [][32]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([][32]byte(nil), b.sums[path]...)
}

// client sends requests from one loopback address, so that each test's
// client is a distinct client IP to the proxy.
type client struct {
	ip string
	c  *http.Client
}

func newClient(ip string) *client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &client{ip: ip, c: &http.Client{
		Timeout:   90 * time.Second,
		Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
	}}
}

type result struct {
	status  int
	header  http.Header
	body    string
	elapsed time.Duration
}

func (c *client) do(t *testing.T, method, url string, body []byte, headers ...string) result {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = strings.NewReader(string(body))
	}
	req, err := http.NewRequestWithContext(context.Background(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	start := time.Now()
	resp, err := c.c.Do(req)
	if err != nil {
		t.Fatalf("%s %s from %s: %v", method, url, c.ip, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), elapsed: time.Since(start)}
}

// render reads a file of the repository and replaces each old string, which
// must occur exactly once, so that drift in the shipped files fails loudly.
func render(t *testing.T, rel string, pairs ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(bins.repo, rel))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for i := 0; i+1 < len(pairs); i += 2 {
		if n := strings.Count(s, pairs[i]); n != 1 {
			t.Fatalf("%s: %q occurs %d times, want once", rel, pairs[i], n)
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	return s
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// firstLine helps messages stay short.
func firstLine(s string) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	if sc.Scan() {
		return sc.Text()
	}
	return ""
}

// lockBuild takes an exclusive lock beside bin, waiting for it: e2e runs
// started at once (several checkouts on one machine) build a tool once,
// not once each, each compile of it taking gigabytes.
func lockBuild(bin string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(bin+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil
}
