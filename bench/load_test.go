package main

// Tests of the response parser and the client IPs.

import (
	"bufio"
	"strings"
	"testing"
)

func TestReadResponse(t *testing.T) {
	tests := []struct {
		name        string
		in          string
		wantStatus  int
		wantClosing bool
		wantErr     bool
	}{
		{"empty body", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 200, false, false},
		{"body", "HTTP/1.1 429 Too Many Requests\r\ncontent-length: 5\r\nRetry-After: 1\r\n\r\nhello", 429, false, false},
		{"close", "HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno", 403, true, false},
		{"bare newlines", "HTTP/1.1 200 OK\nContent-Length: 1\n\nx", 200, false, false},
		{"no length", "HTTP/1.1 200 OK\r\n\r\n", 0, false, true},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 0, false, true},
		{"bad status", "HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", 0, false, true},
		{"not http", "SSH-2.0-OpenSSH\r\n", 0, false, true},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, closing, err := readResponse(bufio.NewReader(strings.NewReader(tt.in)))
			if (err != nil) != tt.wantErr {
				t.Fatalf("readResponse error = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if status != tt.wantStatus || closing != tt.wantClosing {
				t.Errorf("readResponse = %d, closing %v; want %d, closing %v", status, closing, tt.wantStatus, tt.wantClosing)
			}
		})
	}
}

func TestReadResponseKeepAlive(t *testing.T) {
	br := bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 429 x\r\nContent-Length: 0\r\n\r\n"))
	for _, want := range []int{200, 429} {
		if got, _, err := readResponse(br); err != nil || got != want {
			t.Fatalf("readResponse = %d, %v; want %d", got, err, want)
		}
	}
}

func TestClientIPs(t *testing.T) {
	ips := clientIPs(maxIPs)
	seen := map[string]bool{hotIP().String(): true}
	for _, ip := range ips {
		if !ip.Is4() || ip.As4()[0] != 198 || ip.As4()[1]&0xfe != 18 {
			t.Fatalf("%s is not in 198.18.0.0/15", ip)
		}
		if seen[ip.String()] {
			t.Fatalf("%s twice (or the hot IP)", ip)
		}
		seen[ip.String()] = true
	}
}

// repeatReader serves the same response forever.
type repeatReader struct {
	data []byte
	off  int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := copy(p, r.data[r.off:])
	r.off = (r.off + n) % len(r.data)
	return n, nil
}

func TestReadResponseDoesNotAllocate(t *testing.T) {
	br := bufio.NewReaderSize(&repeatReader{data: []byte("HTTP/1.1 429 Too Many Requests\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nno\n")}, 4096)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, _, err := readResponse(br); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("readResponse allocates %v times per response, want 0", allocs)
	}
}
