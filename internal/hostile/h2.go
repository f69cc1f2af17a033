package hostile

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// clientPreface opens every HTTP/2 connection.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// CheckPath is the method the gRPC attacks call: ext_authz's Check.
const CheckPath = "/envoy.service.auth.v3.Authorization/Check"

// Tally is what the attacking connections of one attack saw, together.
type Tally struct {
	Dials   atomic.Int64 // connections opened, reconnections included
	Refused atomic.Int64 // connections that failed or were closed before the attack began on them
	Streams atomic.Int64 // streams opened (gRPC) or requests begun (HTTP)
	Frames  atomic.Int64 // frames (or header lines) sent by the attack itself
	Answers atomic.Int64 // streams the server ended with its trailers (gRPC) or answers read (HTTP)
	Resets  atomic.Int64 // RST_STREAM from the server
	Calm    atomic.Int64 // GOAWAY ENHANCE_YOUR_CALM from the server
	GoAways atomic.Int64 // other GOAWAYs from the server
	Closed  atomic.Int64 // connections the server closed (EOF, reset)
}

// Counts is a tally's figures at one moment, for a report or to pass
// between processes.
type Counts struct {
	Dials, Refused, Streams, Frames, Answers, Resets, Calm, GoAways, Closed int64
}

// Counts reads the tally.
func (t *Tally) Counts() Counts {
	return Counts{Dials: t.Dials.Load(), Refused: t.Refused.Load(), Streams: t.Streams.Load(), Frames: t.Frames.Load(),
		Answers: t.Answers.Load(), Resets: t.Resets.Load(), Calm: t.Calm.Load(), GoAways: t.GoAways.Load(), Closed: t.Closed.Load()}
}

// String sums the tally up for a table's outcome cell.
func (t *Tally) String() string { return t.Counts().String() }

// String sums the counts up for a table's outcome cell.
func (c Counts) String() string {
	var parts []string
	for _, f := range []struct {
		name string
		n    int64
	}{
		{"connections", c.Dials}, {"refused at once", c.Refused}, {"streams", c.Streams}, {"frames", c.Frames},
		{"answered", c.Answers}, {"RST_STREAM", c.Resets}, {"GOAWAY ENHANCE_YOUR_CALM", c.Calm},
		{"other GOAWAY", c.GoAways}, {"closed by the server", c.Closed},
	} {
		if f.n > 0 {
			parts = append(parts, f.name+" "+strconv.FormatInt(f.n, 10))
		}
	}
	return strings.Join(parts, ", ")
}

// h2conn is one attacking HTTP/2 connection. Frames are written through
// wfr (under wmu); the reader goroutine, if started, reads the server's,
// acknowledges its SETTINGS, keeps the send windows and counts what came.
type h2conn struct {
	c     net.Conn
	tally *Tally

	wmu sync.Mutex
	bw  *bufio.Writer
	wfr *http2.Framer
	enc *hpack.Encoder
	blk bytes.Buffer

	mu       sync.Mutex
	changed  *sync.Cond // signalled when a window grows, a stream ends or the connection does
	connWin  int64
	initWin  int64
	streams  map[uint32]int64 // open streams' send windows
	ended    bool
	nextID   uint32
	readDone chan struct{}
}

// dialH2 opens a connection, writes the preface and SETTINGS with
// settings, and a WINDOW_UPDATE that opens the connection's receive
// window wide; if read, a goroutine reads the server's frames.
func dialH2(ctx context.Context, addr string, tally *Tally, read bool, settings ...http2.Setting) (*h2conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tally.Dials.Add(1)
	h := &h2conn{c: c, tally: tally, connWin: 65535, initWin: 65535, streams: map[uint32]int64{}, nextID: 1, readDone: make(chan struct{})}
	h.changed = sync.NewCond(&h.mu)
	h.bw = bufio.NewWriterSize(c, 64<<10)
	h.wfr = http2.NewFramer(h.bw, nil)
	h.enc = hpack.NewEncoder(&h.blk)
	_, _ = h.bw.WriteString(clientPreface)
	_ = h.wfr.WriteSettings(settings...)
	_ = h.wfr.WriteWindowUpdate(0, 1<<30)
	if err := h.bw.Flush(); err != nil {
		_ = c.Close()
		return nil, err
	}
	if read {
		go h.read()
	} else {
		close(h.readDone)
	}
	// Closing the connection ends the reader and any wait for a window.
	go func() {
		<-ctx.Done()
		_ = c.Close()
	}()
	return h, nil
}

// read reads the server's frames until the connection ends.
func (h *h2conn) read() {
	defer close(h.readDone)
	fr := http2.NewFramer(nil, bufio.NewReaderSize(h.c, 64<<10))
	fr.SetMaxReadFrameSize(1 << 24)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			h.mu.Lock()
			h.ended = true
			h.changed.Broadcast()
			h.mu.Unlock()
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			h.mu.Lock()
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				for id, w := range h.streams {
					h.streams[id] = w + int64(v) - h.initWin
				}
				h.initWin = int64(v)
				h.changed.Broadcast()
			}
			h.mu.Unlock()
			h.wmu.Lock()
			_ = h.wfr.WriteSettingsAck()
			_ = h.bw.Flush()
			h.wmu.Unlock()
		case *http2.WindowUpdateFrame:
			h.mu.Lock()
			if f.StreamID == 0 {
				h.connWin += int64(f.Increment)
			} else if w, ok := h.streams[f.StreamID]; ok {
				h.streams[f.StreamID] = w + int64(f.Increment)
			}
			h.changed.Broadcast()
			h.mu.Unlock()
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				h.tally.Answers.Add(1)
				h.endStream(f.StreamID)
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				h.tally.Answers.Add(1)
				h.endStream(f.StreamID)
			}
		case *http2.RSTStreamFrame:
			h.tally.Resets.Add(1)
			h.endStream(f.StreamID)
		case *http2.GoAwayFrame:
			if f.ErrCode == http2.ErrCodeEnhanceYourCalm {
				h.tally.Calm.Add(1)
			} else {
				h.tally.GoAways.Add(1)
			}
		}
	}
}

func (h *h2conn) endStream(id uint32) {
	h.mu.Lock()
	delete(h.streams, id)
	h.changed.Broadcast()
	h.mu.Unlock()
}

// open takes the next stream id and counts the stream open.
func (h *h2conn) open() uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := h.nextID
	h.nextID += 2
	h.streams[id] = h.initWin
	h.tally.Streams.Add(1)
	return id
}

// block encodes a request's header block: a Check call, and extra fields.
func (h *h2conn) block(extra ...hpack.HeaderField) []byte {
	h.blk.Reset()
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: CheckPath}, {Name: ":authority", Value: "authlimit"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}} {
		_ = h.enc.WriteField(f)
	}
	for _, f := range extra {
		_ = h.enc.WriteField(f)
	}
	return bytes.Clone(h.blk.Bytes())
}

// write runs fn with the frame writer and flushes.
func (h *h2conn) write(fn func(fr *http2.Framer) error) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	if err := fn(h.wfr); err != nil {
		return err
	}
	return h.bw.Flush()
}

// waitWindow waits until stream id and the connection may send at least
// one byte, and takes up to n of it; 0 once the stream or the connection
// ended, or ctx did.
func (h *h2conn) waitWindow(ctx context.Context, id uint32, n int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		w, open := h.streams[id]
		if !open || h.ended || ctx.Err() != nil {
			return 0
		}
		if m := min(int64(n), w, h.connWin); m > 0 {
			h.streams[id] = w - m
			h.connWin -= m
			return int(m)
		}
		h.changed.Wait()
	}
}

// wait blocks until the connection ends or ctx does.
func (h *h2conn) wait(ctx context.Context) {
	select {
	case <-h.readDone:
	case <-ctx.Done():
	}
}

func (h *h2conn) close() {
	_ = h.c.Close()
	<-h.readDone
	h.mu.Lock()
	h.ended = true
	h.changed.Broadcast()
	h.mu.Unlock()
}

// attackH2 runs attack on conns connections at once until ctx ends:
// whenever the server closes one, another is opened, after a pause that
// grows while connections fail at once (50 ms up to 1 s).
func attackH2(ctx context.Context, addr string, conns int, read bool, settings []http2.Setting, attack func(ctx context.Context, h *h2conn) error) *Tally {
	t := &Tally{}
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pause := 50 * time.Millisecond
			for ctx.Err() == nil {
				h, err := dialH2(ctx, addr, t, read, settings...)
				if err != nil {
					t.Refused.Add(1)
					sleep(ctx, pause)
					pause = min(2*pause, time.Second)
					continue
				}
				began := time.Now()
				_ = attack(ctx, h)
				h.close()
				if ctx.Err() != nil {
					return
				}
				t.Closed.Add(1)
				if time.Since(began) < 100*time.Millisecond {
					sleep(ctx, pause)
					pause = min(2*pause, time.Second)
				} else {
					pause = 50 * time.Millisecond
				}
			}
		}()
	}
	wg.Wait()
	return t
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// errEnded is an attack's end on a connection the server ended.
var errEnded = errors.New("the connection ended")
