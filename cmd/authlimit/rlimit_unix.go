//go:build unix

package main

import (
	"fmt"
	"syscall"
)

// raiseFDLimit raises the soft limit on open files to the hard limit, so
// that connections are bounded by AUTHLIMIT_MAX_CONNS rather than by a low
// default soft limit, and returns the limit in force (a field of type
// int64 on some systems, uint64 on others).
func raiseFDLimit() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("read the open file limit: %w", err)
	}
	if l.Cur >= l.Max {
		return uint64(l.Cur), nil
	}
	raised := l
	raised.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		return uint64(l.Cur), fmt.Errorf("raise the open file limit from %d to %d: %w", l.Cur, l.Max, err)
	}
	return uint64(raised.Cur), nil
}
