package main

// This file starts authlimit the way users run it (environment variables
// only) and reads its health from /metrics after a run.

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// startAuthlimit starts the binary under test on a free loopback port with
// rules, trusting only 127.0.0.1 (the harness and nginx) to forward client
// addresses, and waits for /readyz. extra adds AUTHLIMIT_* variables.
func startAuthlimit(ctx context.Context, e *runEnv, rules string, extra ...string) (*proc, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	env := []string{
		"AUTHLIMIT_LISTEN=" + addr,
		"AUTHLIMIT_RULES=" + rules,
		"AUTHLIMIT_TRUSTED_PROXIES=127.0.0.1/32",
		"AUTHLIMIT_LOG_LEVEL=warn",
	}
	if e.redis != nil {
		env = append(env, "AUTHLIMIT_REDIS_URL="+e.redis.url())
	}
	p, err := startProc(e.dir, "authlimit", e.o.authlimit, nil, childEnv(append(env, extra...)...))
	if err != nil {
		return nil, "", err
	}
	if err := waitReady(ctx, "authlimit /readyz", readyTimeout, wantStatus("http://"+addr+"/readyz", 200), p); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, addr, nil
}

// authlimitHealth is what authlimit's /metrics says went wrong: decisions
// the store failed (any kind) and decisions made by the fail mode (any
// mode). With a healthy Redis both are 0.
type authlimitHealth struct {
	storeErrors float64
	failMode    float64
}

// scrapeHealth reads the two counters from a /metrics URL; absent series
// count as 0 (a counter vector shows no series until its first increment).
func scrapeHealth(url string) (authlimitHealth, error) {
	status, body, err := httpGet(url)
	if err != nil {
		return authlimitHealth{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	if status != 200 {
		return authlimitHealth{}, fmt.Errorf("scrape %s: status %d", url, status)
	}
	var h authlimitHealth
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var into *float64
		switch {
		case strings.HasPrefix(line, "authlimit_store_errors_total"):
			into = &h.storeErrors
		case strings.HasPrefix(line, "authlimit_fail_mode_decisions_total"):
			into = &h.failMode
		default:
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return authlimitHealth{}, fmt.Errorf("scrape %s: %q: %w", url, line, err)
		}
		*into += v
	}
	return h, nil
}

// authlimitVersion is what the binary says with -version.
func authlimitVersion(bin string) string {
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		return fmt.Sprintf("(%s -version: %v)", bin, err)
	}
	return strings.TrimSpace(string(out))
}
