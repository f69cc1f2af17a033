package race

import (
	"fmt"
	"testing"
)

// fakeT records what Heavy does to a test of a given name.
type fakeT struct {
	testing.TB
	name    string
	fatal   string
	skipped bool
}

func (f *fakeT) Helper()                           {}
func (f *fakeT) Name() string                      { return f.name }
func (f *fakeT) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }
func (f *fakeT) Skip(args ...any)                  { f.skipped = true }

// TestMarksHeavyTests: a heavy test is skipped exactly when the race detector is on,
// and one not named TestHeavy... fails, whichever run it is in.
func TestMarksHeavyTests(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"TestHeavyFlood", true},
		{"TestHeavyFlood/subtest", true},
		{"TestFlood", false},
		{"TestFloodHeavy", false},
		{"TestheavyFlood", false},
	} {
		f := &fakeT{name: c.name}
		Heavy(f)
		if got := f.fatal == ""; got != c.ok {
			t.Errorf("%s: passed the name check = %v, want %v (%q)", c.name, got, c.ok, f.fatal)
		}
		if c.ok && f.skipped != Enabled {
			t.Errorf("%s: skipped = %v with the race detector on = %v", c.name, f.skipped, Enabled)
		}
	}
}
