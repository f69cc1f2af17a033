package main

// This file finds envoyproxy/ratelimit's binary, building it once from the
// Go module proxy into the user cache directory.

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
)

// ratelimitModule and ratelimitVersion are the envoyproxy/ratelimit
// measured: a pseudo-version of its main branch (2026-01-22), whose go.mod
// needs no replace directive, so go install builds it.
const (
	ratelimitModule  = "github.com/envoyproxy/ratelimit"
	ratelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"
)

// prepareRatelimit sets o.ratelimit to envoyproxy/ratelimit's binary when a
// chosen system needs it: -ratelimit, or the one cached under the user
// cache directory, or one built now and cached there. A system that cannot
// get it is dropped with a note.
func prepareRatelimit(ctx context.Context, o *options, systems []system, notes []string, stderr io.Writer) ([]system, []string) {
	if !slices.ContainsFunc(systems, func(s system) bool { return s.ratelimit }) {
		return systems, notes
	}
	bin, err := ratelimitBinary(ctx, o, stderr)
	if err == nil {
		o.ratelimit = bin
		return systems, notes
	}
	kept := systems[:0:0]
	for _, s := range systems {
		if s.ratelimit {
			notes = append(notes, fmt.Sprintf("`%s` skipped: %v", s.name, err))
			continue
		}
		kept = append(kept, s)
	}
	return kept, notes
}

// ratelimitBinary is -ratelimit if given, else the cached build, building
// it first if there is none.
func ratelimitBinary(ctx context.Context, o *options, stderr io.Writer) (string, error) {
	if o.ratelimit != "" {
		if _, err := os.Stat(o.ratelimit); err != nil {
			return "", fmt.Errorf("-ratelimit: %w", err)
		}
		return o.ratelimit, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no user cache directory for envoyproxy/ratelimit (pass -ratelimit): %w", err)
	}
	bin := filepath.Join(cache, "authlimit", "ratelimit-"+ratelimitVersion)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	fmt.Fprintf(stderr, "bench: building envoyproxy/ratelimit %s into %s (a few minutes, once)\n", ratelimitVersion, bin)
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("build envoyproxy/ratelimit: %w", err)
	}
	gobin, err := os.MkdirTemp(filepath.Dir(bin), "ratelimit-build-")
	if err != nil {
		return "", fmt.Errorf("build envoyproxy/ratelimit: %w", err)
	}
	defer os.RemoveAll(gobin)
	cmd := exec.CommandContext(ctx, o.goBin, "install", ratelimitModule+"/src/service_cmd@"+ratelimitVersion)
	cmd.Dir = gobin // outside this module: go install pkg@version ignores it anyway
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build envoyproxy/ratelimit %s with %s install: %v\n%s", ratelimitVersion, o.goBin, err, lastBytes(out, 2048))
	}
	if err := os.Rename(filepath.Join(gobin, "service_cmd"), bin); err != nil {
		return "", fmt.Errorf("build envoyproxy/ratelimit: %w", err)
	}
	return bin, nil
}

// lastBytes is the end of out, at most n bytes.
func lastBytes(out []byte, n int) string {
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return string(out)
}
