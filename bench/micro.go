package main

// This file runs the Go micro-benchmarks (what `make bench` ran before this
// harness) and keeps their output for the results.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// microResult is the micro-benchmarks' command and output.
type microResult struct {
	command string
	output  string
}

// runMicro runs go test -bench over the module, echoing its output to
// progress as it comes.
func runMicro(ctx context.Context, o *options, progress io.Writer) (*microResult, error) {
	args := []string{"test", "-run", "^$", "-bench", ".", "-benchmem", "-timeout", "60m"}
	if o.benchtime != "" {
		args = append(args, "-benchtime", o.benchtime)
	}
	args = append(args, "./...")
	cmd := exec.CommandContext(ctx, o.goBin, args...)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, progress)
	cmd.Stderr = cmd.Stdout
	command := o.goBin + " " + strings.Join(quoteArgs(args), " ")
	fmt.Fprintln(progress, "running", command)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("micro-benchmarks (%s): %w", command, err)
	}
	return &microResult{command: command, output: out.String()}, nil
}

// quoteArgs single-quotes arguments the shell would read differently.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, "^$*?[] '\"\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}
