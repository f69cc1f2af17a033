package grpcwire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// FuzzConn feeds arbitrary bytes after the preface and SETTINGS: the
// server never panics nor hangs; once the client closes its side, the
// server closes the connection, having answered or not.
func FuzzConn(f *testing.F) {
	var seed bytes.Buffer
	fr := http2.NewFramer(&seed, nil)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	h := grpcHeaders(echoPath)
	for i := 0; i+1 < len(h); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: h[i], Value: h[i+1]})
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})
	msg := []byte{0, 0, 0, 0, 4, 10, 2, 'h', 'i'}
	_ = fr.WriteData(1, true, msg)
	call := bytes.Clone(seed.Bytes())
	f.Add(call)
	seed.Reset()
	_ = fr.WritePing(false, [8]byte{1})
	_ = fr.WriteWindowUpdate(0, 100)
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	f.Add(append(bytes.Clone(seed.Bytes()), call...))
	seed.Reset()
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes()[:4]})
	_ = fr.WriteContinuation(1, true, block.Bytes()[4:])
	_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
	f.Add(bytes.Clone(seed.Bytes()))
	f.Add([]byte{0, 0, 0, 0xff, 0xff, 0, 0, 0, 1})
	f.Add(bytes.Repeat([]byte{0}, 100))

	s := NewServer(Options{MaxConcurrentStreams: 4, PrefaceTimeout: time.Second, IdleTimeout: time.Second, WriteTimeout: time.Second})
	e := &echo{started: make(chan string, 1<<20), ended: make(chan error, 1<<20), release: make(chan struct{})}
	close(e.release)
	if err := Unary(s, echoPath, e.Echo); err != nil {
		f.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	f.Cleanup(s.Stop)
	addr := l.Addr().String()

	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var pre bytes.Buffer
		pre.WriteString(clientPreface)
		_ = http2.NewFramer(&pre, nil).WriteSettings()
		// The server may close before all is written.
		_, _ = c.Write(append(pre.Bytes(), b...))
		_ = c.(*net.TCPConn).CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err = io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the server kept the connection open 20s after the client's end")
		}
	})
}
