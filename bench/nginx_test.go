package main

// Tests that the shipped nginx config still renders.

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
		"listen 8080;", "listen 127.0.0.1:3;")
	if err != nil {
		t.Fatalf("render nginx/example.conf: %v", err)
	}
	if !strings.Contains(site, "listen 127.0.0.1:3;") {
		t.Errorf("rendered config does not listen on 127.0.0.1:3")
	}
	if _, err := render("listen 8080; listen 8080;", "listen 8080;", "x"); err == nil {
		t.Errorf("render of a twice-occurring string succeeded, want an error")
	}
}
