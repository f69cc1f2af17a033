package main

// Tests of the results tables: CPU per process and the summary's ratios.

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// fakeRun is a run of 1000 decisions in one second, with the given CPU
// times; a zero time means the system has no such processes.
func fakeRun(proxy, server time.Duration, redis bool) *runResult {
	l := &loadResult{elapsed: time.Second, allowed: 1000}
	l.hist.record(100 * time.Microsecond)
	return &runResult{load: l, proxyCPU: proxy, serverCPU: server, hasProxy: proxy > 0, hasServer: server > 0, hasRedis: redis}
}

// testReport is a report of one workload (ips, 4 connections) over the
// named systems of the catalogue, with runs for some of them.
func testReport(t *testing.T, names []string, runs map[string]*runResult) (*report, workload) {
	t.Helper()
	w := workload{name: "ips", conns: 4}
	r := &report{o: &options{workloads: []string{"ips"}, conns: []int{4}, rounds: 1}, runs: map[workload]map[string][]*runResult{w: {}}}
	for _, s := range catalogue() {
		for _, n := range names {
			if s.name == n {
				r.systems = append(r.systems, s)
			}
		}
	}
	if len(r.systems) != len(names) {
		t.Fatalf("catalogue lacks some of %q", names)
	}
	for name, run := range runs {
		r.runs[w][name] = []*runResult{run}
	}
	return r, w
}

// rowOf is the line of a Markdown table whose first cell is first.
func rowOf(t *testing.T, out, first string) []string {
	t.Helper()
	for line := range strings.Lines(out) {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if cells[0] == first {
			return cells
		}
	}
	t.Fatalf("no row %s in:\n%s", first, out)
	return nil
}

func TestWorkloadCPUColumns(t *testing.T) {
	names := []string{"naive", "nginx-lua-redis", "nginx-naive-redis"}
	runs := map[string]*runResult{
		"naive":             fakeRun(0, 5*time.Millisecond, true),
		"nginx-lua-redis":   fakeRun(2*time.Millisecond, 0, true),
		"nginx-naive-redis": fakeRun(30*time.Millisecond, 7*time.Millisecond, true),
	}
	// 1000 decisions in 400 script calls; nginx-lua-redis calls no script.
	runs["naive"].redisScripts = 400
	runs["nginx-naive-redis"].redisScripts = 1000
	r, w := testReport(t, names, runs)
	var b strings.Builder
	r.renderWorkload(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, w)
	out := b.String()
	header := rowOf(t, out, "system")
	col := func(name string) int {
		for i, c := range header {
			if c == name {
				return i
			}
		}
		t.Fatalf("no column %q in %q", name, header)
		return 0
	}
	proxy, server := col("proxy CPU µs/decision"), col("server CPU µs/decision")
	if server != proxy+1 {
		t.Errorf("server CPU is column %d, want right after proxy CPU (%d)", server, proxy)
	}
	perScript := col("decisions per Redis script call")
	tests := []struct {
		system, proxy, server, perScript string
	}{
		{"naive", "—", "5.0", "2.5"},
		{"nginx-lua-redis", "2.0", "—", "—"},
		{"nginx-naive-redis", "30.0", "7.0", "1.0"},
	}
	for _, tt := range tests {
		row := rowOf(t, out, "`"+tt.system+"`")
		if len(row) != len(header) {
			t.Fatalf("row %s has %d cells, the header %d", tt.system, len(row), len(header))
		}
		if got := row[proxy]; got != tt.proxy {
			t.Errorf("%s proxy CPU = %s, want %s", tt.system, got, tt.proxy)
		}
		if got := row[server]; got != tt.server {
			t.Errorf("%s server CPU = %s, want %s", tt.system, got, tt.server)
		}
		if got := row[perScript]; got != tt.perScript {
			t.Errorf("%s decisions per script call = %s, want %s", tt.system, got, tt.perScript)
		}
	}
}

func TestSummaryCeilingRows(t *testing.T) {
	names := []string{"naive", "naive-clock", "redis-floor", "authlimit-redis-1", "nginx-lua-redis", "openresty-auth-null", "openresty-naive-redis", "openresty-authlimit-redis"}
	runs := map[string]*runResult{
		"naive":                     fakeRun(0, 5*time.Millisecond, true),
		"naive-clock":               fakeRun(0, 5*time.Millisecond, true),
		"redis-floor":               fakeRun(0, 3*time.Millisecond, true),
		"authlimit-redis-1":         fakeRun(0, 4*time.Millisecond, true),
		"nginx-lua-redis":           fakeRun(20*time.Millisecond, 0, true),
		"openresty-auth-null":       fakeRun(25*time.Millisecond, time.Millisecond, false),
		"openresty-authlimit-redis": fakeRun(30*time.Millisecond, 9*time.Millisecond, true),
	}
	r, _ := testReport(t, names, runs)
	// Decisions/s: the runs differ in their 200s, over the same second.
	runs["naive"].load.allowed = 2000
	runs["redis-floor"].load.allowed = 3000
	runs["authlimit-redis-1"].load.allowed = 1500
	runs["naive-clock"].load.allowed = 1800
	// Redis: CPU and commandstats µs over the second, per decision.
	runs["naive"].redisCPU, runs["naive"].redisUsec = 40*time.Millisecond, 8000
	runs["naive-clock"].redisCPU, runs["naive-clock"].redisUsec = 54*time.Millisecond, 27000
	runs["authlimit-redis-1"].redisCPU, runs["authlimit-redis-1"].redisUsec = 45*time.Millisecond, 22500
	var b strings.Builder
	r.renderSummary(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) })
	out := b.String()
	tests := []struct {
		row, want string
	}{
		{"redis-floor / naive (no limiter with one Redis round trip per decision leads naive by more)", "1.50"},
		{"authlimit-redis-1 / redis-floor", "0.50"},
		{"redis-floor p50 / naive p50", "1.00"},
		{"naive-clock / naive (no limiter that answers from Redis's clock, one atomic Redis call per decision, leads naive by more)", "0.90"},
		{"authlimit-redis-1 / naive-clock", "0.83"},
		// Per decision: naive 4µs (commandstats) and 20µs (CPU);
		// naive-clock 15µs and 30µs; authlimit 15µs and 30µs.
		{"Redis µs/decision: naive-clock / naive", "3.75"},
		{"Redis µs/decision: authlimit-redis-1 / naive-clock", "1.00"},
		{"Redis CPU µs/decision: authlimit-redis-1 / naive", "1.50"},
		{"Redis CPU µs/decision: naive-clock / naive", "1.50"},
		// Per decision: 30ms/1000 over 20ms/1000.
		{"proxy CPU µs/decision: openresty-authlimit-redis / nginx-lua-redis", "1.50"},
		{"proxy CPU µs/decision: openresty-auth-null / nginx-lua-redis", "1.25"},
		// openresty-naive-redis did not run.
		{"openresty-authlimit-redis / openresty-naive-redis", "—"},
		{"openresty-naive-redis / nginx-lua-redis", "—"},
		// Neither ran.
		{"nginx-naive-redis / nginx-auth-null (auth_request with the simplest limiter)", "—"},
		{"proxy CPU µs/decision: nginx-authlimit-redis / nginx-auth-null", "—"},
	}
	for _, tt := range tests {
		if got := rowOf(t, out, tt.row)[1]; got != tt.want {
			t.Errorf("%s = %s, want %s", tt.row, got, tt.want)
		}
	}
}

func TestProxyCPUMeasure(t *testing.T) {
	tests := []struct {
		name string
		s    summary
		ok   bool
	}{
		{"a proxy", summary{proxyUs: 12, hasProxy: true}, true},
		{"a proxy that used under a tick", summary{hasProxy: true}, false},
		{"no proxy", summary{proxyUs: 12}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, ok := proxyCPUOf.value(&tt.s); ok != tt.ok {
				t.Errorf("proxyCPUOf.value known = %v, want %v", ok, tt.ok)
			}
		})
	}
}
