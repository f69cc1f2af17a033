package race

import (
	"strings"
	"testing"
)

// HeavyPrefix begins the name of every test that calls Heavy: make test
// finds them by it (HEAVY_PKGS) and runs them without the race detector.
const HeavyPrefix = "TestHeavy"

// Heavy marks a test heavy by design (many thousands of decisions, whose
// concurrency smaller tests cover under the race detector): it is skipped
// under the race detector, which would cost it five to ten times the CPU,
// and make test runs it without. A test that calls it must be named
// TestHeavy...: it fails otherwise, so that none is left out of either run.
func Heavy(t testing.TB) {
	t.Helper()
	if !strings.HasPrefix(t.Name(), HeavyPrefix) {
		t.Fatalf("%s calls race.Heavy but is not named %s...: make test would run it in neither of its runs", t.Name(), HeavyPrefix)
	}
	if Enabled {
		t.Skip("heavy by design: make test runs it without the race detector")
	}
}
