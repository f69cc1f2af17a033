package membudget

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// RuntimeShare is the part of the container's memory limit given to the
// Go runtime's soft limit (debug.SetMemoryLimit): the rest is for what
// the runtime does not count (the kernel's socket buffers charged to the
// container, the binary's pages) and a margin before the container is
// killed.
const RuntimeShare = 0.75

// ContainerLimit reads the memory limit of the cgroup the process is in,
// v2 (memory.max) or v1 (memory.limit_in_bytes), from root (the file
// system's root, "/" but in tests). It returns 0 and no error when the
// cgroup sets no limit or the process is in none, and where the limit was
// read.
func ContainerLimit(root fs.FS) (int64, string, error) {
	b, err := fs.ReadFile(root, "proc/self/cgroup")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("container memory limit: %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-ID:controllers:path
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		var dir, file string
		switch {
		case f[0] == "0" && f[1] == "":
			dir, file = "sys/fs/cgroup", "memory.max"
		case hasController(f[1], "memory"):
			dir, file = "sys/fs/cgroup/memory", "memory.limit_in_bytes"
		default:
			continue
		}
		// With a cgroup namespace the process sees its own cgroup at the
		// hierarchy's root; without one, at its path.
		for _, p := range []string{path.Join(dir, f[2], file), path.Join(dir, file)} {
			v, err := fs.ReadFile(root, strings.TrimPrefix(p, "/"))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return 0, "", fmt.Errorf("container memory limit: %w", err)
			}
			n, err := parseLimit(string(v))
			if err != nil {
				return 0, "", fmt.Errorf("container memory limit: /%s: %w", p, err)
			}
			return n, "/" + p, nil
		}
	}
	return 0, "", nil
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// parseLimit reads a cgroup memory limit: bytes, or "max" (none); v1's
// "none" is a number near 2^63.
func parseLimit(v string) (int64, error) {
	v = strings.TrimSpace(v)
	if v == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a byte count", v)
	}
	if n <= 0 || n >= 1<<62 {
		return 0, nil
	}
	return n, nil
}

// SetRuntimeLimit gives the Go runtime a soft memory limit of
// RuntimeShare of the container's (read from root), unless gomemlimit
// (the GOMEMLIMIT variable, which the runtime reads itself) is set. It
// returns the limit set, 0 if none, and why.
func SetRuntimeLimit(root fs.FS, gomemlimit string) (int64, string, error) {
	if gomemlimit != "" {
		return debug.SetMemoryLimit(-1), "GOMEMLIMIT", nil
	}
	n, from, err := ContainerLimit(root)
	if err != nil || n == 0 {
		return 0, "no container memory limit", err
	}
	limit := int64(float64(n) * RuntimeShare)
	debug.SetMemoryLimit(limit)
	return limit, fmt.Sprintf("%.0f%% of %s (%d bytes)", RuntimeShare*100, from, n), nil
}

// RootFS is the file system ContainerLimit reads outside tests.
func RootFS() fs.FS { return os.DirFS("/") }

// Gauge is something whose fall frees memory: its reading, and the bytes
// one unit of it stands for (1 for a byte count, a connection's buffers
// for a count of connections). A Rising gauge only grows, and its growth
// frees memory: the bytes evicted connections held, say.
type Gauge struct {
	Read   func() int64
	Bytes  int64
	Rising bool
}

// Releaser returns memory to the system after a burst. Once the bytes
// held for requests or the connections open fall by threshold bytes'
// worth from their peak, or connections holding that much were evicted,
// the memory they held is garbage the runtime may keep for minutes (until
// its heap doubles or two minutes pass, then as its scavenger gets to
// it): the releaser collects it and returns it at once
// (debug.FreeOSMemory), at most once per interval, and comes again an
// interval later, and again while it returns a quarter of threshold or
// more.
type Releaser struct {
	gauges    []Gauge
	threshold int64
	every     time.Duration
	free      func() int64
	now       func() time.Time
	peaks     []int64
	last      time.Time
	again     bool // release once more, an interval after the last
}

// NewReleaser returns a releaser of the gauges that releases at most
// every interval, once their weighted fall from their peaks reaches
// threshold bytes.
func NewReleaser(threshold int64, every time.Duration, gauges ...Gauge) *Releaser {
	return &Releaser{gauges: gauges, threshold: threshold, every: every, free: freeAll, now: time.Now, peaks: make([]int64, len(gauges))}
}

// freeAll collects garbage twice, then returns what is free to the
// system, and reports how much it returned: buffers kept in a sync.Pool
// survive one collection (in its victim cache) and go at the second.
func freeAll() int64 {
	before := heapReleased()
	runtime.GC()
	debug.FreeOSMemory()
	return heapReleased() - before
}

// heapReleased is the heap memory returned to the system.
func heapReleased() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// Sample reads the gauges, and returns memory to the system if they fell
// far enough; it reports whether it did.
func (r *Releaser) Sample() bool {
	var fall int64
	for i, g := range r.gauges {
		v := g.Read()
		if g.Rising {
			// peaks holds the reading at the last release.
			fall += (v - r.peaks[i]) * g.Bytes
			continue
		}
		r.peaks[i] = max(r.peaks[i], v)
		fall += (r.peaks[i] - v) * g.Bytes
	}
	now := r.now()
	if fall < r.threshold && !r.again || now.Sub(r.last) < r.every {
		return false
	}
	// A release as a burst ends finds some of its memory still in use
	// (connections closing, buffers on their way back to a pool): it
	// comes again an interval later, and again while it finds much.
	freed := r.free()
	r.again = fall >= r.threshold || freed >= r.threshold/4
	r.last = now
	for i, g := range r.gauges {
		r.peaks[i] = g.Read()
	}
	return true
}

// Run samples every tick until stop is closed.
func (r *Releaser) Run(stop <-chan struct{}, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			r.Sample()
		}
	}
}
