package main

// This file is the benchmark run from start to end: checks, rounds, memory,
// micro-benchmarks, results file.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// facts describe the machine and the software measured, for the results.
type facts struct {
	start, end time.Time
	goVersion  string
	cpu        string
	kernel     string
	authlimit  string
	redis      string
	nginx      string
	haproxy    string
}

// benchmark runs everything o asks for and writes the results file.
func benchmark(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	f := gatherFacts(o)
	if _, err := os.Stat(o.authlimit); err != nil {
		return fmt.Errorf("authlimit binary: %w (run make build, or pass -authlimit)", err)
	}
	if _, err := exec.LookPath(o.redis); err != nil {
		return fmt.Errorf("redis-server: %w (apt-get install redis-server)", err)
	}
	systems, notes := selectSystems(o)
	systems, notes = prepareRatelimit(ctx, o, systems, notes, stderr)
	for _, n := range notes {
		fmt.Fprintln(stderr, "note:", n)
	}
	if len(systems) == 0 {
		return errors.New("no system can run here")
	}
	tmp, err := os.MkdirTemp("", "authlimit-bench-")
	if err != nil {
		return fmt.Errorf("make temporary directory: %w", err)
	}
	defer os.RemoveAll(tmp)

	fmt.Fprintf(stdout, "authlimit bench: %d rounds × %d workloads × %d systems, warm-up %v, window %v\n",
		o.rounds, len(o.workloads)*len(o.conns), len(systems), o.warmup, o.duration)
	runs, err := rounds(ctx, o, systems, tmp, stdout)
	if err != nil {
		return err
	}
	var mem []memoryResult
	if o.memory {
		if mem, err = measureMemory(ctx, o, tmp, stdout); err != nil {
			return err
		}
	}
	var micro *microResult
	if o.micro {
		if micro, err = runMicro(ctx, o, stdout); err != nil {
			return err
		}
	}
	f.end = time.Now()
	rep := &report{o: o, facts: f, systems: systems, notes: notes, runs: runs, memory: mem, micro: micro}
	if err := rep.write(o.out); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "wrote", o.out)
	return nil
}

// gatherFacts reads versions and the CPU model; what cannot be read says
// why.
func gatherFacts(o *options) *facts {
	f := &facts{start: time.Now()}
	f.goVersion = commandOutput(o.goBin, "version")
	if strings.HasPrefix(f.goVersion, "(") {
		f.goVersion += ", this program built by " + runtime.Version()
	}
	f.cpu = fmt.Sprintf("%s (%d logical CPUs)", cpuModel(), runtime.NumCPU())
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		f.kernel = "Linux " + strings.TrimSpace(string(b))
	}
	f.authlimit = authlimitVersion(o.authlimit)
	f.redis = commandOutput(o.redis, "--version")
	f.nginx = commandOutput(o.nginx, "-v")                                    // nginx prints its version to stderr
	f.haproxy, _, _ = strings.Cut(commandOutput(o.haproxy, "-v"), " Status:") // its version line, without the support status
	return f
}

// commandOutput is a command's combined output on one line, or why it
// failed in parentheses.
func commandOutput(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(%s: %v)", bin, err)
	}
	return strings.Join(strings.Fields(string(out)), " ")
}

// cpuModel is the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "(no model name in /proc/cpuinfo)"
}
