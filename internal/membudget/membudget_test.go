package membudget

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// TestTake walks a budget of 100 bytes through the cases: room, no room
// and no one to evict, room made by evicting the largest holder, and the
// largest holder asking for more.
func TestTake(t *testing.T) {
	b := New(100)
	var evicted []string
	holder := func(name string) *Holder { return b.Holder(func() { evicted = append(evicted, name) }) }
	big, small, legit := holder("big"), holder("small"), holder("legit")
	steps := []struct {
		name    string
		h       *Holder
		n       int64
		want    bool
		evicted string // the holder evicted by this step, if any
	}{
		{"within the budget", big, 60, true, ""},
		{"up to it", small, 40, true, ""},
		{"beyond it, no holder has that much", legit, 70, false, ""},
		{"beyond it: the largest holder makes room", legit, 10, true, "big"},
		{"an evicted holder takes nothing more", big, 1, false, ""},
		{"room again, once the evicted's bytes are not counted", small, 40, true, ""},
		{"the largest asking for more goes itself", small, 20, false, "small"},
	}
	for _, s := range steps {
		before := len(evicted)
		if got := s.h.Take(s.n); got != s.want {
			t.Fatalf("%s: Take(%d) = %v, want %v", s.name, s.n, got, s.want)
		}
		switch {
		case s.evicted != "" && (len(evicted) != before+1 || evicted[before] != s.evicted):
			t.Fatalf("%s: evicted %v, want %s evicted", s.name, evicted[before:], s.evicted)
		case s.evicted == "" && len(evicted) != before:
			t.Fatalf("%s: evicted %v, want none", s.name, evicted[before:])
		}
	}
	if got, want := b.Used(), int64(60+80+10); got != want {
		t.Errorf("Used = %d, want %d (the evicted still hold theirs until they give it back)", got, want)
	}
	big.Give(60)
	small.Close()
	if got, want := b.Used(), int64(10); got != want {
		t.Errorf("Used after the evicted let go = %d, want %d", got, want)
	}
	if got := b.evicting.Load(); got != 0 {
		t.Errorf("bytes still counted as being evicted: %d, want 0", got)
	}
	if !legit.Take(90) {
		t.Error("Take(90) refused with 10 of 100 used")
	}
	if got, want := b.Evictions(), int64(2); got != want {
		t.Errorf("Evictions = %d, want %d", got, want)
	}
	if got, want := b.Refusals(), int64(2); got != want {
		t.Errorf("Refusals = %d, want %d", got, want)
	}
	if got, want := b.Peak(), int64(150); got != want {
		t.Errorf("Peak = %d, want %d", got, want)
	}
}

// TestGiveAfterClose: Close gives back what a holder held; a Give that
// comes later (a handler answering after its connection closed) gives
// nothing twice.
func TestGiveAfterClose(t *testing.T) {
	b := New(100)
	h := b.Holder(func() {})
	if !h.Take(30) || !h.Take(20) {
		t.Fatal("Take refused within the budget")
	}
	h.Give(20)
	h.Close()
	h.Give(30)
	h.Close()
	if got := b.Used(); got != 0 {
		t.Errorf("Used = %d, want 0", got)
	}
	if h.Take(1) {
		t.Error("a closed holder took more")
	}
	if got := b.Used(); got != 0 {
		t.Errorf("Used after a closed holder's Take = %d, want 0", got)
	}
}

// TestNil: a nil budget bounds nothing.
func TestNil(t *testing.T) {
	var b *Budget
	h := b.Holder(func() { t.Error("evicted by a nil budget") })
	if !h.Take(1 << 40) {
		t.Error("a nil budget refused")
	}
	h.Give(1 << 40)
	h.Close()
	if b.Used() != 0 || b.Limit() != 0 || New(0) != nil {
		t.Error("a nil budget reports something")
	}
}

// TestConcurrent: holders taking, giving and closing at once never hold
// more than the budget plus what evicted holders have yet to give back,
// and the accounts end at zero. Each of the 8 goroutines has one holder
// at a time, which may take up to 200 KiB, three times the budget: with
// no bound they would hold 1.6 MiB together; with it, the live holders
// hold at most the budget, and each evicted one at most what it held when
// it was evicted (at most the budget and one take).
func TestConcurrent(t *testing.T) {
	const limit = 1 << 16
	b := New(limit)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				h := b.Holder(func() {})
				var held []int64
				for range 50 {
					if n := r.Int64N(4096) + 1; h.Take(n) {
						held = append(held, n)
					}
					if len(held) > 0 && r.IntN(3) == 0 {
						h.Give(held[0])
						held = held[1:]
					}
				}
				for _, n := range held[:len(held)/2] {
					h.Give(n)
				}
				h.Close()
			}
		}()
	}
	wg.Wait()
	if most := int64(9*limit + 9*4096); b.Peak() > most {
		t.Errorf("peak %d, want at most %d (budget %d)", b.Peak(), most, limit)
	}
	if b.Evictions() == 0 || b.Refusals() == 0 {
		t.Errorf("evictions %d, refusals %d: the test never reached the budget", b.Evictions(), b.Refusals())
	}
	if b.Used() != 0 || b.evicting.Load() != 0 {
		t.Errorf("after every holder closed: used %d, evicting %d; want 0, 0", b.Used(), b.evicting.Load())
	}
	if len(b.holders) != 0 {
		t.Errorf("%d holders left registered", len(b.holders))
	}
}

// TestLargeTakeWaits: while an evicted holder's bytes are not yet given
// back, a small take may have the room they promise, a large one waits.
func TestLargeTakeWaits(t *testing.T) {
	b := New(1 << 20)
	evicted := 0
	big := b.Holder(func() { evicted++ })
	other := b.Holder(func() { t.Error("other evicted") })
	if !big.Take(900 << 10) {
		t.Fatal("Take refused within the budget")
	}
	if !other.Take(200<<10) || evicted != 1 {
		t.Fatalf("a take beyond the budget: evicted %d, want the hoarder evicted and the take granted", evicted)
	}
	if other.Take(SmallTake + 1) {
		t.Error("a large take granted while the evicted still hold their bytes")
	}
	if !other.Take(SmallTake) {
		t.Error("a small take refused the room an eviction promises")
	}
	big.Close()
	if !other.Take(SmallTake + 1) {
		t.Error("a large take refused once the evicted gave their bytes back")
	}
}
