package grpcwire

import (
	"context"
	"sync"
	"testing"
	"time"
)

// idleWorkers is how many workers wait for a call.
func (s *Server) idleWorkers() int {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return len(s.idle)
}

// TestWorkers: calls at once start a worker each; once they end, the
// workers wait for the next calls, which reuse them (none is started
// while one is idle); a worker still idle at the second reap after it
// became idle ends, one used in between does not.
func TestWorkers(t *testing.T) {
	s, e, _, addr := testServer(t, Options{})
	s.wmu.Lock()
	s.workerIdle = time.Hour // reap runs when the test says
	s.wmu.Unlock()
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const held = 5
	var wg sync.WaitGroup
	for range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := call(ctx, c, []byte("hold")); err != nil {
				t.Errorf("held call: %v", err)
			}
		}()
	}
	for range held {
		<-e.started
	}
	if n := s.idleWorkers(); n != 0 {
		t.Errorf("%d workers idle while %d calls run, want 0", n, held)
	}
	close(e.release)
	wg.Wait()
	waitUntil(t, "the workers of the held calls idle", func() bool { return s.idleWorkers() == held })

	// Calls one after another reuse the idle workers: none ends or starts.
	for range 20 {
		if _, err := call(ctx, c, []byte("x")); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the worker idle again", func() bool { return s.idleWorkers() >= held })
		if n := s.idleWorkers(); n != held {
			t.Fatalf("%d workers idle after a call, want %d", n, held)
		}
	}
	s.reap()
	if n := s.idleWorkers(); n != held {
		t.Fatalf("%d workers idle after one reap, want %d", n, held)
	}
	// The last worker to become idle runs the next call: it was used
	// since the first reap, so the second ends the others alone.
	if _, err := call(ctx, c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the worker idle again", func() bool { return s.idleWorkers() == held })
	s.reap()
	if n := s.idleWorkers(); n != 1 {
		t.Fatalf("%d workers idle after the second reap, want the 1 used in between", n)
	}
}

// TestWorkersEnd: with no calls, idle workers end on their own.
func TestWorkersEnd(t *testing.T) {
	s, _, _, addr := testServer(t, Options{})
	s.wmu.Lock()
	s.workerIdle = 20 * time.Millisecond
	s.wmu.Unlock()
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := call(ctx, c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the worker idle", func() bool { return s.idleWorkers() == 1 })
	waitUntil(t, "the idle worker ended", func() bool { return s.idleWorkers() == 0 })
	s.wmu.Lock()
	reaping := s.reaping
	s.wmu.Unlock()
	if reaping {
		t.Error("reap still due with no worker idle")
	}
	if _, err := call(ctx, c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a new worker idle", func() bool { return s.idleWorkers() == 1 })
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never came: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
