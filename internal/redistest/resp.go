package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// The helpers manage servers over short-lived raw RESP2 connections rather
// than go-redis clients: they start no goroutines, keep no pool that would
// show up in OpenConns, and never retry behind the caller's back.

// adminTimeout bounds one admin command, dial included.
const adminTimeout = 2 * time.Second

// respConn is one RESP2 connection for admin commands.
type respConn struct {
	conn net.Conn
	r    *bufio.Reader
}

// respError is an error reply from the server, such as "NOPERM ...".
type respError string

func (e respError) Error() string { return string(e) }

func dialRESP(addr string) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, adminTimeout)
	if err != nil {
		return nil, err
	}
	return &respConn{conn: c, r: bufio.NewReader(c)}, nil
}

func (rc *respConn) close() { _ = rc.conn.Close() }

// do sends one command and reads its reply: a string, an int64, nil, a
// []any, or an error (a respError for an error reply).
func (rc *respConn) do(args ...any) (any, error) {
	_ = rc.conn.SetDeadline(time.Now().Add(adminTimeout))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		s := fmt.Sprint(a)
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(s), s)
	}
	if _, err := io.WriteString(rc.conn, b.String()); err != nil {
		return nil, err
	}
	return rc.read()
}

func (rc *respConn) read() (any, error) {
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, respError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			v, err := rc.read()
			var re respError
			if err != nil && !errors.As(err, &re) {
				return nil, err
			}
			if err != nil {
				v = re
			}
			out[i] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected RESP line %q", line)
}

// command runs one command on a new connection to addr.
func command(addr string, args ...any) (any, error) {
	rc, err := dialRESP(addr)
	if err != nil {
		return nil, err
	}
	defer rc.close()
	return rc.do(args...)
}

// commandString runs one command whose reply is a string.
func commandString(addr string, args ...any) (string, error) {
	v, err := command(addr, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%v: reply %T, want a string", args, v)
	}
	return s, nil
}

// infoField returns one field of INFO <section>, "" when absent.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
