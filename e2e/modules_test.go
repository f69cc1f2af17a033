package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// testOnlyModules are the modules only the e2e suite uses (the recipe
// tests decode Kubernetes, Gateway API, Envoy Gateway and Istio objects;
// the status page's test drives chromium): they belong in e2e/go.mod, not
// in the module authlimit's binary is built from.
var testOnlyModules = []string{
	"k8s.io/",
	"sigs.k8s.io/gateway-api",
	"istio.io/",
	"github.com/envoyproxy/gateway",
	"github.com/chromedp/",
}

// TestBinaryModuleLeavesOutTestModules: go list -m all of the main module
// (every module go mod download fetches for the binary) names none of
// testOnlyModules, and e2e/go.mod requires them.
func TestBinaryModuleLeavesOutTestModules(t *testing.T) {
	list := func(dir string) []string {
		t.Helper()
		cmd := exec.Command("go", "list", "-m", "all")
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -m all in %s: %v", dir, err)
		}
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	for _, m := range list(repoRoot(t)) {
		for _, p := range testOnlyModules {
			if strings.HasPrefix(m, p) {
				t.Errorf("the main module lists %s: it belongs in e2e/go.mod", m)
			}
		}
	}
	e2e := strings.Join(list(repoRoot(t)+"/e2e"), "\n")
	for _, p := range testOnlyModules {
		if !strings.Contains(e2e, "\n"+p) {
			t.Errorf("e2e's module lists nothing under %s: the pattern no longer finds it", p)
		}
	}
}
