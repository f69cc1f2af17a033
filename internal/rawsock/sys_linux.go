//go:build linux && !race

package rawsock

import (
	"syscall"
	"unsafe"
)

// rawRead reads into b (not empty) with a raw system call.
func rawRead(fd uintptr, b []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(n), e
}

// rawWrite writes b (not empty) with a raw system call.
func rawWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(n), e
}
