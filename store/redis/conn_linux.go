package redis

import (
	"syscall"
	"unsafe"
)

// peekIdle reports whether the socket fd has nothing to read and is open,
// without reading or waiting.
func peekIdle(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
}
