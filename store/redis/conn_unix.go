//go:build darwin || dragonfly || freebsd || netbsd || openbsd || solaris || illumos

package redis

import "syscall"

// peekIdle reports whether the socket fd has nothing to read and is open,
// without reading or waiting.
func peekIdle(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
}
