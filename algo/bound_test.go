package algo

import (
	"strconv"
	"testing"
	"time"
)

// TestFullMemoryNeverHandsOutFreshQuota: a client that floods a full store
// with new keys neither resets its own exhausted state nor evicts anyone's
// live state: new keys are refused, denied as limited, and counted, until
// states are back to full quota.
func TestFullMemoryNeverHandsOutFreshQuota(t *testing.T) {
	for _, a := range Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			clock := newFakeClock(epoch)
			const max = 2000
			m := NewMemory(MemoryOptions{MaxKeys: max, Clock: clock.Now, SweepInterval: -1})
			defer m.Close()
			login := mustPolicy(t, Spec{Name: "login", Algorithm: a, Limit: 3, Window: 10 * time.Minute})
			other := mustPolicy(t, Spec{Name: "other", Algorithm: FixedWindow, Limit: 100, Window: time.Hour})
			victim := []byte("victim")
			for i := range 3 {
				if res := decideOne(t, m, Request{Policy: login, Key: victim}); !res.Allowed {
					t.Fatalf("login %d denied: %+v", i+1, res)
				}
			}
			refused := 0
			for i := range 3 * max {
				res := decideOne(t, m, Request{Policy: other, Key: []byte("flood-" + strconv.Itoa(i))})
				if !res.Allowed {
					refused++
					if res.Reason != ReasonLimited || res.RetryAfter <= 0 {
						t.Fatalf("refused new key: %+v; want limited with a Retry-After", res)
					}
				}
				if i%500 == 0 {
					clock.Advance(time.Second)
				}
			}
			if got := m.Len(); got > max {
				t.Errorf("Len = %d, above the bound %d", got, max)
			}
			if refused == 0 || m.Refused() != int64(refused) {
				t.Errorf("refused %d new keys, Refused() = %d; want the same, above 0", refused, m.Refused())
			}
			if res := decideOne(t, m, Request{Policy: login, Key: victim}); res.Allowed {
				t.Fatalf("the exhausted login passed again after a flood of %d new keys", 3*max)
			}
			// Once states are back to full quota, new keys take their
			// places.
			clock.Advance(time.Hour)
			if res := decideOne(t, m, Request{Policy: other, Key: []byte("late")}); !res.Allowed {
				t.Errorf("a new key after the flood's states expired was refused: %+v", res)
			}
			if m.Evicted() == 0 {
				t.Errorf("Evicted() = 0 after a new key took an expired state's place")
			}
		})
	}
}
