package main

// Tests that the shipped HAProxy config still renders.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRenderHAProxyConf keeps the harness in step with the shipped file:
// each string renderHAProxyAuth replaces must occur exactly once, and
// haproxy, when installed, accepts the result.
func TestRenderHAProxyConf(t *testing.T) {
	conf, err := os.ReadFile("../haproxy/haproxy-lua.cfg")
	if err != nil {
		t.Fatal(err)
	}
	lua, err := filepath.Abs("../haproxy/authlimit.lua")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := renderHAProxyAuth(string(conf), lua, "127.0.0.1:3", "127.0.0.1:1")
	if err != nil {
		t.Fatalf("render haproxy/haproxy-lua.cfg: %v", err)
	}
	for _, want := range []string{"bind 127.0.0.1:3\n", "server authlimit 127.0.0.1:1\n", "lua-load " + lua + "\n", "nbthread 1\n", "http-request return status 200"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("rendered config lacks %q:\n%s", want, cfg)
		}
	}
	if strings.Contains(cfg, "default_backend") {
		t.Errorf("rendered config still passes requests to the backend:\n%s", cfg)
	}
	haproxyCheck(t, cfg)
}

// TestRenderHAProxySPOEConf: the same for haproxy.cfg with SPOE.
func TestRenderHAProxySPOEConf(t *testing.T) {
	conf, err := os.ReadFile("../haproxy/haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	spoe, err := filepath.Abs("../haproxy/spoe-authlimit.conf")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := renderHAProxySPOE(string(conf), spoe, "127.0.0.1:3", "127.0.0.1:1")
	if err != nil {
		t.Fatalf("render haproxy/haproxy.cfg: %v", err)
	}
	for _, want := range []string{"bind 127.0.0.1:3\n", "server authlimit 127.0.0.1:1\n", "config " + spoe + "\n", "nbthread 1\n", "http-request return status 200"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("rendered config lacks %q:\n%s", want, cfg)
		}
	}
	if strings.Contains(cfg, "default_backend") {
		t.Errorf("rendered config still passes requests to the backend:\n%s", cfg)
	}
	if i, j := strings.Index(cfg, "send-spoe-group"), strings.Index(cfg, "http-request return status 200"); i < 0 || j < i {
		t.Errorf("the frontend answers before asking authlimit:\n%s", cfg)
	}
	haproxyCheck(t, cfg)

	// haproxy-spoe-unix-authlimit-redis: the agent on a Unix socket.
	sock := filepath.Join(t.TempDir(), "spoa.sock")
	cfg, err = renderHAProxySPOE(string(conf), spoe, "127.0.0.1:3", "unix@"+sock)
	if err != nil {
		t.Fatalf("render haproxy/haproxy.cfg for a Unix socket: %v", err)
	}
	if want := "server authlimit unix@" + sock + "\n"; !strings.Contains(cfg, want) {
		t.Errorf("rendered config lacks %q:\n%s", want, cfg)
	}
	haproxyCheck(t, cfg)
}

// haproxyCheck has haproxy, when installed, check cfg.
func haproxyCheck(t *testing.T, cfg string) {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		bin = "/usr/sbin/haproxy"
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("haproxy is not installed: the rendered config is not checked")
		}
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Errorf("haproxy -c rejects the rendered config: %v\n%s", err, out)
	}
}
