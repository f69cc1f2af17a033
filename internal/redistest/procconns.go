package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// tcpCloseWait is the CLOSE_WAIT state in /proc/net/tcp: the peer closed,
// the owner did not.
const tcpCloseWait = 0x08

// ProcessConns counts the TCP connections another process (pid, one the
// test started, such as authlimit) holds open to addr (numeric host:port),
// in any state but LISTEN, as OpenConns does for this process; closeWait
// says how many of them are in CLOSE_WAIT, which is always a leak: the
// peer has gone and the process still holds the socket.
func ProcessConns(pid int, addr string) (open, closeWait int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, 0, err
	}
	ip := net.ParseIP(host)
	wantPort, err := strconv.Atoi(p)
	if ip == nil || err != nil {
		return 0, 0, fmt.Errorf("want a numeric host:port, got %q", addr)
	}
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	inodes, err := processSocketInodes(proc)
	if err != nil {
		return 0, 0, err
	}
	for _, file := range []string{"net/tcp", "net/tcp6"} {
		socks, err := readProcTCP(filepath.Join(proc, file))
		if err != nil {
			return 0, 0, err
		}
		for _, s := range socks {
			if s.state == tcpListen || !inodes[s.inode] || s.remotePort != wantPort || !s.remoteIP.Equal(ip) {
				continue
			}
			open++
			if s.state == tcpCloseWait {
				closeWait++
			}
		}
	}
	return open, closeWait, nil
}

// processSocketInodes returns the inodes of the sockets behind proc/fd.
func processSocketInodes(proc string) (map[string]bool, error) {
	dir := filepath.Join(proc, "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list open files of %s: %w", proc, err)
	}
	inodes := map[string]bool{}
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if inode, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	return inodes, nil
}
