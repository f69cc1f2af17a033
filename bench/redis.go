package main

// This file runs a throwaway redis-server per system run and reads what it
// says about itself: command statistics and memory.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/internal/clusterform"
	"github.com/authlimit/authlimit/internal/freeport"
)

// redisServer is a redis-server on a loopback port, with a client of the
// harness's own for INFO and key inspection.
type redisServer struct {
	addr   string
	proc   *proc
	client *redis.Client
}

// startRedis starts a redis-server without persistence in dir and waits
// until it answers PING.
func startRedis(ctx context.Context, dir, bin string) (*redisServer, error) {
	return startRedisNamed(ctx, dir, "redis", bin)
}

// startRedisNamed is startRedis with the process's name (its log file) and
// extra arguments.
func startRedisNamed(ctx context.Context, dir, name, bin string, extra ...string) (*redisServer, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := strings.Cut(addr, ":")
	p, err := startProc(dir, name, bin, append([]string{
		"--save", "", "--appendonly", "no", "--port", port, "--bind", "127.0.0.1",
		"--dir", dir, "--daemonize", "no",
	}, extra...), nil)
	if err != nil {
		return nil, err
	}
	r := &redisServer{addr: addr, proc: p, client: redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MaxRetries: -1})}
	ping := func() error {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return r.client.Ping(pctx).Err()
	}
	if err := waitReady(ctx, "redis-server", 10*time.Second, ping, p); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// url is the server's redis:// URL.
func (r *redisServer) url() string { return "redis://" + r.addr }

// stop closes the client and stops the server.
func (r *redisServer) stop() {
	_ = r.client.Close()
	r.proc.stop()
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	calls uint64
	usec  uint64
}

// commandStats reads INFO commandstats: the calls and microseconds of each
// command since the server started.
func (r *redisServer) commandStats(ctx context.Context) (map[string]cmdStat, error) {
	info, err := r.info(ctx, "commandstats")
	if err != nil {
		return nil, err
	}
	stats := map[string]cmdStat{}
	for name, v := range info {
		name, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		var s cmdStat
		for _, kv := range strings.Split(v, ",") {
			k, val, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				s.calls, err = strconv.ParseUint(val, 10, 64)
			case "usec":
				s.usec, err = strconv.ParseUint(val, 10, 64)
			}
			if err != nil {
				return nil, fmt.Errorf("redis INFO commandstats: %s: %w", name, err)
			}
		}
		stats[name] = s
	}
	return stats, nil
}

// commandUsec is the microseconds Redis spent on the commands clients sent
// between two INFO commandstats samples, and the calls of scripts among
// them. Redis also counts the commands a script calls, inside the script's
// own time: when scripts ran, only the script commands are summed, so
// nothing counts twice. INFO, the harness's own, is left out.
func commandUsec(before, after map[string]cmdStat) (usec, scripts uint64) {
	delta := map[string]cmdStat{}
	for name, a := range after {
		b := before[name]
		d := cmdStat{calls: a.calls - b.calls, usec: a.usec - b.usec}
		if d.calls == 0 || name == "info" {
			continue
		}
		delta[name] = d
		if isScriptCommand(name) {
			scripts += d.calls
		}
	}
	for name, d := range delta {
		if scripts == 0 || isScriptCommand(name) {
			usec += d.usec
		}
	}
	return usec, scripts
}

// isScriptCommand reports whether a command runs a script or function.
func isScriptCommand(name string) bool {
	return strings.HasPrefix(name, "eval") || strings.HasPrefix(name, "fcall")
}

// usedMemory is INFO memory's used_memory, in bytes.
func (r *redisServer) usedMemory(ctx context.Context) (int64, error) {
	info, err := r.info(ctx, "memory")
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(info["used_memory"], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("redis INFO memory: used_memory: %w", err)
	}
	return n, nil
}

// connectedClients is INFO clients' connected_clients.
func (r *redisServer) connectedClients(ctx context.Context) (int, error) {
	info, err := r.info(ctx, "clients")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(info["connected_clients"])
	if err != nil {
		return 0, fmt.Errorf("redis INFO clients: connected_clients: %w", err)
	}
	return n, nil
}

// info reads one INFO section as name → value.
func (r *redisServer) info(ctx context.Context, section string) (map[string]string, error) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := r.client.Info(ictx, section).Result()
	if err != nil {
		return nil, fmt.Errorf("redis INFO %s: %w", section, err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out, nil
}

// keyMemory scans every key and returns how many there are and the sum of
// MEMORY USAGE over them (SAMPLES 0: every element counted).
func (r *redisServer) keyMemory(ctx context.Context) (keys int, bytes int64, err error) {
	var cursor uint64
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		batch, next, err := r.client.Scan(sctx, cursor, "*", 1000).Result()
		if err != nil {
			cancel()
			return 0, 0, fmt.Errorf("redis SCAN: %w", err)
		}
		pipe := r.client.Pipeline()
		cmds := make([]*redis.IntCmd, len(batch))
		for i, k := range batch {
			cmds[i] = pipe.MemoryUsage(sctx, k, 0)
		}
		_, err = pipe.Exec(sctx)
		cancel()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, 0, fmt.Errorf("redis MEMORY USAGE: %w", err)
		}
		for _, c := range cmds {
			if n, err := c.Result(); err == nil { // redis.Nil: expired meanwhile
				keys++
				bytes += n
			}
		}
		if cursor = next; cursor == 0 {
			return keys, bytes, nil
		}
	}
}

// startCluster starts a Redis Cluster of n primaries without replicas, each
// serving an equal range of slots, and waits until every node says the
// cluster is ok and knows the others.
func startCluster(ctx context.Context, dir, bin string, n int) ([]*redisServer, error) {
	var nodes []*redisServer
	stop := func() {
		for _, r := range nodes {
			r.stop()
		}
	}
	var members []clusterform.Node
	for i := 0; i < n; i++ {
		// The cluster bus's port, chosen as the client port is (see
		// clusterform.Node).
		bus, err := freeport.Get()
		if err != nil {
			stop()
			return nil, err
		}
		r, err := startRedisNamed(ctx, dir, fmt.Sprintf("redis-%d", i), bin,
			"--cluster-enabled", "yes", "--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i),
			"--cluster-node-timeout", "5000", "--cluster-port", strconv.Itoa(bus))
		if err != nil {
			stop()
			return nil, err
		}
		nodes = append(nodes, r)
		members = append(members, clusterform.Node{Addr: r.addr, Bus: bus})
	}
	formCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := clusterform.Form(formCtx, members); err != nil {
		stop()
		return nil, err
	}
	return nodes, nil
}

// sumCommandStats sums INFO commandstats over the nodes: one server, or
// a cluster's primaries.
func sumCommandStats(ctx context.Context, nodes []*redisServer) (map[string]cmdStat, error) {
	sum := map[string]cmdStat{}
	for _, r := range nodes {
		st, err := r.commandStats(ctx)
		if err != nil {
			return nil, err
		}
		for k, v := range st {
			t := sum[k]
			t.calls, t.usec = t.calls+v.calls, t.usec+v.usec
			sum[k] = t
		}
	}
	return sum, nil
}
