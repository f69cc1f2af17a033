package main

// This file reads the benchmark's flags into one options value.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// options is the whole configuration of one benchmark run.
type options struct {
	authlimit   string        // path of the authlimit binary under test
	rounds      int           // rounds; each runs every system once per workload
	duration    time.Duration // measured window of one run
	warmup      time.Duration // unmeasured load before the window
	conns       []int         // connection counts, each a workload variant
	workloads   []string      // "ips", "hot"
	systems     []string      // names from systemNames, in the order given
	ips         int           // distinct client IPs of the ips workload
	nginx       string        // nginx binary
	redis       string        // redis-server binary
	nginxConf   string        // the shipped auth_request config
	haproxy     string        // haproxy binary
	haproxyCfg  string        // the shipped haproxy-lua.cfg, beside authlimit.lua
	haproxySPOE string        // the shipped haproxy.cfg, beside spoe-authlimit.conf
	restyConf   string        // the shipped OpenResty config
	restyLua    string        // the shipped OpenResty Lua module
	out         string        // the results file
	memory      bool          // measure Redis memory per key
	micro       bool          // run the Go micro-benchmarks
	benchtime   string        // go test -benchtime, empty for its default
	goBin       string        // go command for the micro-benchmarks
	ratelimit   string        // envoyproxy/ratelimit binary; empty: the cached build
	selfBinary  string        // this program, for the serve-* subcommands
	args        []string      // the command line, for the results
}

// parseOptions reads the flags and reports every mistake at once.
func parseOptions(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.StringVar(&o.authlimit, "authlimit", "bin/authlimit", "authlimit binary to benchmark (build a baseline from an older commit to compare)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds; every system runs once per workload in each, and the median is reported")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured window of each run")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each window")
	conns := fs.String("conns", "1,4,16,50,500", "connection counts, comma-separated")
	workloads := fs.String("workloads", "ips,hot", "workloads, comma-separated: ips (distinct client IPs, admitted), hot (one client far over its limit)")
	systems := fs.String("systems", strings.Join(systemNames(), ","), "systems, comma-separated")
	fs.IntVar(&o.ips, "ips", 10000, "distinct client IPs of the ips workload and of the memory measurement")
	fs.StringVar(&o.nginx, "nginx", "nginx", "nginx binary (nginx systems are skipped if it is missing)")
	fs.StringVar(&o.redis, "redis-server", "redis-server", "redis-server binary")
	fs.StringVar(&o.nginxConf, "nginx-conf", "nginx/example.conf", "the shipped nginx auth_request config, for nginx-authlimit-redis and nginx-auth-null")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "haproxy binary, built with Lua (haproxy systems are skipped if it is missing)")
	fs.StringVar(&o.haproxyCfg, "haproxy-conf", "haproxy/haproxy-lua.cfg", "the shipped haproxy-lua.cfg, with authlimit.lua beside it, for haproxy-authlimit-redis")
	fs.StringVar(&o.haproxySPOE, "haproxy-spoe-conf", "haproxy/haproxy.cfg", "the shipped haproxy.cfg, with spoe-authlimit.conf beside it, for haproxy-spoe-authlimit-redis and haproxy-spoe-null")
	fs.StringVar(&o.restyConf, "openresty-conf", "nginx/openresty.conf", "the shipped OpenResty config, for openresty-authlimit-redis")
	fs.StringVar(&o.restyLua, "openresty-lua", "nginx/authlimit.lua", "the shipped OpenResty Lua module, for openresty-authlimit-redis")
	fs.StringVar(&o.out, "out", "bench/RESULTS.md", "results file, written at the end of a complete run")
	fs.BoolVar(&o.memory, "memory", true, "measure Redis memory per key for each algorithm")
	fs.BoolVar(&o.micro, "micro", true, "run the Go micro-benchmarks (go test -bench)")
	fs.StringVar(&o.benchtime, "benchtime", "", "go test -benchtime for the micro-benchmarks (default: go's)")
	fs.StringVar(&o.goBin, "go", "go", "go command for the micro-benchmarks")
	fs.StringVar(&o.ratelimit, "ratelimit", "", "envoyproxy/ratelimit binary for envoy-ratelimit (default: built once with go install into the user cache directory)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var errs []error
	problem := func(flag string, err error) { errs = append(errs, fmt.Errorf("-%s: %w", flag, err)) }
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if o.rounds < 1 {
		problem("rounds", errors.New("must be at least 1"))
	}
	if o.duration <= 0 {
		problem("duration", errors.New("must be positive"))
	}
	if o.warmup < 0 {
		problem("warmup", errors.New("must not be negative"))
	}
	if o.ips < 1 || o.ips > maxIPs {
		problem("ips", fmt.Errorf("%d is not between 1 and %d (198.18.0.0/15)", o.ips, maxIPs))
	}
	for _, s := range splitList(*conns) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 10000 {
			problem("conns", fmt.Errorf("%q is not a connection count from 1 to 10000", s))
			continue
		}
		o.conns = append(o.conns, n)
	}
	o.workloads = splitList(*workloads)
	for _, w := range o.workloads {
		if w != "ips" && w != "hot" {
			problem("workloads", fmt.Errorf("unknown workload %q (want ips or hot)", w))
		}
	}
	o.systems = splitList(*systems)
	for _, s := range o.systems {
		if !slices.Contains(systemNames(), s) {
			problem("systems", fmt.Errorf("unknown system %q (want some of %s)", s, strings.Join(systemNames(), ",")))
		}
	}
	if len(errs) == 0 && (len(o.conns) == 0 || len(o.workloads) == 0 || len(o.systems) == 0) {
		problem("conns, -workloads and -systems", errors.New("need at least one each"))
	}
	// Debian's nginx and haproxy are in /usr/sbin, which is not on every
	// user's PATH.
	for _, bin := range []*string{&o.nginx, &o.haproxy} {
		if _, err := exec.LookPath(*bin); err != nil && !strings.Contains(*bin, "/") {
			if _, err := os.Stat("/usr/sbin/" + *bin); err == nil {
				*bin = "/usr/sbin/" + *bin
			}
		}
	}
	// Processes start in their run's directory: paths must not be
	// relative to this one.
	for _, path := range []*string{&o.authlimit, &o.nginx, &o.redis, &o.nginxConf, &o.restyConf, &o.restyLua, &o.haproxy, &o.haproxyCfg, &o.haproxySPOE, &o.goBin, &o.ratelimit} {
		if strings.Contains(*path, "/") {
			abs, err := filepath.Abs(*path)
			if err != nil {
				errs = append(errs, fmt.Errorf("resolve %s: %w", *path, err))
			}
			*path = abs
		}
	}
	self, err := os.Executable()
	if err != nil {
		errs = append(errs, fmt.Errorf("find this program's path: %w", err))
	}
	o.selfBinary = self
	o.args = append([]string{os.Args[0]}, args...)
	if len(errs) > 0 {
		return nil, errors.New("flags:\n  " + lines(errs))
	}
	return o, nil
}

// splitList splits a comma-separated flag, dropping empty items and
// duplicates.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// lines joins errors one per line, indented under a heading.
func lines(errs []error) string {
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "\n  ")
}
