package httpconn

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBareLineFeedsAnsweredAtOnce: a request whose header block ends in
// bare line feeds gets 400 at once (before the client's 5 s deadline, where
// it used to wait the 10 s read timeout for a 408); others are served as
// before, on the same connection too.
func TestBareLineFeedsAnsweredAtOnce(t *testing.T) {
	l := testServer(t, loopback(t), longTimeouts, ok)
	type step struct {
		send string
		want int // status of the answer to read; 0 reads none
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"bare LF", []step{{"GET /auth HTTP/1.1\nHost: x\n\n", 400}}},
		{"bare LF, HTTP/1.0", []step{{"GET /auth HTTP/1.0\n\n", 400}}},
		{"bare LF, empty lines first", []step{{"\r\n\nGET /auth HTTP/1.1\nHost: x\n\n", 400}}},
		{"CRLF lines, a bare LF blank line", []step{{"GET /auth HTTP/1.1\r\nHost: x\r\n\n", 400}}},
		{"a bare LF line, then a CRLF blank line", []step{{"GET /auth HTTP/1.1\r\nHost: x\n\r\n", 400}}},
		{"bare LF in pieces", []step{{"GET /auth HTTP/1.1\nHo", 0}, {"st: x\n", 0}, {"\n", 400}}},
		{"bare LF after a request on the connection", []step{{request, 200}, {"GET /auth HTTP/1.1\nHost: x\n\n", 400}}},
		{"CRLF", []step{{request, 200}, {request, 200}}},
		{"CRLF, HTTP/1.0 without headers", []step{{"GET /auth HTTP/1.0\r\n\r\n", 200}}},
		{"CRLF after a bare LF request line, no headers", []step{{"GET /auth HTTP/1.0\n\r\n", 200}}},
		{"CRLF, a bare LF line inside", []step{{"GET /auth HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n", 200}}},
		{"CRLF in pieces", []step{{"GET /auth HTTP/1.1\r", 0}, {"\nHost: x\r\n\r", 0}, {"\n", 200}}},
		{"pipelined", []step{{request + request, 200}, {"", 200}}},
		{"a body with empty lines", []step{{"POST /auth HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\na\n\nb\n\n", 200}, {request, 200}}},
		{"a body after 100 Continue", []step{{"POST /auth HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 18\r\n\r\n", 100}, {"GET / HTTP/1.1\n\n\n\n", 200}, {request, 200}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, l)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			for i, st := range tc.steps {
				if _, err := io.WriteString(c, st.send); err != nil {
					t.Fatal(err)
				}
				if st.want == 0 {
					continue
				}
				r, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("step %d: no answer to %q: %v", i+1, st.send, err)
				}
				body, _ := io.ReadAll(r.Body)
				if r.StatusCode != st.want {
					t.Fatalf("step %d: %q answered %d %q, want %d", i+1, st.send, r.StatusCode, body, st.want)
				}
				if st.want == 400 && !r.Close {
					t.Errorf("step %d: a 400 that keeps the connection open", i+1)
				}
			}
		})
	}
}

// TestHeaderEndInPieces: however a header block is split across reads,
// Conn comes to the same verdict as on the whole.
func TestHeaderEndInPieces(t *testing.T) {
	tests := []struct {
		req    string
		bareLF bool
	}{
		{"GET /auth HTTP/1.1\nHost: x\n\n", true},
		{"\r\nGET / HTTP/1.0\n\n", true},
		{"GET /auth HTTP/1.1\r\nHost: x\n\r\n", true},
		{"GET /auth HTTP/1.1\r\nHost: x\r\n\n", true},
		{"GET /auth HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"GET /auth HTTP/1.1\r\nHost: x\nA: b\r\n\r\n", false},
		{"GET / HTTP/1.0\n\r\n", false},
		{"GET / HTTP/1.0\r\n\r\n", false},
		{"\n\r\nGET / HTTP/1.0\r\n\r\n", false},
		{"BROKEN\n\n", false},       // no request line: fasthttp refuses it itself
		{"a body\n\nmore\n", false}, // likewise
	}
	for _, tc := range tests {
		for cut := 0; cut <= len(tc.req); cut++ {
			c := &Conn{l: New(nil, Config{MaxHeader: 4096}), scanning: true}
			got, _ := c.bareLF([]byte(tc.req[:cut]))
			if !got && c.scanning {
				got, _ = c.bareLF([]byte(tc.req[cut:]))
			}
			if got != tc.bareLF {
				t.Errorf("%q read as %q then %q: bare LF %v, want %v", tc.req, tc.req[:cut], tc.req[cut:], got, tc.bareLF)
			}
		}
	}
	// Beyond the largest header block, fasthttp answers 431 itself.
	c := &Conn{l: &Listener{cfg: Config{MaxHeader: 64}}, scanning: true}
	if c.bareLF([]byte("GET / HTTP/1.1\r\nX: " + strings.Repeat("y", 100))); c.scanning || c.head != nil {
		t.Errorf("Conn keeps reading a header block beyond MaxHeader: scanning %v, %d bytes kept", c.scanning, len(c.head))
	}
}
