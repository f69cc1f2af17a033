//go:build e2e

package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/authlimit/authlimit/internal/redistest"
)

// The image tests build the image with make image (podman, FROM scratch,
// no registry) under a tag of their own, so that runs in parallel on one
// machine do not swap images under each other, and run it with podman on
// the host's network, listening on loopback ports chosen at run time.

// imageMaxBytes is the largest image the release may publish.
const imageMaxBytes = 40 << 20

// busyMachineBudget replaces the decision budget's 50ms default in the
// containers: on a loaded test machine a decision can miss 50ms, and
// authlimit then answers 503 (no fresh quota), which is not what these
// tests look at.
const busyMachineBudget = "2s"

// podmanRequired: with AUTHLIMIT_E2E_PODMAN=required (as .ci/run sets it)
// the image tests fail where podman or podman-compose is missing or cannot
// run, instead of skipping, so that CI cannot pass without testing the
// image.
func podmanRequired() bool { return os.Getenv("AUTHLIMIT_E2E_PODMAN") == "required" }

// podmanMissing skips the test, or fails it when podman is required.
func podmanMissing(t *testing.T, format string, args ...any) {
	t.Helper()
	if podmanRequired() {
		t.Fatalf(format+" (AUTHLIMIT_E2E_PODMAN=required)", args...)
	}
	t.Skipf(format, args...)
}

// podmanBin returns podman, or skips the test where podman cannot run.
func podmanBin(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("podman")
	if err != nil {
		podmanMissing(t, "podman is not installed, so the image is neither built nor run here (Debian: apt-get install podman runc; .ci/run installs them)")
	}
	if out, err := exec.Command(bin, "info").CombinedOutput(); err != nil {
		podmanMissing(t, "podman cannot run here, so the image is neither built nor run (podman info: %v):\n%s", err, lastLines(string(out), 10))
	}
	return bin
}

// podman runs podman with args and returns its standard output, trimmed;
// the error holds its standard error.
func podman(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("podman %s: %w\n%s", strings.Join(args, " "), err, lastLines(stderr.String()+out.String(), 20))
	}
	return strings.TrimSpace(out.String()), nil
}

// repoVersion is the repository's one version number.
func repoVersion(t *testing.T) string {
	t.Helper()
	return strings.TrimSpace(string(readRepo(t, "VERSION")))
}

// buildImage runs make image under a tag of the test's own and removes
// the image when the test ends. It returns the tag and the commit checked
// out when make image ran (a commit made meanwhile must not fail the
// label's check).
func buildImage(t *testing.T, pm string) (tag, revision string) {
	t.Helper()
	rev, err := exec.Command("git", "-C", bins.repo, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	tag = fmt.Sprintf("localhost/authlimit-e2e:%d-%d", os.Getpid(), time.Now().UnixNano())
	build := exec.Command("make", "--no-print-directory", "image", "IMAGE="+tag, "CONTAINER="+pm)
	build.Dir = bins.repo
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, lastLines(string(out), 40))
	}
	t.Logf("make image: %s in %v", tag, time.Since(start).Round(time.Second))
	t.Cleanup(func() {
		if _, err := podman(t, pm, "rmi", "-f", tag); err != nil {
			t.Logf("remove the image: %v", err)
		}
	})
	return tag, strings.TrimSpace(string(rev))
}

// imageConfig is what podman image inspect says of an image (the health
// check, an extension of Docker's format, beside the OCI config).
type imageConfig struct {
	Size   int64
	Config struct {
		User         string
		Entrypoint   []string
		Cmd          []string
		ExposedPorts map[string]struct{}
		Labels       map[string]string
	}
	Healthcheck *struct{ Test []string }
}

// TestImage builds the image with make image and holds it to what the
// release publishes and the chart and docker-compose.yml expect.
func TestImage(t *testing.T) {
	pm := podmanBin(t)
	version := repoVersion(t)
	img, revision := buildImage(t, pm)

	t.Run("contents", func(t *testing.T) { imageContents(t, pm, img, version, revision) })
	t.Run("chart", func(t *testing.T) { imageAsTheChartRunsIt(t, pm, img) })
	t.Run("compose", func(t *testing.T) { imageAsComposeRunsIt(t, pm, img, version) })
}

// imageContents: the default name is the published one with the version;
// the image is at most imageMaxBytes, runs /authlimit as 65532, has the
// health check and the OCI labels, and holds nothing but the static,
// stripped binary, CA certificates and the user's /etc/passwd and
// /etc/group.
func imageContents(t *testing.T, pm, img, version, revision string) {
	dry := exec.Command("make", "-n", "--no-print-directory", "image")
	dry.Dir = bins.repo
	out, err := dry.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, out)
	}
	if want := "-t ghcr.io/authlimit/authlimit:" + version + " "; !strings.Contains(string(out), want) {
		t.Errorf("make image does not tag the image %q:\n%s", want, out)
	}

	raw, err := podman(t, pm, "image", "inspect", img)
	if err != nil {
		t.Fatal(err)
	}
	var cfgs []imageConfig
	if err := json.Unmarshal([]byte(raw), &cfgs); err != nil || len(cfgs) != 1 {
		t.Fatalf("podman image inspect: %v\n%s", err, raw)
	}
	c := cfgs[0]
	t.Logf("image size %.1f MiB", float64(c.Size)/(1<<20))
	if c.Size > imageMaxBytes {
		t.Errorf("the image is %d bytes, more than %d", c.Size, imageMaxBytes)
	}
	if c.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", c.Config.User)
	}
	if got := strings.Join(c.Config.Entrypoint, " "); got != "/authlimit" || len(c.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q, cmd %q; want /authlimit alone", got, c.Config.Cmd)
	}
	if c.Healthcheck == nil || strings.Join(c.Healthcheck.Test, " ") != "CMD /authlimit -healthcheck" {
		t.Errorf("health check %+v, want CMD /authlimit -healthcheck", c.Healthcheck)
	}
	for _, p := range []string{"8080/tcp", "8081/tcp"} {
		if _, ok := c.Config.ExposedPorts[p]; !ok {
			t.Errorf("the image does not expose %s: %v", p, c.Config.ExposedPorts)
		}
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.source":   "https://github.com/authlimit/authlimit",
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": revision,
	} {
		if got := c.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}

	if got, err := podman(t, pm, "run", "--rm", "--network", "none", img, "-version"); err != nil || got != "authlimit "+version {
		t.Errorf("authlimit -version in the image: %q (%v), want %q", got, err, "authlimit "+version)
	}

	files := imageFiles(t, pm, img)
	var names []string
	for name := range files {
		names = append(names, name)
	}
	for _, want := range []string{"authlimit", "etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt"} {
		if _, ok := files[want]; !ok {
			t.Errorf("the image has no /%s (it has %v)", want, names)
		}
		delete(files, want)
	}
	for name := range files {
		t.Errorf("the image holds /%s, which nothing needs", name)
	}
	passwd := string(imageFile(t, pm, img, "etc/passwd"))
	if !regexp.MustCompile(`(?m)^[a-z]+:x:65532:65532:`).MatchString(passwd) {
		t.Errorf("/etc/passwd names no user 65532:\n%s", passwd)
	}
	if ca := imageFile(t, pm, img, "etc/ssl/certs/ca-certificates.crt"); bytes.Count(ca, []byte("BEGIN CERTIFICATE")) < 50 {
		t.Errorf("the CA bundle holds %d certificates", bytes.Count(ca, []byte("BEGIN CERTIFICATE")))
	}
	bin := filepath.Join(t.TempDir(), "authlimit")
	if err := os.WriteFile(bin, imageFile(t, pm, img, "authlimit"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("/authlimit: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("/authlimit is dynamically linked (%v)", p.Type)
		}
	}
	if f.Section(".symtab") != nil {
		t.Error("/authlimit is not stripped: it has a .symtab")
	}
}

// imageFiles lists the regular files of the image's file system (what a
// container of it exports, less what podman puts into every container).
func imageFiles(t *testing.T, pm, img string) map[string]bool {
	t.Helper()
	files := map[string]bool{}
	walkImage(t, pm, img, func(h *tar.Header, _ io.Reader) {
		if h.Typeflag != tar.TypeReg {
			return
		}
		name := strings.TrimPrefix(h.Name, "./")
		switch name {
		case "etc/hosts", "etc/resolv.conf", "etc/hostname", "run/.containerenv":
			return // podman's own, in every container
		}
		files[name] = true
	})
	return files
}

// imageFile returns one file of the image.
func imageFile(t *testing.T, pm, img, name string) []byte {
	t.Helper()
	var b []byte
	walkImage(t, pm, img, func(h *tar.Header, r io.Reader) {
		if strings.TrimPrefix(h.Name, "./") == name {
			var err error
			if b, err = io.ReadAll(r); err != nil {
				t.Fatal(err)
			}
		}
	})
	if b == nil {
		t.Fatalf("the image has no /%s", name)
	}
	return b
}

// walkImage exports a container of the image and calls visit for each
// entry of its file system.
func walkImage(t *testing.T, pm, img string, visit func(*tar.Header, io.Reader)) {
	t.Helper()
	id, err := podman(t, pm, "create", "--network", "none", img)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = podman(t, pm, "rm", "-f", id) }()
	cmd := exec.Command(pm, "export", id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("podman export: %v\n%s", err, stderr.String())
		}
		visit(h, tr)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("podman export: %v\n%s", err, stderr.String())
	}
}

// container is one running container of the image.
type container struct {
	pm, id, addr string
}

// runImage starts a container of img on the host's network, read-only,
// without capabilities or privilege escalation (as the chart's security
// contexts run it), with env and the mounts (host directory → container
// path, read-only), and waits for its /healthz at addr. It is removed when
// the test ends.
func runImage(t *testing.T, pm, img, addr string, env map[string]string, mounts map[string]string) *container {
	t.Helper()
	name := fmt.Sprintf("authlimit-e2e-%d-%d", os.Getpid(), time.Now().UnixNano())
	args := []string{"run", "-d", "--name", name, "--network", "host", "--read-only",
		"--cap-drop", "all", "--security-opt", "no-new-privileges"}
	for k, v := range env {
		args = append(args, "-e", k+"="+v)
	}
	for host, path := range mounts {
		args = append(args, "-v", host+":"+path+":ro")
	}
	id, err := podman(t, pm, append(args, img)...)
	if err != nil {
		t.Fatal(err)
	}
	c := &container{pm: pm, id: id, addr: addr}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command(pm, "logs", id).CombinedOutput()
			t.Logf("--- container log (last lines) ---\n%s", lastLines(string(logs), 30))
		}
		_, _ = podman(t, pm, "rm", "-f", "-t", "0", id)
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if healthy(addr) {
			return c
		}
		if state, _ := podman(t, pm, "inspect", "-f", "{{.State.Status}}", id); state != "running" {
			logs, _ := exec.Command(pm, "logs", id).CombinedOutput()
			t.Fatalf("the container is %s before serving /healthz:\n%s", state, lastLines(string(logs), 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container does not serve /healthz on %s after 60s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pid is the host's process id of the container's process.
func (c *container) pid(t *testing.T) int {
	t.Helper()
	out, err := podman(t, c.pm, "inspect", "-f", "{{.State.Pid}}", c.id)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(out)
	if err != nil || pid <= 0 {
		t.Fatalf("the container's process id: %q", out)
	}
	return pid
}

// processIDs returns the real, effective, saved and file-system user and
// group ids of the container's process, from the host's /proc.
func (c *container) processIDs(t *testing.T) (uids, gids string) {
	t.Helper()
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(c.pid(t)), "status"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
			uids = strings.Join(strings.Fields(v), " ")
		}
		if v, ok := strings.CutPrefix(sc.Text(), "Gid:"); ok {
			gids = strings.Join(strings.Fields(v), " ")
		}
	}
	return uids, gids
}

// terminate sends SIGTERM to the container's process, as the runtime does
// on a stop, then waits for its exit; it returns the time of the signal,
// and the exit code and time the runtime recorded (podman's own commands
// take seconds on a busy machine: they are left out of the timing).
func (c *container) terminate(t *testing.T) (signaled time.Time, code int, exited time.Time) {
	t.Helper()
	pid := c.pid(t)
	signaled = time.Now()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM to %d: %v", pid, err)
	}
	if _, err := podman(t, c.pm, "wait", c.id); err != nil {
		t.Fatal(err)
	}
	out, err := podman(t, c.pm, "inspect", c.id)
	if err != nil {
		t.Fatal(err)
	}
	var states []struct {
		State struct {
			ExitCode   int
			FinishedAt time.Time
		}
	}
	if err := json.Unmarshal([]byte(out), &states); err != nil || len(states) != 1 {
		t.Fatalf("podman inspect: %v\n%s", err, out)
	}
	return signaled, states[0].State.ExitCode, states[0].State.FinishedAt
}

// imageAsTheChartRunsIt runs the image with the environment, the rules
// mount and the security the chart's Deployment gives it (with Redis from
// its Secret), on a loopback port: it runs as 65532, answers /auth from
// Redis, serves the chart's probes on the chart's port, passes its health
// check, and on SIGTERM closes its idle connections and exits 0 within its
// shutdown timeout and the chart's grace period.
func imageAsTheChartRunsIt(t *testing.T, pm, img string) {
	redis, err := redistest.Start(t, bins.redis)
	if err != nil {
		t.Fatal(err)
	}
	r := helmTemplate(t, "--set", "redis.existingSecret=authlimit-redis", "--set", "rules=name=per-ip key=ip limit=3/1m")
	pod := r.deployment.Spec.Template.Spec
	c := pod.Containers[0]
	if got, want := c.Image, "ghcr.io/authlimit/authlimit:"+repoVersion(t); got != want {
		t.Errorf("the chart runs %s, want %s", got, want)
	}
	if u := pod.SecurityContext.RunAsUser; u == nil || *u != 65532 {
		t.Errorf("the chart runs the pod as %v, want the image's user 65532", u)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.Name == "AUTHLIMIT_REDIS_URL" && e.ValueFrom != nil:
			env[e.Name] = redis.URL
		case e.ValueFrom != nil:
			t.Fatalf("%s comes from %+v", e.Name, e.ValueFrom)
		default:
			env[e.Name] = e.Value
		}
	}
	for _, from := range c.EnvFrom {
		for k, v := range r.configMaps[from.ConfigMapRef.Name].Data {
			env[k] = v
		}
	}
	if env["AUTHLIMIT_REDIS_URL"] == "" {
		t.Fatal("the chart gives authlimit no AUTHLIMIT_REDIS_URL from the Secret")
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if got, want := env["AUTHLIMIT_LISTEN"], fmt.Sprintf(":%d", ports["http"]); got != want {
		t.Errorf("AUTHLIMIT_LISTEN = %q, want %q, the container's http port", got, want)
	}
	// The chart's port, 8080, may be taken on a shared machine: the
	// container listens on a free loopback port instead, which stands for
	// it below.
	addr := freeAddr(t)
	env["AUTHLIMIT_LISTEN"] = addr
	env["AUTHLIMIT_REDIS_TIMEOUT"] = busyMachineBudget

	// The rules ConfigMap, as the kubelet mounts it: a directory, readable
	// by the pod's user.
	rulesDir, err := os.MkdirTemp("", "authlimit-e2e-rules-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(rulesDir) })
	if err := os.Chmod(rulesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(rulesDir, "rules.conf"), r.configMaps["rl-authlimit-rules"].Data["rules.conf"])
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		if m.Name == "rules" {
			mounts[rulesDir] = m.MountPath
		}
	}
	if len(mounts) != 1 {
		t.Fatalf("the chart mounts no rules: %+v", c.VolumeMounts)
	}

	ctr := runImage(t, pm, img, addr, env, mounts)

	if uids, gids := ctr.processIDs(t); uids != "65532 65532 65532 65532" || gids != "65532 65532 65532 65532" {
		t.Errorf("the container's process runs as uid %q gid %q, want 65532 throughout", uids, gids)
	}

	for _, p := range []struct {
		name string
		path string
		port string
	}{
		{"liveness", c.LivenessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Port.String()},
		{"readiness", c.ReadinessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Port.String()},
	} {
		if ports[p.port] != ports["http"] {
			t.Errorf("the %s probe asks port %s (%d), not the port authlimit listens on (%d)", p.name, p.port, ports[p.port], ports["http"])
		}
		resp, err := http.Get("http://" + addr + p.path)
		if err != nil {
			t.Fatalf("%s probe %s: %v", p.name, p.path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s probe GET %s: %d, want 200", p.name, p.path, resp.StatusCode)
		}
	}

	cl := newClient("127.0.0.1")
	for i := 1; i <= 4; i++ {
		res := cl.do(t, "GET", "http://"+addr+"/auth", nil)
		want := 200
		if i == 4 {
			want = 429
		}
		if res.status != want || res.header.Get("X-RateLimit-Limit") != "3" {
			t.Errorf("request %d: %d with X-RateLimit-Limit %q (%s), want %d with 3", i, res.status, res.header.Get("X-RateLimit-Limit"), res.body, want)
		}
	}
	if n, err := redis.Client(t).DBSize(t.Context()).Result(); err != nil || n == 0 {
		t.Errorf("Redis holds %d keys (%v): the container did not decide in Redis", n, err)
	}

	if out, err := podman(t, pm, "healthcheck", "run", ctr.id); err != nil {
		t.Errorf("the health check fails on a serving container: %v", err)
	} else {
		t.Logf("podman healthcheck run: %s", out)
	}
	// The same health check against a port nobody serves fails: it asks.
	if _, err := podman(t, pm, "run", "--rm", "--network", "host", "-e", "AUTHLIMIT_LISTEN="+freeAddr(t), img, "-healthcheck"); err == nil {
		t.Error("authlimit -healthcheck passes with nothing listening")
	}

	// An idle keep-alive connection must not hold the shutdown up.
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: authlimit\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	timeout := 10 * time.Second // AUTHLIMIT_SHUTDOWN_TIMEOUT's default
	if v, ok := env["AUTHLIMIT_SHUTDOWN_TIMEOUT"]; ok {
		if timeout, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	if grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second; grace <= timeout {
		t.Errorf("terminationGracePeriodSeconds %v is not above the shutdown timeout %v: the kubelet would kill authlimit mid-shutdown", grace, timeout)
	}
	signaled, code, exited := ctr.terminate(t)
	took := exited.Sub(signaled)
	t.Logf("SIGTERM: exit %d after %v", code, took.Round(time.Millisecond))
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if took >= timeout {
		t.Errorf("the container took %v to stop, not within the shutdown timeout %v", took, timeout)
	}
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := idle.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the idle connection after shutdown: %d bytes, %v; want EOF", n, err)
	}
}

// imageAsComposeRunsIt: docker-compose.yml runs the image make image
// builds, and with its authlimit environment (Redis at redis:6379 pointed
// at a real Redis on loopback) the image enforces its first rule with
// nginx's 403. podman-compose is given the file to check that it reads it
// and would run that image with that environment, then runs its redis and
// authlimit services for real (composeUp); nginx and the backend, whose
// images come from a registry, are not started.
func imageAsComposeRunsIt(t *testing.T, pm, img, version string) {
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(readRepo(t, "docker-compose.yml"), &compose); err != nil {
		t.Fatal(err)
	}
	svc := compose.Services["authlimit"]
	if want := "ghcr.io/authlimit/authlimit:" + version; svc.Image != want {
		t.Errorf("docker-compose.yml runs %q, want %q, what make image builds", svc.Image, want)
	}

	pc, err := exec.LookPath("podman-compose")
	if err != nil {
		pc = ""
		if podmanRequired() {
			t.Error("podman-compose is not installed (Debian: apt-get install podman-compose; AUTHLIMIT_E2E_PODMAN=required)")
		} else {
			t.Log("podman-compose is not installed: the compose file is not given to it (Debian: apt-get install podman-compose)")
		}
	} else {
		project := fmt.Sprintf("authlimit-e2e-%d", os.Getpid())
		cmd := exec.Command(pc, "--dry-run", "-p", project, "-f", "docker-compose.yml", "up", "-d")
		cmd.Dir = bins.repo
		out, err := cmd.CombinedOutput()
		// podman-compose 1.0 creates the project's network even in a dry run.
		_, _ = podman(t, pm, "network", "rm", "-f", project+"_default")
		if err != nil {
			t.Fatalf("podman-compose --dry-run up: %v\n%s", err, out)
		}
		var run string
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "podman run ") && strings.Contains(line, "com.docker.compose.service=authlimit ") {
				run = line
			}
		}
		for _, want := range []string{" " + svc.Image, "-e AUTHLIMIT_DENY_STATUS=403", "-e AUTHLIMIT_REDIS_URL=redis://redis:6379"} {
			if !strings.Contains(run, want) {
				t.Errorf("podman-compose would not run authlimit with %q:\n%s", want, run)
			}
		}
	}

	redis, err := redistest.Start(t, bins.redis)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for k, v := range svc.Environment {
		env[k] = v
	}
	if got := env["AUTHLIMIT_REDIS_URL"]; got != "redis://redis:6379" {
		t.Fatalf("compose's AUTHLIMIT_REDIS_URL is %q, want redis://redis:6379 (the redis service)", got)
	}
	if _, ok := env["AUTHLIMIT_LISTEN"]; ok {
		t.Errorf("compose sets AUTHLIMIT_LISTEN: nginx/example.conf expects authlimit's default port")
	}
	env["AUTHLIMIT_REDIS_URL"] = redis.URL
	env["AUTHLIMIT_REDIS_TIMEOUT"] = busyMachineBudget
	addr := freeAddr(t)
	env["AUTHLIMIT_LISTEN"] = addr
	m := regexp.MustCompile(`limit=(\d+)/`).FindStringSubmatch(env["AUTHLIMIT_RULES"])
	if m == nil {
		t.Fatalf("no limit in compose's AUTHLIMIT_RULES %q", env["AUTHLIMIT_RULES"])
	}
	limit, _ := strconv.Atoi(m[1])
	deny, err := strconv.Atoi(env["AUTHLIMIT_DENY_STATUS"])
	if err != nil {
		t.Fatalf("compose's AUTHLIMIT_DENY_STATUS %q: %v", env["AUTHLIMIT_DENY_STATUS"], err)
	}

	runImage(t, pm, img, addr, env, nil)
	cl := newClient("127.0.0.1")
	for i := 1; i <= limit+1; i++ {
		want := 200
		if i > limit {
			want = deny
		}
		if res := cl.do(t, "GET", "http://"+addr+"/auth", nil); res.status != want {
			t.Errorf("request %d of %d: %d %s, want %d", i, limit+1, res.status, res.body, want)
		}
	}

	if pc != "" {
		t.Run("up", func(t *testing.T) { composeUp(t, pm, pc, img, limit, deny) })
	}
}
