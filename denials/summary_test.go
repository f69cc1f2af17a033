package denials

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestSummaryExactWhileKeysFit: with no more distinct keys than entries,
// every count is the true count, and the summary says it is exact.
func TestSummaryExactWhileKeysFit(t *testing.T) {
	for _, size := range []int{1, 3, 64} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			s := newSummary(size, maphash.MakeSeed())
			want := map[string]uint64{}
			rng := rand.New(rand.NewPCG(1, uint64(size)))
			for i := 0; i < 5000; i++ {
				k := fmt.Sprintf("k%d", rng.IntN(size))
				s.deny([]byte(k), netip.Addr{}, "p", int64(i))
				want[k]++
			}
			if !s.exact() || s.errBound != 0 {
				t.Fatalf("exact() = %v, errBound = %d; want exact", s.exact(), s.errBound)
			}
			for k, n := range want {
				i := s.find([]byte(k))
				if i < 0 {
					t.Fatalf("find(%q) = -1", k)
				}
				if got := s.entries[i].denied; got != n {
					t.Errorf("denied(%q) = %d, want %d", k, got, n)
				}
			}
		})
	}
}

// TestSummaryBoundsWhenKeysOverflow: past its size, each count is over the
// true count by at most its error, never under, and by at most the
// summary's bound; every key denied more than the bound is kept (the
// Space-Saving guarantee); the index finds every kept key and no other.
func TestSummaryBoundsWhenKeysOverflow(t *testing.T) {
	const size = 32
	s := newSummary(size, maphash.MakeSeed())
	truth := map[string]uint64{}
	rng := rand.New(rand.NewPCG(7, 9))
	for i := 0; i < 200000; i++ {
		// A few heavy keys among many light ones.
		var k string
		if rng.IntN(3) == 0 {
			k = fmt.Sprintf("heavy%d", rng.IntN(5))
		} else {
			k = fmt.Sprintf("light%d", rng.IntN(5000))
		}
		s.deny([]byte(k), netip.Addr{}, "p", int64(i))
		truth[k]++
	}
	if s.exact() || s.errBound == 0 {
		t.Fatalf("exact() = %v, errBound = %d after 5005 distinct keys in 32 entries", s.exact(), s.errBound)
	}
	kept := map[string]bool{}
	for i := 0; i < s.n; i++ {
		e := &s.entries[i]
		k := string(e.key())
		kept[k] = true
		if s.find(e.key()) != i {
			t.Errorf("find(%q) = %d, want %d", k, s.find(e.key()), i)
		}
		if e.denied < truth[k] || e.denied-e.err > truth[k] {
			t.Errorf("%q: denied %d err %d, true count %d", k, e.denied, e.err, truth[k])
		}
		if e.err > s.errBound {
			t.Errorf("%q: err %d over the bound %d", k, e.err, s.errBound)
		}
	}
	for k, n := range truth {
		if n > s.errBound && !kept[k] {
			t.Errorf("%q denied %d times (bound %d) is not kept", k, n, s.errBound)
		}
		if !kept[k] && s.find([]byte(k)) >= 0 {
			t.Errorf("find(%q) finds a key not kept", k)
		}
	}
	for i := 0; i < 5; i++ {
		if k := fmt.Sprintf("heavy%d", i); !kept[k] {
			t.Errorf("%s is not kept", k)
		}
	}
}

// TestSummaryAdmitsOnlyKeysItHolds: admissions count for keys the summary
// holds, and add nothing else.
func TestSummaryAdmitsOnlyKeysItHolds(t *testing.T) {
	s := newSummary(4, maphash.MakeSeed())
	s.admit([]byte("a"))
	s.deny([]byte("a"), netip.Addr{}, "p", 1)
	s.admit([]byte("a"))
	s.admit([]byte("a"))
	s.admit([]byte("b"))
	if got, want := s.entries[s.find([]byte("a"))].admitted, uint64(2); got != want {
		t.Errorf("admitted(a) = %d, want %d", got, want)
	}
	if s.find([]byte("b")) >= 0 || s.n != 1 {
		t.Errorf("an admission of an unknown key added it: n = %d", s.n)
	}
}
