package main

// This file runs the rounds: every chosen system once per workload in each
// round, systems alternated so that the machine's noise spreads over all of
// them, each run measured from outside (load, /proc, Redis INFO).

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"
)

// workload is one load shape at one connection count.
type workload struct {
	name  string // "ips" or "hot"
	conns int
}

func (w workload) String() string { return fmt.Sprintf("%s c=%d", w.name, w.conns) }

// runResult is one measured run of one system under one workload.
type runResult struct {
	load         *loadResult
	proxyCPU     time.Duration // CPU of the system's proxy processes in the window
	serverCPU    time.Duration // CPU of the system's server processes in the window
	redisCPU     time.Duration // CPU of redis-server in the window
	redisUsec    uint64        // microseconds Redis's commandstats counted in the window
	redisScripts uint64        // script calls (EVAL, EVALSHA, FCALL) commandstats counted in the window
	hasProxy     bool          // the system has proxy processes
	hasServer    bool          // the system has server processes
	hasRedis     bool
	health       *authlimitHealth // authlimit systems only
}

// rounds runs every system under every workload o.rounds times and returns
// the runs by workload and system.
func rounds(ctx context.Context, o *options, systems []system, tmp string, progress io.Writer) (map[workload]map[string][]*runResult, error) {
	reqs := map[string]map[string][][]byte{}
	for _, w := range o.workloads {
		ips := workloadIPs(o, w)
		reqs[w] = map[string][][]byte{}
		for _, s := range systems {
			if s.rpc == nil && reqs[w][s.path] == nil {
				reqs[w][s.path] = buildRequests(s.path, ips)
			}
		}
	}
	results := map[workload]map[string][]*runResult{}
	total := o.rounds * len(o.workloads) * len(o.conns) * len(systems)
	done := 0
	for r := range o.rounds {
		for _, wname := range o.workloads {
			for _, c := range o.conns {
				w := workload{name: wname, conns: c}
				if results[w] == nil {
					results[w] = map[string][]*runResult{}
				}
				// Rotate the order each round, so that no system always
				// follows the same one.
				for i := range systems {
					s := systems[(i+r)%len(systems)]
					res, err := runOnce(ctx, o, s, w, reqs[wname][s.path], tmp)
					if err != nil {
						return nil, fmt.Errorf("round %d, %s, %s: %w", r+1, w, s.name, err)
					}
					results[w][s.name] = append(results[w][s.name], res)
					done++
					fmt.Fprintf(progress, "[%d/%d] round %d  %-9s %-22s %s\n", done, total, r+1, w, s.name, res.line())
				}
			}
		}
	}
	return results, nil
}

// workloadIPs are the clients of a workload.
func workloadIPs(o *options, workload string) []netip.Addr {
	if workload == "ips" {
		return clientIPs(o.ips)
	}
	return []netip.Addr{hotIP()}
}

// line is the progress line of a run.
func (r *runResult) line() string {
	s := fmt.Sprintf("%8.0f/s  p50 %-8s p99 %-8s 200s %-8d denials %-8d errors %d",
		float64(r.load.decisions())/r.load.elapsed.Seconds(),
		fmtDuration(r.load.hist.quantile(0.5)), fmtDuration(r.load.hist.quantile(0.99)),
		r.load.allowed, r.load.denied, r.load.errors())
	if r.health != nil && r.health.bad() {
		s += "  WARNING " + r.health.String()
	}
	return s
}

// runOnce starts a system fresh (with its own Redis if it uses one), loads
// it, measures it, and stops everything.
func runOnce(ctx context.Context, o *options, s system, w workload, reqs [][]byte, tmp string) (*runResult, error) {
	dir, err := os.MkdirTemp(tmp, s.name+"-")
	if err != nil {
		return nil, fmt.Errorf("make run directory: %w", err)
	}
	defer os.RemoveAll(dir)
	e := &runEnv{o: o, dir: dir, workload: w.name}
	var nodes []*redisServer // every redis-server of the run
	switch {
	case s.cluster:
		if e.cluster, err = startCluster(ctx, dir, o.redis, clusterPrimaries); err != nil {
			return nil, err
		}
		nodes = e.cluster
	case s.usesRedis:
		if e.redis, err = startRedis(ctx, dir, o.redis); err != nil {
			return nil, err
		}
		nodes = []*redisServer{e.redis}
	}
	defer func() {
		for _, r := range nodes {
			r.stop()
		}
	}()
	in, err := s.start(ctx, e)
	if err != nil {
		return nil, err
	}
	defer in.stop()

	res := &runResult{hasRedis: len(nodes) > 0, hasProxy: len(in.proxyRoots) > 0, hasServer: len(in.serverRoots) > 0}
	proxies, servers := processTree(in.proxyRoots...), processTree(in.serverRoots...)
	var redisPids []int
	for _, r := range nodes {
		redisPids = append(redisPids, r.proc.pid())
	}
	var pcpu0, cpu0, rcpu0 time.Duration
	var cs0 map[string]cmdStat
	atStart := func() error {
		pcpu0, cpu0, rcpu0 = cpuTime(proxies), cpuTime(servers), cpuTime(redisPids)
		if len(nodes) == 0 {
			return nil
		}
		var err error
		cs0, err = sumCommandStats(ctx, nodes)
		return err
	}
	atEnd := func() error {
		res.proxyCPU, res.serverCPU, res.redisCPU = cpuTime(proxies)-pcpu0, cpuTime(servers)-cpu0, cpuTime(redisPids)-rcpu0
		if len(nodes) > 0 {
			cs1, err := sumCommandStats(ctx, nodes)
			if err != nil {
				return err
			}
			res.redisUsec, res.redisScripts = commandUsec(cs0, cs1)
		}
		return nil
	}
	var l interface {
		run(ctx context.Context, atStart, atEnd func() error) (*loadResult, error)
	} = &load{addr: in.addr, reqs: reqs, conns: w.conns, warmup: o.warmup, duration: o.duration, denyStatus: in.denyStatus}
	if s.rpc != nil {
		l = &grpcLoad{addr: in.addr, rpc: s.rpc(workloadIPs(o, w.name)), conns: w.conns, warmup: o.warmup, duration: o.duration}
	}
	if res.load, err = l.run(ctx, atStart, atEnd); err != nil {
		return nil, err
	}
	for _, p := range in.procs {
		if err := p.exitedError(); err != nil {
			return nil, fmt.Errorf("during the run: %w", err)
		}
	}
	for _, url := range in.metrics {
		h, err := scrapeHealth(url)
		if err != nil {
			return nil, err
		}
		res.health = &h
	}
	return res, nil
}
