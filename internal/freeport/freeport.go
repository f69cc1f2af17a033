// Package freeport finds TCP ports for tests and benchmarks to hand to
// processes they start, which bind them a moment later.
//
// A port the kernel picks for a listener on port 0 comes from the range it
// also picks outgoing connections' source ports from
// (/proc/sys/net/ipv4/ip_local_port_range): between the moment a port is
// found free and the moment its process binds it, any connection made on
// the machine (a proxy's to its upstream, a client's to Redis) can take it
// as its source port, and the process fails to start; so can it while a
// server is down between a stop and a restart on its port. Ports are therefore
// chosen below that range, where no source port is ever picked, at random,
// each checked free by binding it, and never twice in one process.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the lowest port chosen: above the well-known and most
// registered services' ports.
const lowest = 10000

var (
	mu     sync.Mutex
	handed = map[int]bool{}
)

// Get returns a TCP port on 127.0.0.1 that was free a moment ago, below the
// ephemeral range if there is room there, and not returned before by this
// process.
func Get() (int, error) {
	hi := ephemeralLow()
	mu.Lock()
	defer mu.Unlock()
	if hi-lowest >= 1000 {
		for range 200 {
			port := lowest + rand.IntN(hi-lowest)
			if handed[port] {
				continue
			}
			if free(port) {
				handed[port] = true
				return port, nil
			}
		}
	}
	// No room below the ephemeral range (or none of it free): let the
	// kernel choose, as a last resort.
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !handed[port] {
			handed[port] = true
			return port, nil
		}
	}
	return 0, errors.New("find a free port: every port tried was taken")
}

// free reports whether port can be bound on 127.0.0.1 now.
func free(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// ephemeralLow is the lowest port the kernel picks source ports from;
// Linux's default, 32768, where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo < 1 || lo > 65535 {
		return 32768
	}
	return lo
}
