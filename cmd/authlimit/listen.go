package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
)

// parseListen reads a listen variable that takes a Unix socket: unix:<path>,
// or else host:port. port and sock are the examples its errors give (":8080",
// "/run/authlimit.sock").
func parseListen(v, port, sock string) (network, address string, err error) {
	if path, ok := strings.CutPrefix(v, "unix:"); ok {
		if path == "" {
			return "", "", fmt.Errorf(`"unix:" needs a socket path, such as unix:%s`, sock)
		}
		return "unix", path, nil
	}
	if err := checkHostPort(v); err != nil {
		return "", "", fmt.Errorf("%q is not host:port or unix:<path> (such as %s, 127.0.0.1%s or unix:%s): %w", v, port, port, sock, err)
	}
	return "tcp", v, nil
}

// listen listens at an address parseListen read. A Unix socket's file is
// made with the process's umask and removed when the listener closes,
// unless another file has taken its path by then (another authlimit
// started on it); a socket file already there (left by a run that did not
// close its listener) is removed first, but any other file is refused,
// not removed.
func listen(network, address string) (net.Listener, error) {
	if network != "unix" {
		return net.Listen(network, address)
	}
	if err := removeStaleSocket(address); err != nil {
		return nil, err
	}
	ul, err := net.ListenUnix(network, &net.UnixAddr{Name: address, Net: network})
	if err != nil {
		return nil, err
	}
	made, err := os.Lstat(address)
	if err != nil {
		_ = ul.Close()
		return nil, fmt.Errorf("the socket just made: %w", err)
	}
	ul.SetUnlinkOnClose(false)
	return &unixListener{UnixListener: ul, path: address, made: made}, nil
}

// unixListener removes its socket file on Close if the file is still the
// one it made.
type unixListener struct {
	*net.UnixListener
	path string
	made os.FileInfo
}

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	if fi, statErr := os.Lstat(l.path); statErr == nil && os.SameFile(fi, l.made) {
		_ = os.Remove(l.path)
	}
	return err
}

// removeStaleSocket removes the socket file at path, if there is one.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		// Nothing there, or nothing that can be looked at: net.Listen
		// says what is wrong, if anything is.
		return nil
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s is there and is not a socket (mode %s): remove it, or choose another path", path, fi.Mode())
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the socket a previous run left: %w", err)
	}
	return nil
}
