package main

// Tests of finding envoyproxy/ratelimit's binary.

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPrepareRatelimit(t *testing.T) {
	byName := func(names ...string) []system {
		var out []system
		for _, s := range catalogue() {
			for _, n := range names {
				if s.name == n {
					out = append(out, s)
				}
			}
		}
		return out
	}
	names := func(ss []system) string {
		var out []string
		for _, s := range ss {
			out = append(out, s.name)
		}
		return strings.Join(out, ",")
	}
	bin := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Run("given", func(t *testing.T) {
		o := &options{ratelimit: bin}
		systems, notes := prepareRatelimit(context.Background(), o, byName("null", "envoy-ratelimit"), nil, io.Discard)
		if names(systems) != "null,envoy-ratelimit" || len(notes) != 0 || o.ratelimit != bin {
			t.Errorf("systems %s, notes %q, binary %q; want both systems, no note, %s", names(systems), notes, o.ratelimit, bin)
		}
	})
	t.Run("missing", func(t *testing.T) {
		o := &options{ratelimit: bin + ".missing"}
		systems, notes := prepareRatelimit(context.Background(), o, byName("null", "envoy-ratelimit", "authlimit-rls"), []string{"earlier"}, io.Discard)
		if names(systems) != "null,authlimit-rls" {
			t.Errorf("systems %s, want null,authlimit-rls", names(systems))
		}
		if len(notes) != 2 || notes[0] != "earlier" || !strings.Contains(notes[1], "`envoy-ratelimit` skipped: -ratelimit:") {
			t.Errorf("notes %q, want the earlier note and one naming envoy-ratelimit and -ratelimit", notes)
		}
	})
	t.Run("not needed", func(t *testing.T) {
		o := &options{ratelimit: bin + ".missing", goBin: "/nonexistent/go"}
		systems, notes := prepareRatelimit(context.Background(), o, byName("authlimit-rls"), nil, io.Discard)
		if names(systems) != "authlimit-rls" || len(notes) != 0 {
			t.Errorf("systems %s, notes %q; want authlimit-rls untouched", names(systems), notes)
		}
	})
}
