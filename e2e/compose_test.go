//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// composeUp runs docker-compose.yml with podman-compose, as far as it runs
// without a registry: its authlimit service (the image make image built)
// and its redis service, on the compose network, authlimit finding Redis
// by the service name. The redis service's redis:7-alpine stands in as an
// image built here FROM scratch from this machine's redis-server; nginx and
// the backend are not started (their images come from a registry, and the
// e2e suite runs nginx/example.conf with real nginx). An override file
// gives the images and publishes the two services' ports on loopback, so
// the test can ask authlimit and look into Redis.
func composeUp(t *testing.T, pm, pc, img string, limit, deny int) {
	redisImg := standInRedisImage(t, pm)
	authAddr, redisAddr := freeAddr(t), freeAddr(t)
	override := filepath.Join(t.TempDir(), "override.yml")
	writeFile(t, override, fmt.Sprintf(`services:
  redis:
    image: %s
    ports: [%q]
  authlimit:
    image: %s
    ports: [%q]
    environment:
      AUTHLIMIT_REDIS_TIMEOUT: %q
`, redisImg, redisAddr+":6379", img, authAddr+":8080", busyMachineBudget))

	project := fmt.Sprintf("authlimit-e2e-up-%d", os.Getpid())
	compose := func(args ...string) (string, error) {
		cmd := exec.Command(pc, append([]string{"-p", project, "-f", "docker-compose.yml", "-f", override}, args...)...)
		cmd.Dir = bins.repo
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, svc := range []string{"authlimit", "redis"} {
				logs, _ := exec.Command(pm, "logs", project+"_"+svc+"_1").CombinedOutput()
				t.Logf("--- compose %s log (last lines) ---\n%s", svc, lastLines(string(logs), 20))
			}
		}
		if out, err := compose("down", "-t", "0"); err != nil {
			t.Logf("podman-compose down: %v\n%s", err, lastLines(out, 20))
		}
		_, _ = podman(t, pm, "network", "rm", "-f", project+"_default")
	})
	// authlimit depends on redis: up starts both, and neither nginx nor
	// the backend.
	if out, err := compose("up", "-d", "authlimit"); err != nil {
		t.Fatalf("podman-compose up -d authlimit: %v\n%s", err, lastLines(out, 30))
	}
	ctr := project + "_authlimit_1"

	// Ready once it decides in Redis, which it finds as redis:6379.
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, err := http.Get("http://" + authAddr + "/readyz")
		if err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			logs, _ := exec.Command(pm, "logs", ctr).CombinedOutput()
			t.Fatalf("compose's authlimit is not ready (deciding in Redis at redis:6379) after 60s: %v; without the CNI dnsname plugin (apt-get install golang-github-containernetworking-plugin-dnsname) the compose network resolves no service name\n%s", err, lastLines(string(logs), 10))
		}
		time.Sleep(100 * time.Millisecond)
	}

	cl := newClient("127.0.0.1")
	for i := 1; i <= limit+1; i++ {
		want := 200
		if i > limit {
			want = deny
		}
		if res := cl.do(t, "GET", "http://"+authAddr+"/auth", nil); res.status != want {
			t.Errorf("request %d of %d to compose's authlimit: %d %s, want %d", i, limit+1, res.status, res.body, want)
		}
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	defer rdb.Close()
	if n, err := rdb.DBSize(t.Context()).Result(); err != nil || n == 0 {
		t.Errorf("compose's Redis holds %d keys (%v): authlimit did not decide in it", n, err)
	}
	if n := scrape(t, authAddr).sum("authlimit_fail_mode_decisions_total"); n != 0 {
		t.Errorf("compose's authlimit decided %v requests with its fail mode, not in Redis", n)
	}

	if _, err := podman(t, pm, "healthcheck", "run", ctr); err != nil {
		t.Errorf("the health check of compose's authlimit: %v", err)
	}
	out, err := podman(t, pm, "inspect", ctr)
	if err != nil {
		t.Fatal(err)
	}
	var insp []struct {
		HostConfig struct{ ReadonlyRootfs bool }
	}
	if err := json.Unmarshal([]byte(out), &insp); err != nil || len(insp) != 1 {
		t.Fatalf("podman inspect %s: %v", ctr, err)
	}
	if !insp[0].HostConfig.ReadonlyRootfs {
		t.Error("compose runs authlimit with a writable root file system (read_only: true)")
	}
	c := &container{pm: pm, id: ctr}
	if uids, _ := c.processIDs(t); uids != "65532 65532 65532 65532" {
		t.Errorf("compose's authlimit runs as uid %q, want 65532", uids)
	}
}

// standInRedisImage builds, without a registry, an image that runs
// compose's redis command as redis:7-alpine does: this machine's
// redis-server and the libraries it links, and an entrypoint that, as the
// official image's does, adds --protected-mode no (compose's other
// containers reach Redis over the network, not loopback). It is removed
// when the test ends.
func standInRedisImage(t *testing.T, pm string) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	copyIn := func(src string) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(root, src)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyIn(bins.redis)
	ldd, err := exec.Command("ldd", bins.redis).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", bins.redis, err)
	}
	for _, lib := range regexp.MustCompile(`(?m)(/\S+) \(0x`).FindAllStringSubmatch(string(ldd), -1) {
		copyIn(lib[1])
	}

	src := filepath.Join(dir, "entrypoint", "main.go")
	if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "entrypoint", "go.mod"), "module entrypoint\n\ngo 1.21\n")
	writeFile(t, src, fmt.Sprintf(`package main

import (
	"fmt"
	"os"
	"syscall"
)

// Runs redis-server with the command's arguments and --protected-mode no.
func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "redis-server" {
		args = args[1:]
	}
	argv := append(append([]string{%[1]q}, args...), "--protected-mode", "no")
	err := syscall.Exec(%[1]q, argv, os.Environ())
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
`, bins.redis))
	build := exec.Command("go", "build", "-o", filepath.Join(root, "entrypoint"), ".")
	build.Dir = filepath.Dir(src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in Redis's entrypoint: %v\n%s", err, out)
	}
	writeFile(t, filepath.Join(dir, "Containerfile"), "FROM scratch\nCOPY root/ /\nENTRYPOINT [\"/entrypoint\"]\n")

	tag := fmt.Sprintf("localhost/authlimit-e2e-redis:%d-%d", os.Getpid(), time.Now().UnixNano())
	if _, err := podman(t, pm, "build", "-q", "-t", tag, "-f", filepath.Join(dir, "Containerfile"), dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = podman(t, pm, "rmi", "-f", tag) })
	return tag
}
