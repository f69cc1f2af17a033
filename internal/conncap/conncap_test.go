package conncap

import (
	"sync"
	"testing"
)

// TestCap: at most max places are taken at once, every refusal is
// reported, and a place given back is taken again.
func TestCap(t *testing.T) {
	refused := 0
	c := New(3, func() { refused++ })
	for i := range 3 {
		if !c.Take() {
			t.Fatalf("take %d of 3 refused", i+1)
		}
	}
	if fourth, fifth := c.Take(), c.Take(); fourth || fifth {
		t.Fatal("a 4th connection taken with a cap of 3")
	}
	if refused != 2 {
		t.Errorf("refusals reported: %d, want 2", refused)
	}
	if c.Open() != 3 {
		t.Errorf("open: %d, want 3", c.Open())
	}
	c.Give()
	if !c.Take() {
		t.Error("a place given back is not taken again")
	}
}

// TestNoCap: a max of 0 or less is no cap, and a nil Cap takes everything.
func TestNoCap(t *testing.T) {
	for _, max := range []int{0, -1} {
		c := New(max, func() { t.Error("a refusal without a cap") })
		if c != nil {
			t.Fatalf("New(%d) is a cap", max)
		}
		for range 1000 {
			if !c.Take() {
				t.Fatalf("New(%d) refused a connection", max)
			}
		}
		c.Give()
		if c.Open() != 0 {
			t.Errorf("nil cap open: %d", c.Open())
		}
	}
}

// TestCapConcurrent: listeners taking and giving at once never hold more
// than max places together, and all are free once every connection
// closed.
func TestCapConcurrent(t *testing.T) {
	const limit = 10
	c := New(limit, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	held, most := 0, 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				if !c.Take() {
					continue
				}
				mu.Lock()
				held++
				most = max(most, held)
				mu.Unlock()
				mu.Lock()
				held--
				mu.Unlock()
				c.Give()
			}
		}()
	}
	wg.Wait()
	if most > limit {
		t.Errorf("%d places held at once, cap %d", most, limit)
	}
	if c.Open() != 0 {
		t.Errorf("open after every connection closed: %d", c.Open())
	}
}
