package main

// This file measures what each algorithm's state costs in Redis: one
// request for each of the workload's client IPs, then the keys' MEMORY
// USAGE and the growth of used_memory.

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"
)

// algorithms are authlimit's algorithms, in docs/rules.md's order.
func algorithms() []string {
	return []string{"fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "leaky_bucket", "gcra"}
}

// memoryRule is the rule measured. Its window is a day: the token_bucket,
// leaky_bucket and gcra states of one request expire once the request no
// longer matters (one 100th of the window), and must outlive the
// measurement.
func memoryRule(algorithm string) string {
	return "name=mem key=ip limit=100/1d algorithm=" + algorithm
}

// memoryResult is one algorithm's state in Redis after one request from
// each of clients IPs.
type memoryResult struct {
	algorithm  string
	clients    int
	allowed    int   // 200 answers (all, with a healthy Redis)
	keys       int   // keys in Redis
	usageSum   int64 // sum of MEMORY USAGE over the keys
	usedMemory int64 // used_memory after minus before
	health     authlimitHealth
}

// measureMemory runs the memory measurement for every algorithm.
func measureMemory(ctx context.Context, o *options, tmp string, progress io.Writer) ([]memoryResult, error) {
	reqs := buildRequests("/auth", clientIPs(o.ips))
	var out []memoryResult
	for _, a := range algorithms() {
		m, err := memoryOf(ctx, o, a, reqs, tmp)
		if err != nil {
			return nil, fmt.Errorf("memory of %s: %w", a, err)
		}
		fmt.Fprintf(progress, "memory %-22s %d keys, %.0f B/key (MEMORY USAGE), %.0f B/key (used_memory)\n",
			a, m.keys, perKey(m.usageSum, m.keys), perKey(m.usedMemory, m.keys))
		if m.health.bad() {
			fmt.Fprintf(progress, "  WARNING %s\n", &m.health)
		}
		out = append(out, m)
	}
	return out, nil
}

// memoryOf measures one algorithm on a fresh Redis. used_memory is read
// with no authlimit connected, before (scripts already loaded by a first
// authlimit) and after (the filling authlimit stopped), so the clients'
// buffers are not counted as state.
func memoryOf(ctx context.Context, o *options, algorithm string, reqs [][]byte, tmp string) (memoryResult, error) {
	m := memoryResult{algorithm: algorithm, clients: len(reqs)}
	dir, err := os.MkdirTemp(tmp, "memory-")
	if err != nil {
		return m, fmt.Errorf("make run directory: %w", err)
	}
	defer os.RemoveAll(dir)
	r, err := startRedis(ctx, dir, o.redis)
	if err != nil {
		return m, err
	}
	defer r.stop()
	e := &runEnv{o: o, dir: dir, workload: "ips", redis: r}
	rules := memoryRule(algorithm)

	p, _, err := startAuthlimit(ctx, e, rules)
	if err != nil {
		return m, err
	}
	p.stop()
	if err := waitAlone(ctx, r); err != nil {
		return m, err
	}
	before, err := r.usedMemory(ctx)
	if err != nil {
		return m, err
	}

	p, addr, err := startAuthlimit(ctx, e, rules)
	if err != nil {
		return m, err
	}
	counts, err := sendEach(ctx, addr, reqs, 50)
	if err == nil {
		// A request the fail mode decided left no key in Redis.
		m.health, err = scrapeHealth("http://" + addr + "/metrics")
	}
	p.stop()
	if err != nil {
		return m, err
	}
	m.allowed = counts[200]
	if err := waitAlone(ctx, r); err != nil {
		return m, err
	}
	after, err := r.usedMemory(ctx)
	if err != nil {
		return m, err
	}
	m.usedMemory = after - before
	if m.keys, m.usageSum, err = r.keyMemory(ctx); err != nil {
		return m, err
	}
	return m, nil
}

// waitAlone waits until the harness's own connection is Redis's only
// client, so that no other client's buffers count in used_memory.
func waitAlone(ctx context.Context, r *redisServer) error {
	return waitReady(ctx, "authlimit's Redis connections to close", 10*time.Second, func() error {
		n, err := r.connectedClients(ctx)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d clients connected", n)
		}
		return err
	}, r.proc)
}

// perKey divides bytes by keys, 0 for no keys.
func perKey(bytes int64, keys int) float64 {
	if keys == 0 {
		return 0
	}
	return float64(bytes) / float64(keys)
}
