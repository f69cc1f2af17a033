//go:build (unix && !linux) || (linux && race)

package rawsock

import (
	"errors"
	"syscall"
)

// rawRead reads into b with the system call the syscall package makes:
// elsewhere than on Linux system calls go through the C library, which
// the scheduler must be told of; and under the race detector the
// syscall package's calls tell it that what one goroutine writes to a
// socket happens before another reads it.
func rawRead(fd uintptr, b []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), b)
	return max(n, 0), errno(err)
}

// rawWrite writes b as rawRead reads.
func rawWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), b)
	return max(n, 0), errno(err)
}

// errno is err's system error number; 0 for none.
func errno(err error) syscall.Errno {
	var e syscall.Errno
	if err != nil && !errors.As(err, &e) {
		return syscall.EIO
	}
	return e
}
