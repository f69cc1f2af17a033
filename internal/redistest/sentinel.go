package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// sentinelReadyTimeout bounds how long the sentinels may take to find the
// replica and each other: they greet each other every 2s.
const sentinelReadyTimeout = 30 * time.Second

// SentinelTopology is a master, a replica and three sentinels watching them
// with quorum 2, every one a process the test started on 127.0.0.1 and
// stops when it ends.
type SentinelTopology struct {
	// MasterName is the name the sentinels know the master by.
	MasterName string
	// Servers are the master and the replica, in start order. Which one is
	// the master now, MasterAddr tells.
	Servers []*Server
	// Sentinels are the three sentinels.
	Sentinels []*Server

	// mu guards the kill record.
	mu       sync.Mutex
	killed   *Server
	killedAt time.Time
}

// NewSentinelTopology starts a master, a replica of it and three sentinels
// (quorum 2), and returns once the replica is in sync and every sentinel
// knows the master, the replica and the two other sentinels.
// WithDownAfter (default 1s) and WithFailoverTimeout (default 3s) tune the
// sentinels; WithArgs and WithDebugCommand add arguments to the master and
// the replica.
func NewSentinelTopology(t testing.TB, opts ...Option) *SentinelTopology {
	t.Helper()
	o := newOptions(opts)
	path := serverPath(t)
	s := &SentinelTopology{MasterName: "authlimit-test"}
	// Redis 7.0 waits 5s by default before a diskless full sync.
	data := append([]string{"--repl-diskless-sync-delay", "0"}, o.args...)
	master, err := Start(t, path, data...)
	if err != nil {
		t.Fatalf("redistest: sentinel topology master: %v", err)
	}
	replica, err := Start(t, path, append(slices.Clip(data), "--replicaof", "127.0.0.1", port(master.Addr))...)
	if err != nil {
		t.Fatalf("redistest: sentinel topology replica: %v", err)
	}
	s.Servers = []*Server{master, replica}
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]s 2\n"+
		"sentinel down-after-milliseconds %[1]s %[3]d\n"+
		"sentinel failover-timeout %[1]s %[4]d\n"+
		"sentinel parallel-syncs %[1]s 1\n",
		s.MasterName, port(master.Addr), o.downAfter.Milliseconds(), o.failoverTimeout.Milliseconds())
	for i := 0; i < 3; i++ {
		dir := t.TempDir()
		// Sentinels rewrite their config file, so each gets its own.
		file := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatalf("redistest: write sentinel config: %v", err)
		}
		p, err := startOwned(t, procSpec{path: path, dir: dir, config: file, extra: []string{"--sentinel"}}, 1, nil)
		if err != nil {
			t.Fatalf("redistest: sentinel %d: %v", i+1, err)
		}
		s.Sentinels = append(s.Sentinels, newServer(p))
	}
	if err := poll(sentinelReadyTimeout, s.ready); err != nil {
		s.fatalf(t, "sentinel topology not ready within %v: %v", sentinelReadyTimeout, err)
	}
	return s
}

// ready reports (as nil) whether the replica is in sync and every sentinel
// knows the master, the replica and the other sentinels.
func (s *SentinelTopology) ready() error {
	info, err := commandString(s.Servers[1].Addr, "INFO", "replication")
	if err != nil {
		return fmt.Errorf("replica %s: %w", s.Servers[1].Addr, err)
	}
	if infoField(info, "master_link_status") != "up" || infoField(info, "master_sync_in_progress") != "0" {
		return fmt.Errorf("replica %s not in sync", s.Servers[1].Addr)
	}
	for _, sn := range s.Sentinels {
		v, err := command(sn.Addr, "SENTINEL", "MASTER", s.MasterName)
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", sn.Addr, err)
		}
		m := fields(v)
		if m["flags"] != "master" || m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
			return fmt.Errorf("sentinel %s sees the master with flags=%s num-slaves=%s num-other-sentinels=%s",
				sn.Addr, m["flags"], m["num-slaves"], m["num-other-sentinels"])
		}
		v, err = command(sn.Addr, "SENTINEL", "REPLICAS", s.MasterName)
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", sn.Addr, err)
		}
		list, _ := v.([]any)
		if len(list) != 1 {
			return fmt.Errorf("sentinel %s knows %d replicas", sn.Addr, len(list))
		}
		if r := fields(list[0]); r["flags"] != "slave" || r["master-link-status"] != "ok" {
			return fmt.Errorf("sentinel %s sees the replica with flags=%s master-link-status=%s",
				sn.Addr, r["flags"], r["master-link-status"])
		}
	}
	return nil
}

// SentinelAddrs returns the sentinels' host:port.
func (s *SentinelTopology) SentinelAddrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		addrs[i] = sn.Addr
	}
	return addrs
}

// Client returns a go-redis failover client for the topology, closed when
// t ends. configure may change its options first.
func (s *SentinelTopology) Client(t testing.TB, configure ...func(*redis.FailoverOptions)) *redis.Client {
	t.Helper()
	opts := &redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs()}
	for _, f := range configure {
		f(opts)
	}
	c := redis.NewFailoverClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a random key prefix for t. The servers are t's own, so
// nothing needs deleting.
func (s *SentinelTopology) Prefix(t testing.TB) string {
	t.Helper()
	return newPrefix()
}

// MasterAddr returns the master's host:port as most sentinels report it
// (SENTINEL GET-MASTER-ADDR-BY-NAME), and fails t when no address has a
// majority of the sentinels that answer.
func (s *SentinelTopology) MasterAddr(t testing.TB) string {
	t.Helper()
	votes := map[string]int{}
	answered := 0
	for _, sn := range s.Sentinels {
		addr, err := masterAddrFrom(sn.Addr, s.MasterName)
		if err != nil {
			continue
		}
		answered++
		votes[addr]++
	}
	for addr, n := range votes {
		if 2*n > answered {
			return addr
		}
	}
	s.fatalf(t, "MasterAddr: no majority among %d sentinels: %v", answered, votes)
	return ""
}

// server returns the data server at addr, nil if none.
func (s *SentinelTopology) server(addr string) *Server {
	for _, srv := range s.Servers {
		if srv.Addr == addr {
			return srv
		}
	}
	return nil
}

// KillMaster kills the server the sentinels report as master with SIGKILL,
// as a crash, records when for WaitFailover, and returns it. Restart on
// the returned server brings it back, empty; the sentinels then turn it
// into a replica of the new master.
//
// The crash loses no write the master answered. Redis replicates
// asynchronously and does not promise that: a master killed at random may
// die holding writes its replica never saw, and the promoted replica then
// forgets them. Tests that count a limit exactly across a failover need
// the replica to hold every answered write, so KillMaster first pauses
// clients' writes (CLIENT PAUSE WRITE) and waits until the replica has
// processed the master's whole replication stream. Writes that arrive
// during the pause wait in the master and fail at the kill, as at a crash.
func (s *SentinelTopology) KillMaster(t testing.TB) *Server {
	t.Helper()
	addr := s.MasterAddr(t)
	srv := s.server(addr)
	if srv == nil {
		s.fatalf(t, "KillMaster: the sentinels name %s, which the test did not start", addr)
	}
	if err := s.replicated(srv); err != nil {
		s.fatalf(t, "KillMaster: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	srv.Stop(t)
	s.killed, s.killedAt = srv, time.Now()
	return srv
}

// replicatedTimeout bounds how long KillMaster waits for the replica to
// catch up with a master whose writes it paused.
const replicatedTimeout = 10 * time.Second

// replicated pauses master's clients' writes and returns once every other
// data server still running has processed master's whole replication
// stream.
func (s *SentinelTopology) replicated(master *Server) error {
	// Longer than the wait below and the kill after it; the kill ends it.
	pause := (replicatedTimeout + 30*time.Second).Milliseconds()
	if _, err := command(master.Addr, "CLIENT", "PAUSE", pause, "WRITE"); err != nil {
		return fmt.Errorf("pause writes on %s: %w", master.Addr, err)
	}
	return poll(replicatedTimeout, func() error {
		info, err := commandString(master.Addr, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("master %s: %w", master.Addr, err)
		}
		want := infoField(info, "master_repl_offset")
		for _, r := range s.Servers {
			if r == master || !r.proc.alive() {
				continue // a server killed before, and not restarted
			}
			info, err := commandString(r.Addr, "INFO", "replication")
			if err != nil {
				return fmt.Errorf("replica %s: %w", r.Addr, err)
			}
			if got := infoField(info, "master_repl_offset"); got != want {
				return fmt.Errorf("replica %s at offset %s, master %s at %s", r.Addr, got, master.Addr, want)
			}
		}
		return nil
	})
}

// WaitFailover waits until every sentinel that answers names a master
// other than the one KillMaster killed and that server reports
// role:master. It returns the new master and the time from the kill, and
// fails t if that does not happen within timeout.
func (s *SentinelTopology) WaitFailover(t testing.TB, timeout time.Duration) (*Server, time.Duration) {
	t.Helper()
	s.mu.Lock()
	killed, killedAt := s.killed, s.killedAt
	s.mu.Unlock()
	if killed == nil {
		t.Fatalf("redistest: WaitFailover: no master was killed with KillMaster")
	}
	var elected string
	err := poll(timeout, func() error {
		elected = ""
		for _, sn := range s.Sentinels {
			addr, err := masterAddrFrom(sn.Addr, s.MasterName)
			if err != nil {
				continue
			}
			switch {
			case addr == killed.Addr:
				return fmt.Errorf("sentinel %s still names %s", sn.Addr, addr)
			case elected != "" && addr != elected:
				return fmt.Errorf("sentinels name both %s and %s", elected, addr)
			}
			elected = addr
		}
		if elected == "" {
			return errors.New("no sentinel answers")
		}
		info, err := commandString(elected, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("new master %s: %w", elected, err)
		}
		if role := infoField(info, "role"); role != "master" {
			return fmt.Errorf("new master %s reports role:%s", elected, role)
		}
		return nil
	})
	if err != nil {
		s.fatalf(t, "WaitFailover: no failover within %v: %v", timeout, err)
	}
	took := time.Since(killedAt)
	srv := s.server(elected)
	if srv == nil {
		s.fatalf(t, "WaitFailover: the sentinels elected %s, which the test did not start", elected)
	}
	return srv, took
}

// fatalf fails t with the message and the end of every process's log.
func (s *SentinelTopology) fatalf(t testing.TB, format string, args ...any) {
	t.Helper()
	var logs []string
	for _, srv := range append(append([]*Server(nil), s.Servers...), s.Sentinels...) {
		if srv.proc != nil {
			logs = append(logs, tailN(srv.proc.spec.logPath(), 400))
		}
	}
	t.Fatalf("redistest: "+format+"\n%s", append(args, strings.Join(logs, "\n"))...)
}

// masterAddrFrom asks the sentinel at addr where master name is.
func masterAddrFrom(addr, name string) (string, error) {
	v, err := command(addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
	if err != nil {
		return "", err
	}
	hp, _ := v.([]any)
	if len(hp) != 2 {
		return "", fmt.Errorf("sentinel %s: GET-MASTER-ADDR-BY-NAME %s = %v", addr, name, v)
	}
	return net.JoinHostPort(fmt.Sprint(hp[0]), fmt.Sprint(hp[1])), nil
}

// fields turns a flat name, value, name, value reply into a map.
func fields(v any) map[string]string {
	list, _ := v.([]any)
	m := make(map[string]string, len(list)/2)
	for i := 0; i+1 < len(list); i += 2 {
		m[fmt.Sprint(list[i])] = fmt.Sprint(list[i+1])
	}
	return m
}
