package redis

import (
	"sync"
	"sync/atomic"
)

// freeWorkers holds the workers whose connections are free, the one freed
// last on top. Taking the one freed last keeps calls on as few
// connections as the load needs: at a few thousand decisions a second one
// connection carries them one after another, used again well within
// idleCheck, so that no call looks at it first (a system call each), and
// the others wait unused; a queue would hand each call the connection idle
// the longest, every one of them past idleCheck at such a rate.
type freeWorkers struct {
	mu   sync.Mutex
	ws   []*worker
	n    atomic.Int32  // len(ws), read without the lock
	back chan struct{} // a worker was put back (see takeAll)
}

func newFreeWorkers(n int) *freeWorkers {
	f := &freeWorkers{ws: make([]*worker, 0, n), back: make(chan struct{}, 1)}
	for range n {
		f.put(&worker{})
	}
	return f
}

// take takes the worker freed last, or returns nil if none is free.
func (f *freeWorkers) take() *worker {
	if f.n.Load() == 0 {
		return nil
	}
	f.mu.Lock()
	var w *worker
	if k := len(f.ws); k > 0 {
		w, f.ws[k-1] = f.ws[k-1], nil
		f.ws = f.ws[:k-1]
		f.n.Store(int32(k - 1))
	}
	f.mu.Unlock()
	return w
}

// put frees w.
func (f *freeWorkers) put(w *worker) {
	f.mu.Lock()
	f.ws = append(f.ws, w)
	f.n.Store(int32(len(f.ws)))
	f.mu.Unlock()
	select {
	case f.back <- struct{}{}:
	default:
	}
}

// free reports how many workers are free.
func (f *freeWorkers) free() int { return int(f.n.Load()) }

// takeAll takes n workers, waiting for those in use to be put back.
func (f *freeWorkers) takeAll(n int) []*worker {
	ws := make([]*worker, 0, n)
	for len(ws) < n {
		if w := f.take(); w != nil {
			ws = append(ws, w)
			continue
		}
		<-f.back
	}
	return ws
}
