// Command authlimit is a rate limiter for a proxy's auth subrequests (nginx
// auth_request, OpenResty, Traefik forwardAuth, Caddy forward_auth). It is
// configured by AUTHLIMIT_* environment variables; see README.md.
//
//	authlimit              serve
//	authlimit -check       validate the environment and print the configuration
//	authlimit -healthcheck ask a running authlimit's /healthz (for container health checks)
//	authlimit -version     print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a mistake in the command line or the environment: exit 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// run is the whole program: it returns when ctx ends (after a graceful
// shutdown) or when serving fails.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("authlimit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	check := fs.Bool("check", false, "validate the environment, print the effective configuration and exit")
	showVersion := fs.Bool("version", false, "print the version and exit")
	health := fs.Bool("healthcheck", false, "ask the authlimit serving on AUTHLIMIT_LISTEN for /healthz; exit 0 if it answers 200")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *showVersion {
		fmt.Fprintln(stdout, "authlimit", version)
		return nil
	}
	s, err := loadConfig(envMap(environ))
	if err != nil {
		return usageError{fmt.Errorf("configuration:\n%s", indent(err.Error()))}
	}
	fdLimit, fdErr := raiseFDLimit()
	s.limitConns(fdLimit)
	if *check {
		fmt.Fprint(stdout, s.describe())
		return nil
	}
	if *health {
		return healthcheck(s)
	}

	log := newLogger(s, stderr)
	setRuntimeLimit(envMap(environ), log)
	if fdErr != nil {
		log.Warn("could not raise the open file limit", "err", fdErr, "limit", fdLimit)
	}
	if s.MaxConns > 0 && fdLimit > 0 && uint64(s.MaxConns) > fdLimit {
		log.Warn("AUTHLIMIT_MAX_CONNS is above the open file limit: beyond the limit, accepts fail and wait instead of closing new connections at once", "max_conns", s.MaxConns, "open_file_limit", fdLimit)
	}
	a, err := newApp(ctx, s, log)
	if err != nil {
		return err
	}
	defer a.close()
	if err := a.reload.watch(ctx); err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				a.reload.reload("SIGHUP")
			}
		}
	}()

	l, err := listen(s.listenNetwork, s.listenAddress)
	if err != nil {
		return fmt.Errorf("listen on AUTHLIMIT_LISTEN %s: %w", s.Listen, err)
	}
	log.Info("authlimit serving", "version", version, "listen", l.Addr().String(), "store", s.redisDisplay, "rules", len(s.rules), "max_conns", s.maxConns, "open_file_limit", fdLimit)
	if s.PprofListen != "" {
		stopPprof, err := servePprof(s.PprofListen, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}

	return a.serve(ctx, a.listener(l, s), s.ShutdownTimeout)
}

// healthcheck asks the local authlimit's /healthz, over the address it
// listens on, with the loopback address for an unspecified host.
func healthcheck(s *settings) error {
	network, addr := s.listenNetwork, s.listenAddress
	if network == "tcp" {
		host, port, _ := net.SplitHostPort(addr)
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		addr = net.JoinHostPort(host, port)
	}
	c := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return net.DialTimeout(network, addr, 2*time.Second) }}
	status, body, err := c.GetTimeout(nil, "http://authlimit/healthz", 2*time.Second)
	if err != nil {
		return fmt.Errorf("healthcheck %s: %w", addr, err)
	}
	if status != fasthttp.StatusOK {
		return fmt.Errorf("healthcheck %s: %d %s", addr, status, body)
	}
	return nil
}

func newLogger(s *settings, w io.Writer) *slog.Logger {
	o := &slog.HandlerOptions{Level: s.logLevel}
	if s.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, o))
	}
	return slog.New(slog.NewJSONHandler(w, o))
}

// envMap turns KEY=value pairs into a map.
func envMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}
