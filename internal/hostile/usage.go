package hostile

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Usage is a process's resident memory and the CPU time it has used.
type Usage struct {
	RSS int64         // bytes
	CPU time.Duration // user and system
}

// clockTick is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on
// every Linux build authlimit runs on).
const clockTick = 10 * time.Millisecond

// ReadUsage reads pid's resident set size (VmRSS of /proc/<pid>/status)
// and CPU time (utime and stime of /proc/<pid>/stat).
func ReadUsage(pid int) (Usage, error) {
	var u Usage
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, fmt.Errorf("read usage: %w", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return u, fmt.Errorf("read usage: VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return u, fmt.Errorf("read usage: VmRSS line %q: %w", line, err)
			}
			u.RSS = kb << 10
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, fmt.Errorf("read usage: %w", err)
	}
	// The command name, in parentheses, may hold spaces: fields are
	// counted from its closing parenthesis (utime is field 14, stime 15).
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return u, fmt.Errorf("read usage: /proc/%d/stat unreadable", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return u, fmt.Errorf("read usage: /proc/%d/stat has %d fields after the name", pid, len(f))
	}
	for _, v := range f[11:13] {
		ticks, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return u, fmt.Errorf("read usage: /proc/%d/stat: %w", pid, err)
		}
		u.CPU += time.Duration(ticks) * clockTick
	}
	return u, nil
}

// Watch samples a process's usage every interval until Stop.
type Watch struct {
	pid   int
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	first Usage
	last  Usage
	peak  int64
	err   error
}

// StartWatch starts sampling pid every interval.
func StartWatch(pid int, interval time.Duration) (*Watch, error) {
	u, err := ReadUsage(pid)
	if err != nil {
		return nil, err
	}
	w := &Watch{pid: pid, stop: make(chan struct{}), done: make(chan struct{}), first: u, last: u, peak: u.RSS}
	go w.run(interval)
	return w, nil
}

func (w *Watch) run(interval time.Duration) {
	defer close(w.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			w.sample()
			return
		case <-t.C:
			w.sample()
		}
	}
}

func (w *Watch) sample() {
	u, err := ReadUsage(w.pid)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if w.err == nil {
			w.err = err
		}
		return
	}
	w.last = u
	w.peak = max(w.peak, u.RSS)
}

// Stop ends the sampling, after a last sample, and returns the peak RSS,
// the CPU time used since StartWatch, and the first error met, if any
// (the process ended, say).
func (w *Watch) Stop() (peakRSS int64, cpu time.Duration, err error) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak, w.last.CPU - w.first.CPU, w.err
}

// Peak is the largest RSS sampled so far.
func (w *Watch) Peak() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak
}

// MiB formats a byte count in mebibytes, one decimal.
func MiB(n int64) string {
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
}
