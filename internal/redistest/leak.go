package redistest

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tcpListen is the LISTEN state in /proc/net/tcp.
const tcpListen = 0x0A

// OpenConns returns how many TCP connections this process holds open to
// addr (host:port, IPv4 or IPv6), in any state but LISTEN: CLOSE_WAIT
// counts too, since a socket the peer closed but we did not is a leak. It
// matches the socket inodes behind /proc/self/fd against /proc/self/net/tcp
// and tcp6, so it counts only this process's sockets, whoever opened them.
func OpenConns(t testing.TB, addr string) int {
	t.Helper()
	n, err := openConns(addr)
	if err != nil {
		t.Fatalf("redistest: OpenConns(%s): %v", addr, err)
	}
	return n
}

// WaitConns waits until this process holds at most max connections to
// addr, and fails t with the count if it still holds more after timeout.
func WaitConns(t testing.TB, addr string, max int, timeout time.Duration) {
	t.Helper()
	var n int
	err := poll(timeout, func() error {
		var err error
		if n, err = openConns(addr); err != nil {
			return err
		}
		if n > max {
			return fmt.Errorf("%d open", n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: connections to %s: want at most %d within %v, have %v", addr, max, timeout, err)
	}
}

func openConns(addr string) (int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	ip := net.ParseIP(host)
	wantPort, err := strconv.Atoi(p)
	if ip == nil || err != nil {
		return 0, fmt.Errorf("want a numeric host:port, got %q", addr)
	}
	inodes, err := processSocketInodes("/proc/self")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, file := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		socks, err := readProcTCP(file)
		if err != nil {
			return 0, err
		}
		for _, s := range socks {
			if s.state != tcpListen && inodes[s.inode] && s.remotePort == wantPort && s.remoteIP.Equal(ip) {
				n++
			}
		}
	}
	return n, nil
}

// procSocket is one line of /proc/net/tcp.
type procSocket struct {
	remoteIP   net.IP
	remotePort int
	state      int
	inode      string
}

// readProcTCP parses /proc/net/tcp or tcp6; a missing file (no IPv6) is
// empty.
func readProcTCP(path string) ([]procSocket, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var socks []procSocket
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:when retrnsmt uid timeout inode ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		ip, port, err := parseProcAddr(fields[2])
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		state, err := strconv.ParseInt(fields[3], 16, 32)
		if err != nil {
			return nil, fmt.Errorf("parse %s state %q: %w", path, fields[3], err)
		}
		socks = append(socks, procSocket{remoteIP: ip, remotePort: port, state: int(state), inode: fields[9]})
	}
	return socks, sc.Err()
}

// parseProcAddr parses "0100007F:1F90": the address as 32-bit words each
// printed in host byte order, then the port in hex.
func parseProcAddr(s string) (net.IP, int, error) {
	hexIP, hexPort, ok := strings.Cut(s, ":")
	if !ok {
		return nil, 0, fmt.Errorf("address %q", s)
	}
	raw, err := hex.DecodeString(hexIP)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return nil, 0, fmt.Errorf("address %q", s)
	}
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return nil, 0, fmt.Errorf("port in %q: %w", s, err)
	}
	return ip, int(port), nil
}

// GoroutineSnapshot is the goroutines alive at one moment, to check later
// that a test left none behind.
type GoroutineSnapshot struct {
	count int
	ids   map[string]bool
}

// SnapshotGoroutines records the goroutines alive now.
func SnapshotGoroutines() GoroutineSnapshot {
	s := GoroutineSnapshot{count: runtime.NumGoroutine(), ids: map[string]bool{}}
	for _, g := range goroutineStacks() {
		s.ids[goroutineID(g)] = true
	}
	return s
}

// WaitBack waits until every goroutine started since the snapshot has
// ended, except the one calling WaitBack, so that runtime.NumGoroutine is
// back to at most the snapshot's count. It fails t if that does not happen
// within timeout, with the stacks of the goroutines still alive. Goroutine
// ids are never reused, so this is exact where a bare count is not: one
// goroutine of an earlier test ending late would hide one leaked here.
// Goroutines are the whole process's, so a test that uses it must not run
// in parallel with others.
func (s GoroutineSnapshot) WaitBack(t testing.TB, timeout time.Duration) {
	t.Helper()
	self := goroutineID(currentStack())
	var extra []string
	err := poll(timeout, func() error {
		extra = extra[:0]
		for _, g := range goroutineStacks() {
			if id := goroutineID(g); !s.ids[id] && id != self {
				extra = append(extra, g)
			}
		}
		if len(extra) > 0 {
			return fmt.Errorf("%d goroutines, %d of them new", runtime.NumGoroutine(), len(extra))
		}
		return nil
	})
	if err != nil {
		t.Errorf("redistest: goroutines not back to the %d of the snapshot within %v (%v); still alive:\n\n%s",
			s.count, timeout, err, strings.Join(extra, "\n\n"))
	}
}

// currentStack returns the calling goroutine's stack.
func currentStack() string {
	buf := make([]byte, 256)
	n := runtime.Stack(buf, false)
	return string(buf[:n])
}

// goroutineStacks returns the stack of every goroutine, one string each.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(strings.TrimSpace(string(buf[:n])), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// goroutineID returns the N of a stack starting "goroutine N [...]:".
func goroutineID(stack string) string {
	f := strings.Fields(stack)
	if len(f) < 2 {
		return ""
	}
	return f[1]
}
