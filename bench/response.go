package main

// This file reads HTTP/1.1 responses for the load generator: the status
// line, the headers and a Content-Length body, without allocating.

import (
	"bufio"
	"bytes"
	"net"
)

// roundTrip writes one request and reads one whole response.
func roundTrip(c net.Conn, br *bufio.Reader, req []byte) (status int, closing bool, err error) {
	if _, err := c.Write(req); err != nil {
		return 0, false, err
	}
	return readResponse(br)
}

// malformedError is a response this client does not accept: anything but a
// status line, headers and a Content-Length body.
type malformedError string

func (e malformedError) Error() string { return string(e) }

const errMalformed = malformedError("malformed response")

// readResponse reads one response without allocating: the status line, the
// headers, and exactly Content-Length bytes of body. closing reports a
// Connection: close from the server.
func readResponse(br *bufio.Reader) (status int, closing bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, false, errMalformed
	}
	for _, d := range line[9:12] {
		if d < '0' || d > '9' {
			return 0, false, errMalformed
		}
		status = status*10 + int(d-'0')
	}
	if status < 100 || status > 599 {
		return 0, false, errMalformed
	}
	length := -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, errMalformed
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, ok = parseLength(value); !ok {
				return 0, false, errMalformed
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0, false, errMalformed
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		}
	}
	if length < 0 {
		return 0, false, errMalformed
	}
	if _, err := br.Discard(length); err != nil {
		return 0, false, err
	}
	return status, closing, nil
}

// parseLength parses a Content-Length value.
func parseLength(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int(d-'0')
	}
	return n, true
}
