// Command bench is authlimit's benchmark harness, run by `make bench`.
//
// It starts every system (a null HTTP server, a naive Redis limiter, a
// server making one Redis PING per request, authlimit on its embedded store
// and on Redis, nginx alone, with limit_req, with Lua talking to Redis and
// in front of authlimit, the null server or the naive limiter, and HAProxy
// alone, in front of authlimit with its Lua action, and asking authlimit's
// SPOE agent or one that decides nothing; over gRPC, a null gRPC server,
// envoyproxy/ratelimit and authlimit answering ShouldRateLimit, and
// authlimit answering Check) as separate processes on loopback ports,
// drives each with its own closed-loop HTTP/1.1 or gRPC load generator
// under every workload, alternating the systems
// over several rounds, measures Redis memory per key for each algorithm,
// runs the Go micro-benchmarks and writes the medians to bench/RESULTS.md.
//
//	bench [flags]                  run the benchmark (see -help)
//	bench serve-null  -listen ADDR answer 200 with an empty body
//	bench serve-naive -listen ADDR -redis ADDR -limit N -window D [-deny-status S]
//	                               one EVALSHA (INCR, PEXPIRE) per request
//	bench serve-redis-floor -listen ADDR -redis ADDR
//	                               one PING round trip per request, answer 200
//	bench serve-grpc-null -listen ADDR
//	                               answer ShouldRateLimit OK and Check OK
//	bench serve-spoa-null -listen ADDR
//	                               answer every SPOE NOTIFY with an empty ACK
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run dispatches to a subcommand or runs the benchmark.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "serve-null":
			return serveNull(ctx, args[1:], stderr)
		case "serve-naive":
			return serveNaive(ctx, args[1:], stderr)
		case "serve-redis-floor":
			return serveRedisFloor(ctx, args[1:], stderr)
		case "serve-grpc-null":
			return serveGRPCNull(ctx, args[1:], stderr)
		case "serve-spoa-null":
			return serveSPOANull(ctx, args[1:], stderr)
		}
	}
	opts, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	return benchmark(ctx, opts, stdout, stderr)
}
