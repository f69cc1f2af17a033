package main

// Tests that the shipped nginx configs still render.

import (
	"os"
	"strings"
	"testing"
)

// TestRenderExampleConf keeps the harness in step with the shipped file:
// each address it replaces must occur exactly once.
func TestRenderExampleConf(t *testing.T) {
	b, err := os.ReadFile("../nginx/example.conf")
	if err != nil {
		t.Fatal(err)
	}
	site, err := render(string(b),
		"server authlimit:8080;", "server 127.0.0.1:1;",
		"server backend:80;", "server 127.0.0.1:2;",
		"listen 8000;", "listen 127.0.0.1:3;")
	if err != nil {
		t.Fatalf("render nginx/example.conf: %v", err)
	}
	if !strings.Contains(site, "listen 127.0.0.1:3;") {
		t.Errorf("rendered config does not listen on 127.0.0.1:3")
	}
	if _, err := render("listen 8000; listen 8000;", "listen 8000;", "x"); err == nil {
		t.Errorf("render of a twice-occurring string succeeded, want an error")
	}
}

// TestRenderOpenRestyConf: the same for nginx/openresty.conf.
func TestRenderOpenRestyConf(t *testing.T) {
	b, err := os.ReadFile("../nginx/openresty.conf")
	if err != nil {
		t.Fatal(err)
	}
	site, err := renderOpenResty(string(b), "/run", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`lua_package_path "/run/?.lua;;";`, `address = "127.0.0.1:1",`, "listen 127.0.0.1:3;", "root /run/html;"} {
		if !strings.Contains(site, want) {
			t.Errorf("rendered config lacks %q", want)
		}
	}
}
