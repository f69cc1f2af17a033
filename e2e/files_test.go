package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"
)

// These tests check the deployment files that cannot run here (no Docker
// engine, no Kubernetes): what authlimit would be given is a configuration
// it accepts, and the pieces refer to each other correctly. The proxies'
// files themselves run for real in the e2e suite (make e2e).

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

func readRepo(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// check runs `authlimit -check` with env and returns its output.
func check(t *testing.T, env map[string]string) string {
	t.Helper()
	cmd := exec.Command(buildAuthlimit(t), "-check")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("authlimit -check rejects %v:\n%s", env, out)
	}
	return string(out)
}

// builtAuthlimit is authlimit as buildAuthlimit built it, once per test
// run, in a directory TestMain removes (removeBuiltAuthlimit).
var builtAuthlimit struct {
	once      sync.Once
	dir, path string
	err       error
}

// buildAuthlimit builds authlimit, once per test run, and returns the
// binary's path.
func buildAuthlimit(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	builtAuthlimit.once.Do(func() {
		dir, err := os.MkdirTemp("", "authlimit-files-")
		if err != nil {
			builtAuthlimit.err = err
			return
		}
		builtAuthlimit.dir, builtAuthlimit.path = dir, filepath.Join(dir, "authlimit")
		build := exec.Command("go", "build", "-o", builtAuthlimit.path, "./cmd/authlimit")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			builtAuthlimit.err = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if builtAuthlimit.err != nil {
		t.Fatal(builtAuthlimit.err)
	}
	return builtAuthlimit.path
}

// removeBuiltAuthlimit removes what buildAuthlimit built, if anything.
func removeBuiltAuthlimit() {
	builtAuthlimit.once.Do(func() {}) // waits for a build under way
	if builtAuthlimit.dir != "" {
		_ = os.RemoveAll(builtAuthlimit.dir)
	}
}

func TestComposeFile(t *testing.T) {
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Environment map[string]string `yaml:"environment"`
			Ports       []string          `yaml:"ports"`
			Volumes     []string          `yaml:"volumes"`
			DependsOn   []string          `yaml:"depends_on"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(readRepo(t, "docker-compose.yml"), &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, name := range []string{"redis", "authlimit", "backend", "nginx"} {
		if _, ok := compose.Services[name]; !ok {
			t.Fatalf("docker-compose.yml has no %s service", name)
		}
	}
	a := compose.Services["authlimit"]
	if want := "ghcr.io/authlimit/authlimit:" + strings.TrimSpace(string(readRepo(t, "VERSION"))); a.Image != want {
		t.Errorf("authlimit's image is %q, want %q, the release's and make image's", a.Image, want)
	}
	out := check(t, a.Environment)
	if !strings.Contains(out, "deny status      403") || !strings.Contains(out, "redis standalone redis://redis:6379") {
		t.Errorf("compose's authlimit configuration is not nginx's (403, Redis):\n%s", out)
	}
	n := compose.Services["nginx"]
	if len(n.Volumes) != 1 || !strings.HasPrefix(n.Volumes[0], "./nginx/example.conf:/etc/nginx/conf.d/") {
		t.Errorf("nginx does not use nginx/example.conf: %v", n.Volumes)
	}
	if len(n.Ports) != 1 || n.Ports[0] != "8000:8000" {
		t.Errorf("nginx ports %v, want 8000:8000 (docs/container.md: curl localhost:8000/)", n.Ports)
	}
	if doc := string(readRepo(t, "docs/container.md")); !strings.Contains(doc, "localhost:8000/") {
		t.Error("docs/container.md does not curl localhost:8000/, where compose's nginx answers")
	}
	// nginx/example.conf's upstreams are the compose service names.
	conf := string(readRepo(t, "nginx/example.conf"))
	for _, want := range []string{"server authlimit:8080;", "server backend:80;", "listen 8000;"} {
		if !strings.Contains(conf, want) {
			t.Errorf("nginx/example.conf lacks %q, which docker-compose.yml relies on", want)
		}
	}
}

// TestDockerfileCopiesMakeBuild: the image is FROM scratch and builds
// nothing: it copies the binaries make build made for each platform and
// the root file system make image-context prepared, runs as 65532 with a
// health check the binary answers, and carries the OCI labels.
func TestDockerfileCopiesMakeBuild(t *testing.T) {
	var instructions []string
	for _, line := range strings.Split(strings.ReplaceAll(string(readRepo(t, "Dockerfile")), "\\\n", " "), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			instructions = append(instructions, strings.Join(strings.Fields(line), " "))
		}
	}
	var froms, copies []string
	labels := map[string]bool{}
	for _, in := range instructions {
		op, args, _ := strings.Cut(in, " ")
		switch strings.ToUpper(op) {
		case "FROM":
			froms = append(froms, args)
		case "COPY":
			copies = append(copies, args)
		case "RUN", "ADD":
			t.Errorf("the Dockerfile runs or fetches something (%s): the image only copies make build's output", in)
		case "LABEL":
			for _, f := range strings.Fields(args) {
				if k, _, ok := strings.Cut(f, "="); ok {
					labels[k] = true
				}
			}
		}
	}
	if len(froms) != 1 || froms[0] != "scratch" {
		t.Errorf("FROM %v, want scratch alone", froms)
	}
	if !slices.Contains(copies, "bin/image/${TARGETPLATFORM}/authlimit /authlimit") || !slices.Contains(copies, "bin/image/rootfs/ /") || len(copies) != 2 {
		t.Errorf("COPY %q, want make image-context's binary for the target platform and root file system", copies)
	}
	for _, want := range []string{"USER 65532:65532", `HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/authlimit", "-healthcheck"]`, `ENTRYPOINT ["/authlimit"]`} {
		if !slices.Contains(instructions, want) {
			t.Errorf("the Dockerfile lacks %s", want)
		}
	}
	for _, k := range []string{"org.opencontainers.image.source", "org.opencontainers.image.version", "org.opencontainers.image.revision"} {
		if !labels[k] {
			t.Errorf("the Dockerfile sets no label %s", k)
		}
	}
	if got := string(readRepo(t, ".dockerignore")); !strings.Contains(got, "\n*\n!bin/image\n") {
		t.Errorf(".dockerignore %q does not leave everything but bin/image out of the context", got)
	}
	mk := string(readRepo(t, "Makefile"))
	for _, want := range []string{"CGO_ENABLED=0 GOOS=$(GOOS) GOARCH=$(GOARCH) $(GO) build", "-s -w", "$(MAKE) --no-print-directory build GOOS=$${p%/*} GOARCH=$${p#*/} BIN=bin/image/$$p/authlimit"} {
		if !strings.Contains(mk, want) {
			t.Errorf("the Makefile lacks %q: the image ships make build's static, stripped binary for each platform", want)
		}
	}
}

func TestKubernetesDeploymentConfig(t *testing.T) {
	c := authlimitDeployment(t)
	out := check(t, c.env)
	if !strings.Contains(out, "deny status      403") {
		t.Errorf("the ingress-nginx deployment must deny with 403:\n%s", out)
	}
	if c.liveness != "/healthz" || c.readiness != "/readyz" {
		t.Errorf("probes %q and %q, want /healthz and /readyz", c.liveness, c.readiness)
	}
}

// deployedContainer is the authlimit container of the shipped Deployment.
type deployedContainer struct {
	env                 map[string]string
	liveness, readiness string // the probes' paths
}

// authlimitDeployment reads the authlimit container from
// deploy/kubernetes/authlimit.yaml.
func authlimitDeployment(t *testing.T) deployedContainer {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(string(readRepo(t, "deploy/kubernetes/authlimit.yaml"))))
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name string `yaml:"name"`
							Env  []struct {
								Name  string `yaml:"name"`
								Value string `yaml:"value"`
							} `yaml:"env"`
							LivenessProbe struct {
								HTTPGet struct{ Path string } `yaml:"httpGet"`
							} `yaml:"livenessProbe"`
							ReadinessProbe struct {
								HTTPGet struct{ Path string } `yaml:"httpGet"`
							} `yaml:"readinessProbe"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("deploy/kubernetes/authlimit.yaml: no authlimit Deployment (%v)", err)
		}
		for _, c := range doc.Spec.Template.Spec.Containers {
			if doc.Kind != "Deployment" || c.Name != "authlimit" {
				continue
			}
			d := deployedContainer{env: map[string]string{}, liveness: c.LivenessProbe.HTTPGet.Path, readiness: c.ReadinessProbe.HTTPGet.Path}
			for _, e := range c.Env {
				d.env[e.Name] = e.Value
			}
			return d
		}
	}
}
