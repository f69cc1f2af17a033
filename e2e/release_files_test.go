package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// These tests hold the one version number (the file VERSION) to everything
// that names it: the binary's -version, the image make image tags and the
// release pushes, the chart's version, appVersion and default image, and
// every image or chart reference in the repository's files.

// publishedImage is the image the release pushes and the chart runs.
const publishedImage = "ghcr.io/authlimit/authlimit"

// TestOneVersion: authlimit -version (as make build makes it), make image's
// tag and the chart's version and appVersion are VERSION, and the chart's
// default image is the published one at that version.
func TestOneVersion(t *testing.T) {
	version := strings.TrimSpace(string(readRepo(t, "VERSION")))
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`).MatchString(version) {
		t.Fatalf("VERSION %q is not a semantic version (the chart's version must be one)", version)
	}

	var chart struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(readRepo(t, helmChart+"/Chart.yaml"), &chart); err != nil {
		t.Fatal(err)
	}
	if chart.Version != version || chart.AppVersion != version {
		t.Errorf("Chart.yaml: version %q, appVersion %q; want VERSION, %q", chart.Version, chart.AppVersion, version)
	}
	var values struct {
		Image struct {
			Repository string `yaml:"repository"`
			Tag        string `yaml:"tag"`
		} `yaml:"image"`
	}
	if err := yaml.Unmarshal(readRepo(t, helmChart+"/values.yaml"), &values); err != nil {
		t.Fatal(err)
	}
	if values.Image.Repository != publishedImage || values.Image.Tag != "" {
		t.Errorf("the chart's image is %s:%q, want %s with the tag empty (the appVersion)", values.Image.Repository, values.Image.Tag, publishedImage)
	}

	mk := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("make", append([]string{"--no-print-directory"}, args...)...)
		cmd.Dir = repoRoot(t)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if got := strings.TrimSpace(mk("-s", "version")); got != version {
		t.Errorf("make version prints %q, want %q", got, version)
	}
	if got, want := mk("-n", "image"), "-t "+publishedImage+":"+version+" "; !strings.Contains(got, want) {
		t.Errorf("make image does not tag the image (%s):\n%s", want, got)
	}
	bin := filepath.Join(t.TempDir(), "authlimit")
	mk("build", "BIN="+bin)
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(out)), "authlimit "+version; got != want {
		t.Errorf("make build's authlimit -version prints %q, want %q", got, want)
	}
}

// TestImageReferences: every file that names the published image or chart
// names VERSION, and none asks for an image the release does not publish
// (authlimit:latest).
func TestImageReferences(t *testing.T) {
	version := strings.TrimSpace(string(readRepo(t, "VERSION")))
	ls := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard")
	ls.Dir = repoRoot(t)
	out, err := ls.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	// A tag or version starting with a digit: placeholders (<VERSION>,
	// NEW) are text.
	image := regexp.MustCompile(regexp.QuoteMeta(publishedImage) + `:([0-9][^\s"'` + "`" + `)@]*)`)
	chart := regexp.MustCompile(`oci://ghcr\.io/authlimit/charts/authlimit --version ([0-9]\S*)`)
	local := regexp.MustCompile(`(^|[\s"'])authlimit:latest\b`)
	seen := 0
	for _, rel := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch filepath.Ext(rel) {
		case ".md", ".yaml", ".yml", ".txt", ".tpl", ".json":
		default:
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
		if err != nil {
			continue // deleted in the work tree
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range image.FindAllStringSubmatch(line, -1) {
				seen++
				if m[1] != version {
					t.Errorf("%s:%d: %s, want the tag %s (VERSION)", rel, i+1, m[0], version)
				}
			}
			for _, m := range chart.FindAllStringSubmatch(line, -1) {
				seen++
				if m[1] != version {
					t.Errorf("%s:%d: the chart at --version %s, want %s (VERSION)", rel, i+1, m[1], version)
				}
			}
			if local.MatchString(line) {
				t.Errorf("%s:%d: authlimit:latest, an image nothing publishes: use %s:%s", rel, i+1, publishedImage, version)
			}
		}
	}
	if seen < 3 {
		t.Errorf("only %d references to the published image or chart: the pattern no longer finds them", seen)
	}
}

// TestReleaseWorkflow: the release pushes the image the chart runs and the
// chart to the place the chart's README installs it from, and refuses a
// tag that is not v and VERSION.
func TestReleaseWorkflow(t *testing.T) {
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Env map[string]string `yaml:"env"`
	}
	src := readRepo(t, ".github/workflows/release.yml")
	if err := yaml.Unmarshal(src, &wf); err != nil {
		t.Fatal(err)
	}
	if len(wf.On.Push.Tags) != 1 || wf.On.Push.Tags[0] != "v*" {
		t.Errorf("the release runs on tags %v, want v*", wf.On.Push.Tags)
	}
	if wf.Env["IMAGE"] != publishedImage {
		t.Errorf("the release pushes the image %q, want %s, the chart's", wf.Env["IMAGE"], publishedImage)
	}
	if got := wf.Env["CHARTS"] + "/authlimit"; !strings.Contains(string(readRepo(t, helmChart+"/README.md")), got+" --version") {
		t.Errorf("the release pushes the chart to %s, which the chart's README does not install from", got)
	}
	if !strings.Contains(string(src), `if [ "$GITHUB_REF_NAME" != "v$version" ]`) || !strings.Contains(string(src), "version=$(make -s version)") {
		t.Error("the release does not refuse a tag other than v and make version's")
	}
}

// TestCIInstallsWhatTestsNeed: .ci/run, which CI runs on a fresh Debian
// machine, updates the package lists first, then installs every package a
// test names when it is missing ("apt-get install X" in a test's message)
// and the C compiler make test's race detector needs; it configures podman
// and requires the image tests, and runs make lint, make test and make e2e.
func TestCIInstallsWhatTestsNeed(t *testing.T) {
	src := string(readRepo(t, ".ci/run"))
	// The install command, joined across its continuation lines.
	joined := strings.ReplaceAll(src, "\\\n", " ")
	install := regexp.MustCompile(`(?m)^apt-get install ([^\n]*)$`).FindStringSubmatchIndex(joined)
	if install == nil {
		t.Fatal(".ci/run runs no apt-get install")
	}
	if update := strings.Index(joined, "apt-get update"); update < 0 || update > install[0] {
		t.Error(".ci/run does not run apt-get update before apt-get install")
	}
	installed := map[string]bool{}
	for _, f := range strings.Fields(joined[install[2]:install[3]]) {
		installed[f] = true
	}

	ls := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "*.go")
	ls.Dir = repoRoot(t)
	out, err := ls.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	asked := map[string]string{"gcc": "make test's -race (cgo)", "libc6-dev": "make test's -race (cgo)"}
	hint := regexp.MustCompile(`apt-get install ([a-z0-9][a-z0-9 .+-]*)`)
	for _, rel := range strings.Fields(string(out)) {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
		if err != nil {
			continue // deleted in the work tree
		}
		for _, m := range hint.FindAllStringSubmatch(string(b), -1) {
			for _, pkg := range strings.Fields(m[1]) {
				asked[pkg] = rel
			}
		}
	}
	if len(asked) < 8 {
		t.Errorf("only %d packages named by the tests: the pattern no longer finds them", len(asked))
	}
	for pkg, by := range asked {
		if !installed[pkg] {
			t.Errorf(".ci/run does not install %s, which %s needs", pkg, by)
		}
	}

	for _, want := range []string{
		`default_ulimits = []`,
		`runtime = "runc"`,
		"\nAUTHLIMIT_E2E_PODMAN=required make e2e\n",
		"\nmake lint\n", "\nmake test\n",
	} {
		if !strings.Contains(src, want) {
			t.Errorf(".ci/run lacks %q", strings.TrimSpace(want))
		}
	}
}
