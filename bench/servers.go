package main

// This file holds the two reference servers the harness runs as separate
// processes: null (the floor of any HTTP answer) and naive (the obvious
// fasthttp + go-redis limiter authlimit should beat or match).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

// naiveScript counts a key and starts its window on the first hit.
// KEYS[1] the counter; ARGV[1] the window in milliseconds; reply: the count.
const naiveScript = `local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
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
// request: 200 up to limit per window, then 429.
func serveNaive(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve-naive", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	addr := fs.String("redis", "127.0.0.1:6379", "Redis address")
	limit := fs.Int64("limit", 100, "requests admitted per window and client")
	window := fs.Duration("window", time.Minute, "window")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *limit < 1 || *window < time.Millisecond {
		return errors.New("serve-naive: -limit must be at least 1 and -window at least 1ms")
	}
	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	script := redis.NewScript(naiveScript)
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
			c.SetStatusCode(fasthttp.StatusTooManyRequests)
		}
	})
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
