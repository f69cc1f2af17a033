package main

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// proxyListens finds the addresses the files users copy make a proxy
// listen on: nginx's listen, Caddy's site addresses, Traefik's entry
// points, HAProxy's bind.
var proxyListens = map[string]*regexp.Regexp{
	"nginx/*.conf":        regexp.MustCompile(`(?m)^\s*listen\s+([^\s;]+)`),
	"caddy/Caddyfile":     regexp.MustCompile(`(?m)^([^\s#{}][^\s{]*)\s*\{`),
	"traefik/traefik.yml": regexp.MustCompile(`(?m)^\s*address:\s*"?([^"\s]+)`),
	"haproxy/*.cfg":       regexp.MustCompile(`(?m)^\s*bind\s+(\S+)`),
}

// TestProxyFilesListenApartFromAuthlimit: no proxy file users copy
// listens on authlimit's default port, so that following the docs on one
// host (make run, then the proxy with its file) starts both.
func TestProxyFilesListenApartFromAuthlimit(t *testing.T) {
	var listen string
	for _, f := range envFields() {
		if f.key == "LISTEN" {
			listen = f.def
		}
	}
	_, authlimitPort, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("AUTHLIMIT_LISTEN's default %q: %v", listen, err)
	}
	found := 0
	for glob, re := range proxyListens {
		files, err := filepath.Glob(filepath.Join("../..", glob))
		if err != nil || len(files) == 0 {
			t.Fatalf("no file matches %s: %v", glob, err)
		}
		for _, file := range files {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				addr := m[1]
				port := addr
				if _, p, err := net.SplitHostPort(addr); err == nil {
					port = p
				}
				if !regexp.MustCompile(`^[0-9]+$`).MatchString(port) {
					continue // a socket (abns@, unix:) or a host name without a port
				}
				found++
				if port == authlimitPort {
					t.Errorf("%s listens on %s, authlimit's default port (AUTHLIMIT_LISTEN=%s): on one host they collide", file, addr, listen)
				}
			}
		}
	}
	if found < 5 {
		t.Errorf("found %d listening addresses in the proxy files; want nginx's three, Caddy's, Traefik's and HAProxy's", found)
	}
}
