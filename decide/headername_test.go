package decide

import (
	"bytes"
	"testing"

	"github.com/authlimit/authlimit/internal/race"
)

// TestHeaderName: every name the engine writes comes back equal and without
// an allocation; any other name comes back equal.
func TestHeaderName(t *testing.T) {
	for _, name := range [][]byte{rateLimitPolicy, rateLimit, xRateLimitLimit, xRateLimitRemaining, xRateLimitReset, retryAfter} {
		if got := HeaderName(name); got != string(name) {
			t.Errorf("HeaderName(%q) = %q", name, got)
		}
		if !race.Enabled {
			if n := testing.AllocsPerRun(100, func() { _ = HeaderName(name) }); n != 0 {
				t.Errorf("HeaderName(%q) allocates %v times", name, n)
			}
		}
	}
	other := bytes.Clone([]byte("X-Other"))
	if got := HeaderName(other); got != "X-Other" {
		t.Errorf("HeaderName(X-Other) = %q", got)
	}
}
