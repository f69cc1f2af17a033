package main

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenUnix: listen on a Unix socket replaces a socket file a
// previous run left, refuses to replace any other file, and the file is
// removed when the listener closes.
func TestListenUnix(t *testing.T) {
	tests := []struct {
		name    string
		before  func(t *testing.T, path string) // what is at path first
		wantErr string                          // "" for a listener
	}{
		{"nothing there", func(*testing.T, string) {}, ""},
		{"a stale socket", func(t *testing.T, path string) {
			l, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			_ = l.Close()
		}, ""},
		{"a regular file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("rules"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "is there and is not a socket"},
		{"a directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}, "is there and is not a socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a.sock")
			tt.before(t, path)
			l, err := listen("unix", path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("listen(unix, %s) = %v, want an error saying %q", path, err, tt.wantErr)
				}
				if _, err := os.Lstat(path); err != nil {
					t.Errorf("the file at %s: %v, want it left alone", path, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("listen(unix, %s): %v", path, err)
			}
			if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
				t.Fatalf("%s after listen: %v, %v, want a socket", path, fi, err)
			}
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatalf("dial the new socket: %v", err)
			}
			_ = c.Close()
			_ = l.Close()
			if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s after Close: %v, want it removed", path, err)
			}
		})
	}
}

// TestListenUnixTakenOver: a listener whose path another listen took over
// (another authlimit started on it) leaves the newer socket file alone
// when it closes.
func TestListenUnixTakenOver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.sock")
	old, err := listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := listen("unix", path)
	if err != nil {
		t.Fatalf("listen again on %s: %v", path, err)
	}
	defer l.Close()
	_ = old.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("after the first listener closed, dial %s: %v, want the second's socket still there", path, err)
	}
	_ = c.Close()
	_ = l.Close()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after the second Close: %v, want it removed", path, err)
	}
}
