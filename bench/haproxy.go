package main

// This file runs HAProxy, in the two set-ups compared: alone, and with the
// shipped haproxy/haproxy.cfg and haproxy/authlimit.lua in front of
// authlimit.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// haproxyAlone answers every request itself, as nginx alone serves its
// static file: one thread (as nginx has one worker), the client address
// taken from the load's X-Forwarded-For as nginx's realip module does.
const haproxyAlone = `global
    nbthread 1

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend www
    bind %[1]s
    http-request set-src hdr(x-forwarded-for) if { src 127.0.0.1 }
    http-request return status 200 content-type text/plain string "ok"
`

func startHAProxyAlone(ctx context.Context, e *runEnv) (*instance, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return startHAProxy(ctx, e, fmt.Sprintf(haproxyAlone, addr), addr, nil)
}

// startHAProxyAuthlimit renders haproxy/haproxy.cfg as e2e/proxies_test.go
// does, replacing its addresses, with authlimit keeping its default 429.
// As in haproxy alone, the frontend answers the request itself instead of
// passing it to a backend, takes the client address from the load's
// X-Forwarded-For and runs one thread, so that the ratio to haproxy alone
// measures what the rate limit costs and nothing else.
func startHAProxyAuthlimit(ctx context.Context, e *runEnv) (*instance, error) {
	al, alAddr, err := startAuthlimit(ctx, e, rulesFor(e.workload, false, ""))
	if err != nil {
		return nil, err
	}
	addr, err1 := freeAddr()
	conf, err2 := os.ReadFile(e.o.haproxyCfg)
	if err := firstError(err1, err2); err != nil {
		al.stop()
		return nil, err
	}
	cfg, err := renderHAProxyAuth(string(conf), filepath.Join(filepath.Dir(e.o.haproxyCfg), "authlimit.lua"), addr, alAddr)
	if err != nil {
		al.stop()
		return nil, fmt.Errorf("render %s: %w", e.o.haproxyCfg, err)
	}
	in, err := startHAProxy(ctx, e, cfg, addr, al)
	if err != nil {
		al.stop()
		return nil, fmt.Errorf("haproxy-authlimit-redis: %w", err)
	}
	in.metrics = []string{"http://" + alAddr + "/metrics"}
	return in, nil
}

// renderHAProxyAuth is the shipped haproxy.cfg (conf) loading lua, serving
// addr and asking authlimit at authAddr, changed as startHAProxyAuthlimit
// says.
func renderHAProxyAuth(conf, lua, addr, authAddr string) (string, error) {
	socket := "abns@authlimit-bench-" + strings.ReplaceAll(addr, ":", "-")
	return render(conf,
		"global\n", "global\n    nbthread 1\n",
		"lua-load /etc/haproxy/authlimit.lua", "lua-load "+lua,
		`set-var proc.authlimit_socket str("abns@authlimit")`, `set-var proc.authlimit_socket str("`+socket+`")`,
		"bind abns@authlimit", "bind "+socket,
		"bind 127.0.0.1:8000", "bind "+addr+"\n    http-request set-src hdr(x-forwarded-for) if { src 127.0.0.1 }",
		"server authlimit 127.0.0.1:8080", "server authlimit "+authAddr,
		"    default_backend app\n", "    http-request return status 200 content-type text/plain string \"ok\"\n")
}

// startHAProxy writes haproxy.cfg into the run's directory, starts haproxy
// in the foreground and waits until addr answers. with, if not nil, is
// another server process of the system (authlimit).
func startHAProxy(ctx context.Context, e *runEnv, cfg, addr string, with *proc) (*instance, error) {
	path := filepath.Join(e.dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("write haproxy config: %w", err)
	}
	p, err := startProc(e.dir, "haproxy", e.o.haproxy, []string{"-db", "-f", path}, nil)
	if err != nil {
		return nil, err
	}
	return proxyInstance(ctx, "haproxy", addr, p, with)
}
