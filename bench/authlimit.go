package main

// This file starts authlimit the way users run it (environment variables
// only) and reads its health from /metrics after a run.

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"sort"
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
	if len(e.cluster) > 0 {
		seeds := make([]string, 0, len(e.cluster)-1)
		for _, r := range e.cluster[1:] {
			seeds = append(seeds, r.addr)
		}
		env = append(env, "AUTHLIMIT_REDIS_MODE=cluster", "AUTHLIMIT_REDIS_URL="+e.cluster[0].url(), "AUTHLIMIT_REDIS_ADDRS="+strings.Join(seeds, ","))
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
// mode), and each of their series with its labels, so that a warning says
// which kind. With a healthy Redis both are 0.
type authlimitHealth struct {
	storeErrors float64
	failMode    float64
	series      map[string]float64 // nonzero series, by name and labels
}

// bad reports counts that must be 0 with a healthy Redis.
func (h *authlimitHealth) bad() bool { return h.storeErrors > 0 || h.failMode > 0 }

// add sums another scrape into h.
func (h *authlimitHealth) add(o *authlimitHealth) {
	h.storeErrors += o.storeErrors
	h.failMode += o.failMode
	for k, v := range o.series {
		if h.series == nil {
			h.series = map[string]float64{}
		}
		h.series[k] += v
	}
}

// String names the counts, series by series.
func (h *authlimitHealth) String() string {
	s := fmt.Sprintf("authlimit_store_errors_total %g, authlimit_fail_mode_decisions_total %g", h.storeErrors, h.failMode)
	if len(h.series) == 0 {
		return s
	}
	names := make([]string, 0, len(h.series))
	for k := range h.series {
		names = append(names, k)
	}
	sort.Strings(names)
	for i, k := range names {
		names[i] = fmt.Sprintf("%s %g", k, h.series[k])
	}
	return s + " (" + strings.Join(names, ", ") + ")"
}

// scrapeHealth reads the two counters from a /metrics URL.
func scrapeHealth(url string) (authlimitHealth, error) {
	status, body, err := httpGet(url)
	if err != nil {
		return authlimitHealth{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	if status != 200 {
		return authlimitHealth{}, fmt.Errorf("scrape %s: status %d", url, status)
	}
	h, err := parseHealth(body)
	if err != nil {
		return authlimitHealth{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	return h, nil
}

// parseHealth reads the two counters from a Prometheus text exposition;
// absent series count as 0 (a counter vector shows no series until its
// first increment).
func parseHealth(body string) (authlimitHealth, error) {
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
		cut := strings.LastIndexByte(line, ' ')
		if cut < 0 {
			return authlimitHealth{}, fmt.Errorf("%q: no value", line)
		}
		v, err := strconv.ParseFloat(line[cut+1:], 64)
		if err != nil {
			return authlimitHealth{}, fmt.Errorf("%q: %w", line, err)
		}
		*into += v
		if v != 0 {
			if h.series == nil {
				h.series = map[string]float64{}
			}
			h.series[line[:cut]] += v
		}
	}
	return h, sc.Err()
}

// authlimitVersion is what the binary says with -version.
func authlimitVersion(bin string) string {
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		return fmt.Sprintf("(%s -version: %v)", bin, err)
	}
	return strings.TrimSpace(string(out))
}
