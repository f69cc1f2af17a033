package main

// This file holds the reference servers the harness runs as separate
// processes: null (the floor of any HTTP answer), naive (the obvious
// fasthttp + go-redis limiter authlimit should beat or match) and
// redis-floor (the floor of any answer that waits for one Redis round
// trip).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

// naiveScript counts a key and starts its window on the first hit.
// KEYS[1] the counter; ARGV[1] the window in milliseconds; reply: the count.
const naiveScript = `local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n`

// clockScript is naiveScript on Redis's clock: it reads TIME and counts in
// a key per window index, windows aligned to the clock as authlimit's
// are, so that it knows when its window resets, and replicas with skewed
// clocks agree. It is the least a limiter does that answers from Redis's
// clock (authlimit reads TIME for every algorithm): one INCR, one TIME.
// KEYS[1] the client's key; ARGV[1] the window in milliseconds; reply: the
// count.
const clockScript = `local t = redis.call('TIME')
local w = math.floor((t[1] * 1000 + math.floor(t[2] / 1000)) / ARGV[1])
local k = KEYS[1] .. ':' .. w
local n = redis.call('INCR', k)
if n == 1 then redis.call('PEXPIRE', k, ARGV[1]) end
return n`

// serveNull answers every request 200 with an empty body.
func serveNull(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve-null", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return serve(ctx, *listen, func(c *fasthttp.RequestCtx) { c.SetStatusCode(fasthttp.StatusOK) })
}

// serveNaive limits by the X-Forwarded-For value with one EVALSHA per
// request: 200 up to limit per window, then the deny status (429, or 403
// behind nginx's auth_request, which passes no other denial on). With
// -client raw the EVALSHA is written and its reply read on redis-floor's
// pooled connections instead of through go-redis: the least a limiter
// with one atomic Redis call per decision costs. With -clock it runs
// clockScript instead of naiveScript.
func serveNaive(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve-naive", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	addr := fs.String("redis", "127.0.0.1:6379", "Redis address")
	limit := fs.Int64("limit", 100, "requests admitted per window and client")
	window := fs.Duration("window", time.Minute, "window")
	denyStatus := fs.Int("deny-status", fasthttp.StatusTooManyRequests, "status of a denial, 400-499")
	clientKind := fs.String("client", "go-redis", "Redis client: go-redis, or raw (RESP on pooled connections of its own)")
	clock := fs.Bool("clock", false, "read Redis TIME and count in a key per window index (windows aligned to Redis's clock)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var errs []error
	if *clientKind != "go-redis" && *clientKind != "raw" {
		errs = append(errs, fmt.Errorf("-client %q must be go-redis or raw", *clientKind))
	}
	if *limit < 1 {
		errs = append(errs, fmt.Errorf("-limit %d must be at least 1", *limit))
	}
	if *window < time.Millisecond {
		errs = append(errs, fmt.Errorf("-window %v must be at least 1ms", *window))
	}
	if *denyStatus < 400 || *denyStatus > 499 {
		errs = append(errs, fmt.Errorf("-deny-status %d must be from 400 to 499", *denyStatus))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("serve-naive: %w", err)
	}
	src := naiveScript
	if *clock {
		src = clockScript
	}
	if *clientKind == "raw" {
		return serveNaiveRaw(ctx, *listen, *addr, src, *limit, window.Milliseconds(), *denyStatus)
	}
	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	script := redis.NewScript(src)
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := script.Load(lctx, client).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("load naive script: %w", err)
	}
	windowMS := window.Milliseconds()
	return serve(ctx, *listen, func(c *fasthttp.RequestCtx) {
		if string(c.Path()) == "/healthz" {
			return
		}
		key := "naive:" + string(c.Request.Header.Peek("X-Forwarded-For"))
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n, err := script.Run(rctx, client, []string{key}, windowMS).Int64()
		cancel()
		switch {
		case err != nil:
			c.SetStatusCode(fasthttp.StatusInternalServerError)
		case n > *limit:
			c.SetStatusCode(*denyStatus)
		}
	})
}

// serveNaiveRaw is serveNaive over rawPool: the script src is loaded
// once, then each request writes one EVALSHA and reads its integer reply.
func serveNaiveRaw(ctx context.Context, listen, addr, src string, limit, windowMS int64, denyStatus int) error {
	pool := &pingPool{addr: addr, timeout: time.Second}
	defer pool.close()
	c, err := pool.get()
	if err != nil {
		return fmt.Errorf("serve-naive: %w", err)
	}
	line, err := c.do(pool.timeout, respCommand(nil, "SCRIPT", "LOAD", src))
	if err != nil || len(line) < 2 || line[0] != '$' {
		_ = c.conn.Close()
		return fmt.Errorf("serve-naive: load naive script: reply %q, %v", line, err)
	}
	sha, err := c.rw.ReadSlice('\n')
	if err != nil || len(sha) != 42 {
		_ = c.conn.Close()
		return fmt.Errorf("serve-naive: load naive script: digest %q, %v", sha, err)
	}
	digest := string(sha[:40])
	pool.put(c)
	window := strconv.FormatInt(windowMS, 10)
	return serve(ctx, listen, func(rc *fasthttp.RequestCtx) {
		if string(rc.Path()) == "/healthz" {
			return
		}
		key := "naive:" + string(rc.Request.Header.Peek("X-Forwarded-For"))
		n, err := pool.evalInt(respCommand(make([]byte, 0, 128), "EVALSHA", digest, "1", key, window))
		switch {
		case err != nil:
			rc.SetStatusCode(fasthttp.StatusInternalServerError)
		case n > limit:
			rc.SetStatusCode(denyStatus)
		}
	})
}

// respCommand appends args as a RESP array of bulk strings to b.
func respCommand(b []byte, args ...string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, "\r\n"...)
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, "\r\n"...)
		b = append(b, a...)
		b = append(b, "\r\n"...)
	}
	return b
}

// evalInt makes one round trip of req on a pooled connection and parses
// an integer reply. A connection that failed, or answered anything else,
// is closed, never reused.
func (p *pingPool) evalInt(req []byte) (int64, error) {
	c, err := p.get()
	if err != nil {
		return 0, err
	}
	line, err := c.do(p.timeout, req)
	if err == nil && (len(line) < 3 || line[0] != ':') {
		err = fmt.Errorf("reply %q, want an integer", bytes.TrimRight(line, "\r\n"))
	}
	var n int64
	if err == nil {
		n, err = strconv.ParseInt(string(line[1:len(line)-2]), 10, 64)
	}
	if err != nil {
		_ = c.conn.Close()
		return 0, fmt.Errorf("redis %s: %w", p.addr, err)
	}
	p.put(c)
	return n, nil
}

// pingRequest is PING in RESP.
const pingRequest = "*1\r\n$4\r\nPING\r\n"

// serveRedisFloor answers every request 200 after one PING round trip to
// Redis, limiting nothing: the least any handler that asks Redis once per
// decision must do. No client library stands between: the request is
// written and the reply read on a pooled connection of the request's own,
// never pipelined with another request's.
func serveRedisFloor(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve-redis-floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	addr := fs.String("redis", "127.0.0.1:6379", "Redis address")
	timeout := fs.Duration("timeout", time.Second, "deadline of each round trip, the dial included")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *timeout <= 0 {
		return fmt.Errorf("serve-redis-floor: -timeout %v must be positive", *timeout)
	}
	pool := &pingPool{addr: *addr, timeout: *timeout}
	defer pool.close()
	if err := pool.ping(); err != nil {
		return fmt.Errorf("serve-redis-floor: %w", err)
	}
	return serve(ctx, *listen, func(c *fasthttp.RequestCtx) {
		if string(c.Path()) == "/healthz" {
			return
		}
		if err := pool.ping(); err != nil {
			c.SetStatusCode(fasthttp.StatusInternalServerError)
		}
	})
}

// pingPool keeps idle Redis connections: a request takes one (or dials a
// new one if none is idle), so there are as many connections as requests
// ever were in flight at once, and each carries one request at a time.
type pingPool struct {
	addr    string
	timeout time.Duration

	mu     sync.Mutex
	idle   []*pingConn
	closed bool
}

// pingConn is one connection to Redis with its buffers.
type pingConn struct {
	conn net.Conn
	rw   *bufio.ReadWriter
}

// ping makes one PING round trip on a connection of its own. A connection
// that failed, or answered anything but +PONG, is closed, never reused.
func (p *pingPool) ping() error {
	c, err := p.get()
	if err != nil {
		return err
	}
	if err := c.ping(p.timeout); err != nil {
		_ = c.conn.Close()
		return fmt.Errorf("redis %s: %w", p.addr, err)
	}
	p.put(c)
	return nil
}

// get takes an idle connection or dials one.
func (p *pingPool) get() (*pingConn, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	conn, err := net.DialTimeout("tcp", p.addr, p.timeout)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	return &pingConn{conn: conn, rw: bufio.NewReadWriter(bufio.NewReader(conn), bufio.NewWriter(conn))}, nil
}

// put returns a connection to the idle ones, or closes it once the pool
// is closed.
func (p *pingPool) put(c *pingConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.conn.Close()
		return
	}
	p.idle = append(p.idle, c)
}

// close closes the idle connections, and those put back later.
func (p *pingPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.idle {
		_ = c.conn.Close()
	}
	p.idle = nil
}

// ping writes PING and reads its reply, within timeout.
func (c *pingConn) ping(timeout time.Duration) error {
	line, err := c.do(timeout, []byte(pingRequest))
	if err != nil {
		return err
	}
	if !bytes.Equal(line, []byte("+PONG\r\n")) {
		return fmt.Errorf("PING reply %q, want +PONG", bytes.TrimRight(line, "\r\n"))
	}
	return nil
}

// do writes req and reads the first line of its reply, within timeout.
func (c *pingConn) do(timeout time.Duration, req []byte) ([]byte, error) {
	if err := c.conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("set deadline: %w", err)
	}
	if _, err := c.rw.Write(req); err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	if err := c.rw.Flush(); err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	line, err := c.rw.ReadSlice('\n')
	if err != nil {
		return nil, fmt.Errorf("read reply: %w", err)
	}
	return line, nil
}

// serve runs a fasthttp server on listen until ctx ends.
func serve(ctx context.Context, listen string, h fasthttp.RequestHandler) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	s := &fasthttp.Server{Handler: h, NoDefaultServerHeader: true, NoDefaultContentType: true}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	return s.Shutdown()
}
