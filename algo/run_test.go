package algo

import (
	"errors"
	"slices"
	"testing"
)

// flushLog is a Flusher that records its flushes.
type flushLog struct {
	name string
	log  *[]string
}

func (f flushLog) Flush() { *f.log = append(*f.log, f.name) }

// TestRun: End flushes each Defer once, in order, and leaves the run
// empty, for the next run.
func TestRun(t *testing.T) {
	var log []string
	var r Run
	r.End() // an empty run
	r.Defer(flushLog{"a", &log})
	r.Defer(flushLog{"b", &log})
	r.Defer(flushLog{"a", &log})
	if len(log) != 0 {
		t.Fatalf("flushed before the run's end: %v", log)
	}
	r.End()
	if want := []string{"a", "b", "a"}; !slices.Equal(log, want) {
		t.Errorf("flushed %v; want %v", log, want)
	}
	log = log[:0]
	r.Defer(flushLog{"c", &log})
	r.End()
	if want := []string{"c"}; !slices.Equal(log, want) {
		t.Errorf("the next run flushed %v; want %v", log, want)
	}
}

// tellDone records how it was told.
type tellDone struct {
	run      *Run
	alone    bool
	admitted bool
	err      error
}

func (d *tellDone) Decided(admitted bool, err error) {
	d.alone, d.admitted, d.err = true, admitted, err
}

type tellRunDone struct{ tellDone }

func (d *tellRunDone) DecidedIn(run *Run, admitted bool, err error) {
	d.run, d.admitted, d.err = run, admitted, err
}

// TestTell: a RunDone is told within the run; a plain Done, or any Done
// with no run, is told as Decided tells it; the outcome passes either way.
func TestTell(t *testing.T) {
	run := new(Run)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name      string
		d         interface{ got() *tellDone }
		run       *Run
		wantAlone bool
	}{
		{"run done in a run", &tellRunDone{}, run, false},
		{"run done without a run", &tellRunDone{}, nil, true},
		{"plain done in a run", &tellDone{}, run, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			Tell(tc.d.(Done), tc.run, true, boom)
			got := tc.d.got()
			if got.alone != tc.wantAlone {
				t.Errorf("told alone: %v; want %v", got.alone, tc.wantAlone)
			}
			if !tc.wantAlone && got.run != tc.run {
				t.Error("told within another run than the one given")
			}
			if !got.admitted || got.err != boom {
				t.Errorf("told %v, %v; want true, %v", got.admitted, got.err, boom)
			}
		})
	}
}

func (d *tellDone) got() *tellDone { return d }
