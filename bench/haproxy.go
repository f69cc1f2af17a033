package main

// This file runs HAProxy, in the set-ups compared: alone; with the shipped
// haproxy/haproxy-lua.cfg and haproxy/authlimit.lua in front of authlimit;
// and with the shipped haproxy/haproxy.cfg and haproxy/spoe-authlimit.conf
// asking authlimit's SPOE agent (over TCP or a Unix socket), or an agent
// that decides nothing.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/authlimit/authlimit/front/spoa"
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

// startHAProxyAuthlimit renders haproxy/haproxy-lua.cfg as
// e2e/proxies_test.go does, replacing its addresses, with authlimit keeping its default 429.
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

// renderHAProxyAuth is the shipped haproxy-lua.cfg (conf) loading lua, serving
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

// startHAProxySPOEAuthlimit renders haproxy/haproxy.cfg and the
// spoe-authlimit.conf beside it as e2e/proxies_test.go does, asking
// authlimit's SPOE agent (AUTHLIMIT_SPOA_LISTEN), changed as
// startHAProxyAuthlimit changes the Lua set-up: one thread, the client
// address from the load's X-Forwarded-For, allowed requests answered by
// the frontend itself.
func startHAProxySPOEAuthlimit(ctx context.Context, e *runEnv) (*instance, error) {
	agent, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return haproxySPOEAuthlimit(ctx, e, "haproxy-spoe-authlimit-redis", agent, agent)
}

// startHAProxySPOEUnixAuthlimit is haproxy-spoe-authlimit-redis with the
// agent on a Unix socket in the run's directory
// (AUTHLIMIT_SPOA_LISTEN=unix:<path>, HAProxy's server unix@<path>).
func startHAProxySPOEUnixAuthlimit(ctx context.Context, e *runEnv) (*instance, error) {
	sock := filepath.Join(e.dir, "spoa.sock")
	return haproxySPOEAuthlimit(ctx, e, "haproxy-spoe-unix-authlimit-redis", "unix:"+sock, "unix@"+sock)
}

// haproxySPOEAuthlimit starts authlimit with its agent on listen and
// HAProxy asking it at server, the same place as HAProxy names it.
func haproxySPOEAuthlimit(ctx context.Context, e *runEnv, name, listen, server string) (*instance, error) {
	al, alAddr, err := startAuthlimit(ctx, e, rulesFor(e.workload, false, ""), "AUTHLIMIT_SPOA_LISTEN="+listen)
	if err != nil {
		return nil, err
	}
	in, err := startHAProxySPOE(ctx, e, server, al)
	if err != nil {
		al.stop()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	in.metrics = []string{"http://" + alAddr + "/metrics"}
	return in, nil
}

// startHAProxySPOENull is haproxy-spoe-authlimit-redis with `bench
// serve-spoa-null` in authlimit's place: an agent answering every NOTIFY
// with an empty ACK, deciding nothing, so that HAProxy admits every
// request: the SPOE hop alone, the ceiling of any agent behind it.
func startHAProxySPOENull(ctx context.Context, e *runEnv) (*instance, error) {
	agent, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := startProc(e.dir, "spoa-null", e.o.selfBinary, []string{"serve-spoa-null", "-listen", agent}, nil)
	if err != nil {
		return nil, err
	}
	in, err := startHAProxySPOE(ctx, e, agent, p)
	if err != nil {
		p.stop()
		return nil, fmt.Errorf("haproxy-spoe-null: %w", err)
	}
	return in, nil
}

// startHAProxySPOE renders the shipped SPOE set-up for the agent at
// agent and starts HAProxy; with is the agent's process.
func startHAProxySPOE(ctx context.Context, e *runEnv, agent string, with *proc) (*instance, error) {
	addr, err1 := freeAddr()
	conf, err2 := os.ReadFile(e.o.haproxySPOE)
	spoe, err3 := os.ReadFile(filepath.Join(filepath.Dir(e.o.haproxySPOE), "spoe-authlimit.conf"))
	if err := firstError(err1, err2, err3); err != nil {
		return nil, err
	}
	spoePath := filepath.Join(e.dir, "spoe-authlimit.conf")
	if err := os.WriteFile(spoePath, spoe, 0o644); err != nil {
		return nil, err
	}
	cfg, err := renderHAProxySPOE(string(conf), spoePath, addr, agent)
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", e.o.haproxySPOE, err)
	}
	return startHAProxy(ctx, e, cfg, addr, with)
}

// renderHAProxySPOE is the shipped haproxy.cfg (conf) naming spoe, serving
// addr and asking the agent at agent, changed as startHAProxySPOEAuthlimit
// says.
func renderHAProxySPOE(conf, spoe, addr, agent string) (string, error) {
	return render(conf,
		"global\n", "global\n    nbthread 1\n",
		"config /etc/haproxy/spoe-authlimit.conf", "config "+spoe,
		"bind 127.0.0.1:8000", "bind "+addr+"\n    http-request set-src hdr(x-forwarded-for) if { src 127.0.0.1 }",
		"server authlimit 127.0.0.1:12345", "server authlimit "+agent,
		"    default_backend app\n", "    http-request return status 200 content-type text/plain string \"ok\"\n")
}

// serveSPOANull answers every NOTIFY frame with an empty ACK, on the
// protocol server authlimit's agent runs on (front/spoa): HAProxy sets no
// variable and admits the request.
func serveSPOANull(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve-spoa-null", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := spoa.NewServer(spoa.Options{Handler: nullAgent{}, Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.Close()
	return nil
}

// nullAgent decides nothing.
type nullAgent struct{}

func (nullAgent) Notify(_ []byte, r spoa.Reply) { r.Send(nil) }
