package spoa

import "sync/atomic"

// Budget bounds the bytes held for frames larger than a connection's read
// buffer, across all connections (and, when it is shared, across ports).
// A connection reads such a frame only once the budget grants its size,
// and gives it back once the frame is handled.
type Budget interface {
	// TryTake reserves n bytes and reports whether it could.
	TryTake(n int64) bool
	// Give returns n bytes a TryTake reserved.
	Give(n int64)
}

// DefaultBudget is the bytes a Server's connections may hold at once for
// large frames when Options.Budget is nil: 512 frames of 64 KiB.
const DefaultBudget = 32 << 20

// fixedBudget is a Budget of max bytes.
type fixedBudget struct {
	max  int64
	used atomic.Int64
}

func (b *fixedBudget) TryTake(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *fixedBudget) Give(n int64) { b.used.Add(-n) }
