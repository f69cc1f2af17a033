package main

// Tests of the commandstats arithmetic, and of the bench's Redis Cluster.

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCommandUsec(t *testing.T) {
	before := map[string]cmdStat{"evalsha": {calls: 10, usec: 100}, "incr": {calls: 10, usec: 20}}
	tests := []struct {
		name  string
		after map[string]cmdStat
		want  uint64
		calls uint64 // of scripts
	}{
		{"scripts: inner commands left out", map[string]cmdStat{"evalsha": {calls: 20, usec: 300}, "incr": {calls: 20, usec: 50}, "info": {calls: 1, usec: 9}}, 200, 10},
		{"both script commands", map[string]cmdStat{"evalsha": {calls: 14, usec: 150}, "eval": {calls: 2, usec: 30}, "get": {calls: 20, usec: 50}}, 80, 6},
		{"plain commands summed", map[string]cmdStat{"evalsha": {calls: 10, usec: 100}, "incr": {calls: 30, usec: 60}, "pexpire": {calls: 5, usec: 5}, "info": {calls: 1, usec: 9}}, 45, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, calls := commandUsec(before, tt.after); got != tt.want || calls != tt.calls {
				t.Errorf("commandUsec = %d µs, %d script calls; want %d, %d", got, calls, tt.want, tt.calls)
			}
		})
	}
}

// TestStartClusterBusPorts starts the bench's three-primary cluster and
// checks that each node's cluster bus is on a port chosen for it, free
// when chosen, and not on Redis's default (the client port + 10000), which
// may be a source port already in use, or past 65535.
func TestStartClusterBusPorts(t *testing.T) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not on PATH (apt-get install redis-server): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodes, err := startCluster(ctx, t.TempDir(), path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, r := range nodes {
			r.stop()
		}
	}()
	seen := map[string]bool{}
	for _, r := range nodes {
		_, port, _ := strings.Cut(r.addr, ":")
		got, err := r.client.ConfigGet(ctx, "cluster-port").Result()
		if err != nil {
			t.Fatal(err)
		}
		bus := got["cluster-port"]
		client, _ := strconv.Atoi(port)
		if bus == "" || bus == "0" || bus == strconv.Itoa(client+10000) || seen[bus] {
			t.Errorf("node %s: cluster-port %q; want a port of its own", r.addr, bus)
			continue
		}
		seen[bus] = true
		// The bus answers there: a TCP connection is accepted.
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+bus, time.Second)
		if err != nil {
			t.Errorf("node %s: cluster bus on %s: %v", r.addr, bus, err)
			continue
		}
		_ = c.Close()
	}
}
