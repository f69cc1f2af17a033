package main

// This file turns the runs into bench/RESULTS.md: medians over rounds,
// ratios to the null handler, memory per key, micro-benchmarks.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// report is everything the results file says.
type report struct {
	o       *options
	facts   *facts
	systems []system
	notes   []string
	runs    map[workload]map[string][]*runResult
	memory  []memoryResult
	micro   *microResult
}

// summary is one system under one workload over all rounds: medians, and
// sums where one bad round must not hide.
type summary struct {
	runs                        int
	rate                        float64 // decisions per second
	p50, p99, p999              time.Duration
	errors                      uint64 // summed over rounds
	errorDetail                 []string
	allowed, denied             float64
	proxyUs                     float64 // per decision
	serverUs, redisCPUUs, cmdUs float64 // per decision
	perScript                   float64 // decisions per script call; 0: no script ran
	hasProxy, hasServer         bool
	hasRedis                    bool
	authlimit                   bool
	health                      authlimitHealth // summed over rounds
	reconnects                  uint64
}

// summarize reduces one system's runs under one workload.
func summarize(runs []*runResult) *summary {
	s := &summary{runs: len(runs)}
	var rate, p50, p99, p999, allowed, denied, proxy, server, rcpu, cmd, batch []float64
	for _, r := range runs {
		l := r.load
		d := float64(l.decisions())
		rate = append(rate, d/l.elapsed.Seconds())
		p50 = append(p50, float64(l.hist.quantile(0.5)))
		p99 = append(p99, float64(l.hist.quantile(0.99)))
		p999 = append(p999, float64(l.hist.quantile(0.999)))
		allowed = append(allowed, float64(l.allowed))
		denied = append(denied, float64(l.denied))
		proxy = append(proxy, perDecision(float64(r.proxyCPU.Microseconds()), d))
		server = append(server, perDecision(float64(r.serverCPU.Microseconds()), d))
		rcpu = append(rcpu, perDecision(float64(r.redisCPU.Microseconds()), d))
		cmd = append(cmd, perDecision(float64(r.redisUsec), d))
		if r.redisScripts > 0 {
			batch = append(batch, d/float64(r.redisScripts))
		}
		s.errors += l.errors()
		if detail := l.errorDetail(); detail != "" {
			s.errorDetail = append(s.errorDetail, detail)
		}
		s.reconnects += l.reconnects
		s.hasProxy, s.hasServer, s.hasRedis = r.hasProxy, r.hasServer, r.hasRedis
		if r.health != nil {
			s.authlimit = true
			s.health.add(r.health)
		}
	}
	s.rate, s.allowed, s.denied = median(rate), median(allowed), median(denied)
	s.p50, s.p99, s.p999 = time.Duration(median(p50)), time.Duration(median(p99)), time.Duration(median(p999))
	s.proxyUs, s.serverUs, s.redisCPUUs, s.cmdUs = median(proxy), median(server), median(rcpu), median(cmd)
	if len(batch) > 0 {
		s.perScript = median(batch)
	}
	return s
}

// flagged reports a summary whose figures are suspect: errors, or an
// authlimit that decided without its store.
func (s *summary) flagged() bool {
	return s.errors > 0 || s.health.bad()
}

func perDecision(v, decisions float64) float64 {
	if decisions == 0 {
		return 0
	}
	return v / decisions
}

// median of a non-empty slice; the mean of the middle two for even sizes.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// workloads lists the workloads in the order of the tables.
func (r *report) workloads() []workload {
	var out []workload
	for _, name := range r.o.workloads {
		for _, c := range r.o.conns {
			out = append(out, workload{name: name, conns: c})
		}
	}
	return out
}

// summaryOf is the summary of a system under a workload, nil if it did not
// run.
func (r *report) summaryOf(w workload, system string) *summary {
	runs := r.runs[w][system]
	if len(runs) == 0 {
		return nil
	}
	return summarize(runs)
}

// write renders the report into a temporary file next to path and renames
// it over path, so path is never a partial file.
func (r *report) write(path string) error {
	var b bytes.Buffer
	r.render(&b)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	f, err := os.CreateTemp(dir, ".results-*.md")
	if err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	_, err = f.Write(b.Bytes())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

// render writes the whole Markdown document.
func (r *report) render(b *bytes.Buffer) {
	f := r.facts
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("# authlimit benchmark results\n\n")
	p("Written by `make bench` (the program in [`bench/`](.)) at the end of a complete run. ")
	p("Each figure is the median of %d round(s); in every round each system ran once per workload, ", r.o.rounds)
	p("the systems alternated (and their order rotated) so that noise on the shared machine spreads over all of them. ")
	p("Every system was started fresh for each run, with a fresh redis-server (or Redis Cluster) where it uses one.\n\n")

	p("## Run\n\n| | |\n|---|---|\n")
	p("| Date | %s – %s (UTC) |\n", f.start.UTC().Format("2006-01-02 15:04:05"), f.end.UTC().Format("15:04:05"))
	p("| Command | `%s` |\n", strings.Join(quoteArgs(r.o.args), " "))
	p("| go version | %s |\n", f.goVersion)
	p("| CPU | %s |\n", f.cpu)
	p("| Kernel | %s |\n", f.kernel)
	p("| authlimit | `%s`: %s |\n", r.o.authlimit, f.authlimit)
	p("| redis-server | %s |\n", f.redis)
	p("| nginx | %s |\n", f.nginx)
	p("| haproxy | %s |\n", f.haproxy)
	p("| Settings | rounds %d; warm-up %v; measured window %v; connections %s; workloads %s; %d client IPs in `ips` |\n",
		r.o.rounds, r.o.warmup, r.o.duration, joinInts(r.o.conns), strings.Join(r.o.workloads, ", "), r.o.ips)
	p("\n")

	r.renderSystems(p)
	r.renderReading(p)
	for _, w := range r.workloads() {
		r.renderWorkload(p, w)
	}
	r.renderSummary(p)
	r.renderMemory(p)
	if r.micro != nil {
		p("## Micro-benchmarks\n\n`%s`\n\n```text\n%s\n```\n", r.micro.command, strings.TrimRight(r.micro.output, "\n"))
	}
}

func (r *report) renderSystems(p func(string, ...any)) {
	p("## Systems\n\n")
	for _, s := range r.systems {
		p("- `%s`: %s.\n", s.name, s.about)
	}
	for _, n := range r.notes {
		p("- %s.\n", n)
	}
	p("\nWorkloads: `ips` cycles through %d client IPs from 198.18.0.0/15 (each recurs; all admitted), ", r.o.ips)
	p("`hot` is one client (%s) far over its limit (nearly all denied). Every request carries the client in `X-Forwarded-For`; ", hotIP())
	p("authlimit trusts only 127.0.0.1 (`AUTHLIMIT_TRUSTED_PROXIES=127.0.0.1/32`), nginx reads it with the realip module, HAProxy with `http-request set-src`.\n\n")
	p("| limit | `ips` | `hot` |\n|---|---|---|\n")
	p("| authlimit, 1 rule | `%s` | `%s` |\n", rulesFor("ips", false, ""), rulesFor("hot", false, ""))
	p("| authlimit, 3 rules | `%s` | `%s` |\n", rulesFor("ips", true, ""), rulesFor("hot", true, ""))
	p("| authlimit, 1 rule fixed_window | `%s` | `%s` |\n", rulesFor("ips", false, "fixed_window"), rulesFor("hot", false, "fixed_window"))
	ips, hot := limitFor("ips"), limitFor("hot")
	p("| naive (alone and behind nginx-naive-redis, openresty-naive-redis), nginx-lua-redis | %d per %dms | %d per %dms |\n", ips.n, ips.ms, hot.n, hot.ms)
	p("| nginx-limit_req | rate=100r/s burst=200 nodelay | the same |\n")
	p("| envoy-ratelimit, authlimit-rls (one YAML file: domain `%s`, descriptor `%s` = the client) | %s | %s |\n\n", rlsDomain, rlsKey, rlsLimitText("ips"), rlsLimitText("hot"))
}

func (r *report) renderReading(p func(string, ...any)) {
	p("## How to read\n\n")
	p("- **decisions/s**: answers that were 200 or the denial (429) per second of the measured window; through nginx or HAProxy, requests per second.\n")
	p("- **gRPC systems** (grpc-null, envoy-ratelimit, authlimit-rls, authlimit-check) are driven by a gRPC load generator in the harness, closed loop like the HTTP one: N connections are N HTTP/2 connections (as N gRPC client connections would be) with one unary call in flight each, calls prebuilt as HTTP/2 frames and answers read without a general gRPC client, each reply's verdict read from its bytes without decoding the whole message (as the HTTP load reads a status line and its framing), so that the client's share of the cores stays near the HTTP load's. A decision is `OK` or `OVER_LIMIT` (`ShouldRateLimit`), an `ok_response` or a 429 `denied_response` (`Check`); failed calls and other answers are errors. The client is the descriptor's `%s` value (`ShouldRateLimit`) or the source address (`Check`), as Envoy sends them. Latency is from the call to its reply.\n", rlsKey)
	p("- **× null**: decisions/s divided by `null`'s in the same table. The load generator runs in the harness on the same cores as the systems, taking its share from each alike: compare systems by these ratios, not by absolute numbers.\n")
	p("- **p50, p99, p99.9**: latency seen by the client, from writing the request to reading the last byte of the answer (log-linear histogram, under 2%% bucket error).\n")
	p("- **errors**: transport errors and statuses other than 200 and the denial, summed over all rounds. **200s, denials**: per run (median).\n")
	p("- **⚠**: the system had errors, or authlimit's `/metrics` counted store errors (`authlimit_store_errors_total`) or fail-mode decisions (`authlimit_fail_mode_decisions_total`) during a run, warm-up included: then some decisions were made without Redis, and its figures do not measure Redis decisions alone. Both counters must be 0 with a healthy Redis.\n")
	p("- **proxy CPU µs/decision**: user + system CPU of the system's proxy processes (nginx's master and worker, or HAProxy) from `/proc/<pid>/stat` over the window, per decision; — for a system without a proxy. `/proc` counts 10ms ticks.\n")
	p("- **server CPU µs/decision**: the same for the server that decides apart from the proxy, in a process of its own: authlimit, envoyproxy/ratelimit, or a reference server of the harness (null, naive, redis-floor, gRPC null, SPOA null), which runs as `bench serve-*`, never inside the harness process that drives the load. The rule: nginx and HAProxy count as proxy, every other process as server. A system that decides inside the proxy (nginx, nginx-limit_req, nginx-lua-redis, haproxy) has no server, so — there; a system behind a proxy (nginx-*-null, nginx-*-redis, openresty-*, haproxy-authlimit-redis, haproxy-spoe-*) has both, and their sum is the system's CPU.\n")
	p("- **Redis CPU µs/decision (/proc)**: the same for redis-server (summed over a cluster's nodes; so is commandstats).\n")
	p("- **Redis µs/decision (commandstats)**: the growth of `usec` in `INFO commandstats`, per decision. Redis also counts the commands a script calls, inside the script's own time, so when scripts ran only the script commands (EVAL*, FCALL*) are summed.\n\n")
}

func (r *report) renderWorkload(p func(string, ...any), w workload) {
	what := "distinct client IPs"
	if w.name == "hot" {
		what = "one client far over its limit"
	}
	p("## `%s` workload (%s), %d connections\n\n", w.name, what, w.conns)
	p("| system | decisions/s | × null | p50 | p99 | p99.9 | errors | 200s | denials | proxy CPU µs/decision | server CPU µs/decision | Redis CPU µs/decision (/proc) | Redis µs/decision (commandstats) | decisions per Redis script call |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	null := r.summaryOf(w, "null")
	var warnings []string
	for _, sys := range r.systems {
		s := r.summaryOf(w, sys.name)
		if s == nil {
			continue
		}
		name := "`" + sys.name + "`"
		if s.flagged() {
			name += " ⚠"
		}
		if s.authlimit && s.health.bad() {
			warnings = append(warnings, fmt.Sprintf("⚠ `%s`: %s over all rounds; both must be 0 with a healthy Redis.", sys.name, &s.health))
		}
		if s.errors > 0 {
			warnings = append(warnings, fmt.Sprintf("`%s` errors: %s.", sys.name, strings.Join(s.errorDetail, "; ")))
		}
		if s.reconnects > 0 {
			warnings = append(warnings, fmt.Sprintf("`%s` closed %d client connections (Connection: close) over all rounds; the client reconnected.", sys.name, s.reconnects))
		}
		ratio := "—"
		if null != nil && null.rate > 0 {
			ratio = fmt.Sprintf("%.2f", s.rate/null.rate)
		}
		proxyCPU, serverCPU, redisCPU, cmd, batch := "—", "—", "—", "—", "—"
		if s.hasProxy {
			proxyCPU = fmt.Sprintf("%.1f", s.proxyUs)
		}
		if s.hasServer {
			serverCPU = fmt.Sprintf("%.1f", s.serverUs)
		}
		if s.hasRedis {
			redisCPU, cmd = fmt.Sprintf("%.1f", s.redisCPUUs), fmt.Sprintf("%.1f", s.cmdUs)
		}
		if s.perScript > 0 {
			batch = fmt.Sprintf("%.1f", s.perScript)
		}
		p("| %s | %.0f | %s | %s | %s | %s | %d | %.0f | %.0f | %s | %s | %s | %s | %s |\n",
			name, s.rate, ratio, fmtDuration(s.p50), fmtDuration(s.p99), fmtDuration(s.p999),
			s.errors, s.allowed, s.denied, proxyCPU, serverCPU, redisCPU, cmd, batch)
	}
	p("\n")
	for _, w := range warnings {
		p("%s\n\n", w)
	}
}

// ratioRow is one line of the summary: a figure of one system over
// another's, in the workloads where it applies.
type ratioRow struct {
	label    string
	num, den string
	of       measure               // what is compared; decisions/s by default
	applies  func(w workload) bool // nil: every workload
}

// measure is the figure a ratio row compares.
type measure int

const (
	rateOf     measure = iota // decisions/s
	p50Of                     // p50 latency
	p99Of                     // p99 latency
	redisCmdOf                // Redis µs/decision by commandstats
	redisCPUOf                // Redis's CPU µs/decision (its processes, from /proc)
	proxyCPUOf                // the proxy's CPU µs/decision
)

// value is the measure of s, and whether it is known.
func (m measure) value(s *summary) (float64, bool) {
	switch m {
	case p50Of:
		return float64(s.p50), s.p50 > 0
	case p99Of:
		return float64(s.p99), s.p99 > 0
	case redisCmdOf:
		return s.cmdUs, s.hasRedis && s.cmdUs > 0
	case redisCPUOf:
		return s.redisCPUUs, s.hasRedis && s.redisCPUUs > 0
	case proxyCPUOf:
		return s.proxyUs, s.hasProxy && s.proxyUs > 0
	default:
		return s.rate, s.rate > 0
	}
}

func (r *report) renderSummary(p func(string, ...any)) {
	rows := []ratioRow{
		{label: "authlimit-redis-1 / null", num: "authlimit-redis-1", den: "null"},
		{label: "authlimit-redis-1 / naive", num: "authlimit-redis-1", den: "naive"},
		{label: "redis-floor / naive (no limiter with one Redis round trip per decision leads naive by more)", num: "redis-floor", den: "naive"},
		{label: "authlimit-redis-1 / redis-floor", num: "authlimit-redis-1", den: "redis-floor"},
		{label: "naive-raw / naive (no limiter with one atomic Redis call per decision leads naive by more)", num: "naive-raw", den: "naive"},
		{label: "authlimit-redis-1 / naive-raw", num: "authlimit-redis-1", den: "naive-raw"},
		{label: "naive-clock / naive (no limiter that answers from Redis's clock, one atomic Redis call per decision, leads naive by more)", num: "naive-clock", den: "naive"},
		{label: "authlimit-redis-1 / naive-clock", num: "authlimit-redis-1", den: "naive-clock"},
		{label: "authlimit-redis-3 / authlimit-redis-1", num: "authlimit-redis-3", den: "authlimit-redis-1"},
		{label: "authlimit-memory / null", num: "authlimit-memory", den: "null"},
		{label: "authlimit hot / null (authlimit-redis-1)", num: "authlimit-redis-1", den: "null", applies: func(w workload) bool { return w.name == "hot" }},
		{label: "authlimit-cluster-1 / authlimit-redis-1", num: "authlimit-cluster-1", den: "authlimit-redis-1"},
		{label: "nginx-authlimit-redis / nginx", num: "nginx-authlimit-redis", den: "nginx"},
		{label: "nginx-lua-redis / nginx", num: "nginx-lua-redis", den: "nginx"},
		{label: "openresty-authlimit-redis / nginx-lua-redis", num: "openresty-authlimit-redis", den: "nginx-lua-redis"},
		{label: "openresty-naive-redis / nginx-lua-redis", num: "openresty-naive-redis", den: "nginx-lua-redis"},
		{label: "openresty-authlimit-redis / openresty-naive-redis", num: "openresty-authlimit-redis", den: "openresty-naive-redis"},
		{label: "openresty-auth-null / nginx (the Lua module's ceiling)", num: "openresty-auth-null", den: "nginx", applies: func(w workload) bool { return w.name == "ips" }},
		{label: "nginx-auth-null / nginx (auth_request's ceiling)", num: "nginx-auth-null", den: "nginx", applies: func(w workload) bool { return w.name == "ips" }},
		{label: "nginx-naive-redis / nginx-auth-null (auth_request with the simplest limiter)", num: "nginx-naive-redis", den: "nginx-auth-null", applies: func(w workload) bool { return w.name == "ips" }},
		{label: "nginx-authlimit-redis / nginx-naive-redis", num: "nginx-authlimit-redis", den: "nginx-naive-redis"},
		{label: "proxy CPU µs/decision: openresty-authlimit-redis / nginx-lua-redis", num: "openresty-authlimit-redis", den: "nginx-lua-redis", of: proxyCPUOf},
		{label: "proxy CPU µs/decision: openresty-auth-null / nginx-lua-redis", num: "openresty-auth-null", den: "nginx-lua-redis", of: proxyCPUOf},
		{label: "proxy CPU µs/decision: nginx-authlimit-redis / nginx-auth-null", num: "nginx-authlimit-redis", den: "nginx-auth-null", of: proxyCPUOf},
		{label: "haproxy-authlimit-redis / haproxy", num: "haproxy-authlimit-redis", den: "haproxy"},
		{label: "haproxy-spoe-null / haproxy (the SPOE hop's ceiling)", num: "haproxy-spoe-null", den: "haproxy", applies: func(w workload) bool { return w.name == "ips" }},
		{label: "haproxy-spoe-authlimit-redis / haproxy-authlimit-redis (SPOE against the Lua action)", num: "haproxy-spoe-authlimit-redis", den: "haproxy-authlimit-redis"},
		{label: "haproxy-spoe-authlimit-redis / nginx-authlimit-redis", num: "haproxy-spoe-authlimit-redis", den: "nginx-authlimit-redis"},
		{label: "haproxy-spoe-unix-authlimit-redis / haproxy-authlimit-redis (SPOE on a Unix socket against the Lua action)", num: "haproxy-spoe-unix-authlimit-redis", den: "haproxy-authlimit-redis"},
		{label: "haproxy-spoe-unix-authlimit-redis / haproxy-spoe-authlimit-redis (the agent on a Unix socket against loopback TCP)", num: "haproxy-spoe-unix-authlimit-redis", den: "haproxy-spoe-authlimit-redis"},
		{label: "proxy CPU µs/decision: haproxy-spoe-authlimit-redis / haproxy-authlimit-redis", num: "haproxy-spoe-authlimit-redis", den: "haproxy-authlimit-redis", of: proxyCPUOf},
		{label: "proxy CPU µs/decision: haproxy-spoe-authlimit-redis / haproxy-spoe-null", num: "haproxy-spoe-authlimit-redis", den: "haproxy-spoe-null", of: proxyCPUOf},
		{label: "proxy CPU µs/decision: haproxy-spoe-unix-authlimit-redis / haproxy-spoe-authlimit-redis", num: "haproxy-spoe-unix-authlimit-redis", den: "haproxy-spoe-authlimit-redis", of: proxyCPUOf},
		{label: "authlimit-redis-1 p99 / null p99 (50 connections)", num: "authlimit-redis-1", den: "null", of: p99Of, applies: func(w workload) bool { return w.conns == 50 }},
		{label: "authlimit-redis-fw / naive", num: "authlimit-redis-fw", den: "naive"},
		{label: "authlimit-redis-1 p50 / naive p50", num: "authlimit-redis-1", den: "naive", of: p50Of},
		{label: "redis-floor p50 / naive p50", num: "redis-floor", den: "naive", of: p50Of},
		{label: "naive-raw p50 / naive p50", num: "naive-raw", den: "naive", of: p50Of},
		{label: "naive-clock p50 / naive p50", num: "naive-clock", den: "naive", of: p50Of},
		{label: "Redis µs/decision: authlimit-redis-1 / naive", num: "authlimit-redis-1", den: "naive", of: redisCmdOf},
		{label: "Redis µs/decision: authlimit-redis-fw / naive", num: "authlimit-redis-fw", den: "naive", of: redisCmdOf},
		{label: "Redis µs/decision: naive-clock / naive", num: "naive-clock", den: "naive", of: redisCmdOf},
		{label: "Redis µs/decision: authlimit-redis-1 / naive-clock", num: "authlimit-redis-1", den: "naive-clock", of: redisCmdOf},
		{label: "Redis CPU µs/decision: authlimit-redis-1 / naive", num: "authlimit-redis-1", den: "naive", of: redisCPUOf},
		{label: "Redis CPU µs/decision: naive-clock / naive", num: "naive-clock", den: "naive", of: redisCPUOf},
		{label: "Redis µs/decision: authlimit-redis-3 / authlimit-redis-1", num: "authlimit-redis-3", den: "authlimit-redis-1", of: redisCmdOf},
		{label: "Redis µs/decision: nginx-authlimit-redis / nginx-lua-redis", num: "nginx-authlimit-redis", den: "nginx-lua-redis", of: redisCmdOf},
	}
	rows = append(rows, grpcRatioRows()...)
	ws := r.workloads()
	p("## Summary\n\nRatios of decisions/s, or of the figure the row names (p50, p99, Redis µs per decision by commandstats, Redis CPU µs per decision, proxy CPU µs per decision), medians of the rounds. ")
	p("⚠ marks a ratio with a system that had errors, or an authlimit that decided without its store (see the workload's table).\n\n| ratio |")
	for _, w := range ws {
		p(" %s |", w)
	}
	p("\n|---|%s\n", strings.Repeat("--:|", len(ws)))
	for _, row := range rows {
		p("| %s |", row.label)
		for _, w := range ws {
			num, den := r.summaryOf(w, row.num), r.summaryOf(w, row.den)
			cell := "—"
			if num != nil && den != nil && (row.applies == nil || row.applies(w)) {
				n, nok := row.of.value(num)
				d, dok := row.of.value(den)
				if nok && dok {
					cell = fmt.Sprintf("%.2f", n/d)
				}
				if cell != "—" && (num.flagged() || den.flagged()) {
					cell += " ⚠"
				}
			}
			p(" %s |", cell)
		}
		p("\n")
	}
	p("\n")
}

func (r *report) renderMemory(p func(string, ...any)) {
	if len(r.memory) == 0 {
		return
	}
	p("## Redis memory per key\n\n")
	p("For each algorithm: a fresh redis-server and authlimit with `%s`, one request from each of %d client IPs ", memoryRule("<algorithm>"), r.o.ips)
	p("(a window of a day, so that no state expires during the measurement). ")
	p("MEMORY USAGE is averaged over every key (SCAN, `SAMPLES 0`); used_memory grows between a sample before (scripts loaded, no client but the harness) and after (authlimit stopped, so client buffers are not counted).\n\n")
	p("| algorithm | 200s | keys | keys per client | MEMORY USAGE, bytes/key | used_memory growth, bytes/key | used_memory growth, bytes/client |\n")
	p("|---|--:|--:|--:|--:|--:|--:|\n")
	var warnings []string
	for _, m := range r.memory {
		name := "`" + m.algorithm + "`"
		if m.health.bad() {
			name += " ⚠"
			warnings = append(warnings, fmt.Sprintf("⚠ `%s`: %s: those requests were decided without Redis and left no key.", m.algorithm, &m.health))
		}
		p("| %s | %d | %d | %.2f | %.0f | %.0f | %.0f |\n", name, m.allowed, m.keys,
			float64(m.keys)/float64(m.clients), perKey(m.usageSum, m.keys), perKey(m.usedMemory, m.keys), perKey(m.usedMemory, m.clients))
	}
	p("\n")
	for _, w := range warnings {
		p("%s\n\n", w)
	}
}

// fmtDuration prints a latency with three significant digits.
func fmtDuration(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	switch {
	case us < 1000:
		return fmt.Sprintf("%.0fµs", us)
	case us < 10000:
		return fmt.Sprintf("%.2fms", us/1000)
	case us < 100000:
		return fmt.Sprintf("%.1fms", us/1000)
	default:
		return fmt.Sprintf("%.0fms", us/1000)
	}
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
