//go:build e2e

package e2e

import (
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// h2specVersion is the HTTP/2 conformance suite the gRPC port is held to.
const h2specVersion = "v2.2.1+incompatible"

// h2specReport is the part of h2spec's JUnit report the test reads.
type h2specReport struct {
	Suites []struct {
		Cases []struct {
			Package string    `xml:"package,attr"`
			Name    string    `xml:"classname,attr"`
			Failure *struct{} `xml:"failure"`
			Error   *struct{} `xml:"error"`
			Skipped *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// TestH2spec runs h2spec against the gRPC port in cleartext: every case
// passes (one skipped would be allowed, none is today).
func TestH2spec(t *testing.T) {
	grpc := freeAddr(t)
	startAuthlimit(t, "authlimit", map[string]string{"AUTHLIMIT_GRPC_LISTEN": grpc})
	checkH2spec(t, grpc)
}

// checkH2spec runs h2spec against addr with args, and fails t unless it
// ran all of its 145 cases and none failed.
func checkH2spec(t *testing.T, addr string, args ...string) {
	t.Helper()
	out, r := runH2spec(t, addr, args...)
	var cases, skipped int
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			cases++
			switch {
			case c.Skipped != nil:
				skipped++
			case c.Failure != nil || c.Error != nil:
				t.Errorf("h2spec fails %s: %s", c.Package, c.Name)
			}
		}
	}
	if cases != 145 {
		t.Errorf("h2spec ran %d cases, want 145", cases)
	}
	t.Logf("h2spec %s %v: %d cases, %d skipped", h2specVersion, args, cases, skipped)
	if t.Failed() {
		t.Logf("h2spec's output:\n%s", out)
	}
}

// runH2spec runs h2spec against addr with args (-t: over TLS), and
// returns its output and report.
func runH2spec(t *testing.T, addr string, args ...string) ([]byte, h2specReport) {
	t.Helper()
	bin, err := h2spec()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(addr, ":")
	report := filepath.Join(t.TempDir(), "h2spec.xml")
	out, err := exec.Command(bin, append([]string{"-h", host, "-p", port, "-j", report}, args...)...).CombinedOutput()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("h2spec: %v\n%s", err, out)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("h2spec wrote no report: %v\n%s", err, out)
	}
	var r h2specReport
	if err := xml.Unmarshal(b, &r); err != nil {
		t.Fatalf("h2spec's report: %v", err)
	}
	return out, r
}

// h2spec finds h2spec: AUTHLIMIT_E2E_H2SPEC, ~/go/bin/h2spec, or one
// built once into the user's cache with go install.
func h2spec() (string, error) {
	if p := os.Getenv("AUTHLIMIT_E2E_H2SPEC"); p != "" {
		return p, nil
	}
	if home, err := os.UserHomeDir(); err == nil {
		if p := filepath.Join(home, "go", "bin", "h2spec"); isFile(p) {
			return p, nil
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "authlimit", "h2spec-"+h2specVersion)
	bin := filepath.Join(dir, "h2spec")
	if isFile(bin) {
		return bin, nil
	}
	unlock, err := lockBuild(bin)
	if err != nil {
		return "", err
	}
	defer unlock()
	if isFile(bin) {
		return bin, nil // built by another run while this one waited
	}
	fmt.Fprintf(os.Stderr, "e2e: building h2spec %s into %s (once)\n", h2specVersion, bin)
	gi := exec.Command("go", "install", "github.com/summerwind/h2spec/cmd/h2spec@"+h2specVersion)
	gi.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
	if b, err := gi.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build h2spec %s: %v\n%s", h2specVersion, err, b)
	}
	return bin, nil
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
