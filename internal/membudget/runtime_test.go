package membudget

import (
	"testing"
	"testing/fstest"
	"time"
)

// TestContainerLimit reads the limits of cgroup v2 and v1, with and
// without a cgroup namespace, and no limit.
func TestContainerLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
		from  string
		err   bool
	}{
		{"v2, namespaced", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "268435456\n"}, 268435456, "/sys/fs/cgroup/memory.max", false},
		{"v2, at its path", map[string]string{"proc/self/cgroup": "0::/kubepods/pod1/c1\n", "sys/fs/cgroup/kubepods/pod1/c1/memory.max": "134217728\n", "sys/fs/cgroup/memory.max": "max\n"}, 134217728, "/sys/fs/cgroup/kubepods/pod1/c1/memory.max", false},
		{"v2, no limit", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}, 0, "/sys/fs/cgroup/memory.max", false},
		{"v1", map[string]string{"proc/self/cgroup": "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n", "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "536870912"}, 536870912, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", false},
		{"v1, no limit", map[string]string{"proc/self/cgroup": "4:memory:/\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"}, 0, "/sys/fs/cgroup/memory/memory.limit_in_bytes", false},
		{"no cgroup", map[string]string{}, 0, "", false},
		{"no memory controller", map[string]string{"proc/self/cgroup": "5:cpu:/x\n"}, 0, "", false},
		{"garbage", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "lots\n"}, 0, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for name, data := range tc.files {
				fsys[name] = &fstest.MapFile{Data: []byte(data)}
			}
			got, from, err := ContainerLimit(fsys)
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if got != tc.want || !tc.err && got != 0 && from != tc.from {
				t.Errorf("ContainerLimit = %d from %q, want %d from %q", got, from, tc.want, tc.from)
			}
		})
	}
}

// TestReleaser: memory is returned once the gauges fall by the threshold
// from their peak, not on a smaller fall nor more often than the interval.
func TestReleaser(t *testing.T) {
	var held, conns, evicted int64
	now := time.Unix(0, 0)
	frees := 0
	r := NewReleaser(16<<20, 10*time.Second, Gauge{Read: func() int64 { return held }, Bytes: 1}, Gauge{Read: func() int64 { return conns }, Bytes: 32 << 10},
		Gauge{Read: func() int64 { return evicted }, Bytes: 1, Rising: true})
	r.free = func() int64 { frees++; return 0 }
	r.now = func() time.Time { return now }
	steps := []struct {
		name                 string
		held, conns, evicted int64
		advance              time.Duration
		want                 bool
	}{
		{"a burst", 40 << 20, 1000, 0, 20 * time.Second, false},
		{"a small fall", 30 << 20, 1000, 0, time.Second, false},
		{"the burst ends", 1 << 20, 1000, 0, time.Second, true},
		{"quiet, too soon for the second release", 1 << 20, 1000, 0, time.Second, false},
		{"quiet, an interval later: the second", 1 << 20, 1000, 0, 10 * time.Second, true},
		{"quiet after that", 1 << 20, 1000, 0, 10 * time.Second, false},
		{"connections come", 1 << 20, 2000, 0, time.Second, false},
		{"and go", 1 << 20, 100, 0, time.Second, true},
		{"hoarders evicted, held steady", 30 << 20, 100, 8 << 20, 11 * time.Second, true},
		{"the second release was the last", 30 << 20, 100, 8 << 20, 11 * time.Second, false},
		{"more evicted", 30 << 20, 100, 20 << 20, time.Second, false},
		{"more still, an interval later", 30 << 20, 100, 40 << 20, 10 * time.Second, true},
	}
	for _, s := range steps {
		held, conns, evicted = s.held, s.conns, s.evicted
		now = now.Add(s.advance)
		if got := r.Sample(); got != s.want {
			t.Fatalf("%s: Sample() = %v, want %v", s.name, got, s.want)
		}
	}
	if frees != 5 {
		t.Errorf("freed %d times, want 5", frees)
	}
}

// TestReleaserAgain: the releaser comes again while a release returns
// much, and stops once one returns little.
func TestReleaserAgain(t *testing.T) {
	held := int64(40 << 20)
	now := time.Unix(0, 0)
	returns := []int64{30 << 20, 20 << 20, 5 << 20, 1 << 20}
	frees := 0
	r := NewReleaser(16<<20, time.Second, Gauge{Read: func() int64 { return held }, Bytes: 1})
	r.free = func() int64 { frees++; return returns[frees-1] }
	r.now = func() time.Time { return now }
	r.Sample()
	held = 0
	want := []bool{true, true, true, true, false, false}
	for i, w := range want {
		now = now.Add(time.Second)
		if got := r.Sample(); got != w {
			t.Fatalf("sample %d: released %v, want %v", i, got, w)
		}
	}
}
