package main

// This file runs nginx, in the set-ups compared: alone, with limit_req,
// with Lua talking to Redis, with the shipped auth_request config and with
// the shipped OpenResty config and Lua module, each in front of authlimit,
// the null server or the naive server.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// indexBody is the static file nginx serves.
const indexBody = "ok\n"

// nginxMain is the nginx.conf around a site: one worker, in the
// foreground, everything under the run's directory, no access log. The
// realip module makes each X-Forwarded-For address of the load a client of
// its own. keepalive_requests is raised so nginx, like the other systems,
// keeps a client connection for the whole run (its default closes it every
// 1000 requests).
const nginxMain = `%[2]sdaemon off;
worker_processes 1;
worker_rlimit_nofile 16384;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 100000000;
    default_type text/plain;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    set_real_ip_from 127.0.0.1;
    real_ip_header X-Forwarded-For;
%[3]s
}
`

// staticServer serves the run's html directory on addr.
func staticServer(dir, addr string) string {
	return fmt.Sprintf(`
server {
    listen %s;
    root %s/html;
}
`, addr, dir)
}

// luaAccess limits in Lua against Redis, speaking RESP over a pooled
// cosocket: INCR the client's key, PEXPIRE it on the first hit, 429 over
// the limit. lua-resty-redis is not packaged in Debian, hence the few
// lines of protocol.
const luaAccess = `
server {
    listen %[1]s;
    root %[2]s/html;
    location / {
        access_by_lua_block {
            local sock = ngx.socket.tcp()
            sock:settimeouts(1000, 1000, 1000)
            local ok, err = sock:connect("127.0.0.1", %[3]s)
            if not ok then
                ngx.log(ngx.ERR, "redis connect: ", err)
                return ngx.exit(500)
            end
            local function call(...)
                local args = { ... }
                local req = { "*", tostring(#args), "\r\n" }
                for _, a in ipairs(args) do
                    a = tostring(a)
                    req[#req + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
                end
                local _, err = sock:send(req)
                if err then
                    return nil, err
                end
                local line, err = sock:receive("*l")
                if not line then
                    return nil, err
                end
                if line:sub(1, 1) ~= ":" then
                    return nil, "unexpected reply " .. line
                end
                return tonumber(line:sub(2))
            end
            local key = "lua:" .. ngx.var.remote_addr
            local n, err = call("INCR", key)
            if n == 1 then
                n, err = call("PEXPIRE", key, %[5]d)
                n = 1
            end
            if err then
                ngx.log(ngx.ERR, "redis: ", err)
                sock:close()
                return ngx.exit(500)
            end
            sock:setkeepalive(10000, 1024)
            if n > %[4]d then
                return ngx.exit(429)
            end
        }
    }
}
`

// limitReqSite uses nginx's own limiter per client address: generous
// enough that each address of the ips workload passes, far below the hot
// client's rate. Denials are logged at info, below error_log's level, as
// the other systems log none either.
const limitReqSite = `
limit_req_zone $binary_remote_addr zone=bench:10m rate=100r/s;
server {
    listen %[1]s;
    root %[2]s/html;
    location / {
        limit_req zone=bench burst=200 nodelay;
        limit_req_status 429;
        limit_req_log_level info;
    }
}
`

func startNginxStatic(ctx context.Context, e *runEnv) (*instance, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return startNginx(ctx, e, addr, staticServer(e.dir, addr), false, nil)
}

func startNginxLimitReq(ctx context.Context, e *runEnv) (*instance, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return startNginx(ctx, e, addr, fmt.Sprintf(limitReqSite, addr, e.dir), false, nil)
}

func startNginxLuaRedis(ctx context.Context, e *runEnv) (*instance, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := strings.Cut(e.redis.addr, ":")
	l := limitFor(e.workload)
	return startNginx(ctx, e, addr, fmt.Sprintf(luaAccess, addr, e.dir, port, l.n, l.ms), true, nil)
}

// startNginxAuthlimit renders nginx/example.conf as e2e/proxies_test.go
// does, replacing its addresses, with authlimit denying 403 as the file
// requires. The protected location serves the static file itself instead of
// proxying to a backend, as the other nginx systems do, so that the ratio to
// nginx alone measures what the rate limit costs and nothing else.
func startNginxAuthlimit(ctx context.Context, e *runEnv) (*instance, error) {
	al, alAddr, err := startAuthlimit(ctx, e, rulesFor(e.workload, false, ""), "AUTHLIMIT_DENY_STATUS=403")
	if err != nil {
		return nil, err
	}
	in, err := startNginxAuth(ctx, e, al, alAddr)
	if err != nil {
		return nil, fmt.Errorf("nginx-authlimit-redis: %w", err)
	}
	in.metrics = []string{"http://" + alAddr + "/metrics"}
	return in, nil
}

// startNginxAuthNull is nginx-authlimit-redis with the null server in
// authlimit's place, answering 200 to every subrequest at once: what the
// auth_request hop costs nginx and an auth server that does nothing, the
// ceiling of any auth server behind the same configuration.
func startNginxAuthNull(ctx context.Context, e *runEnv) (*instance, error) {
	p, addr, err := startNullServer(ctx, e)
	if err != nil {
		return nil, err
	}
	in, err := startNginxAuth(ctx, e, p, addr)
	if err != nil {
		return nil, fmt.Errorf("nginx-auth-null: %w", err)
	}
	return in, nil
}

// startNginxNaive is nginx-authlimit-redis with the naive server in
// authlimit's place: the subrequest carries the client in X-Forwarded-For,
// which the naive server keys by, and the naive server denies 403, as
// auth_request passes no other denial on. What auth_request costs with the
// simplest limiter behind it.
func startNginxNaive(ctx context.Context, e *runEnv) (*instance, error) {
	p, addr, err := startNaiveServer(ctx, e, 403, "go-redis")
	if err != nil {
		return nil, err
	}
	in, err := startNginxAuth(ctx, e, p, addr)
	if err != nil {
		return nil, fmt.Errorf("nginx-naive-redis: %w", err)
	}
	return in, nil
}

// startNginxAuth starts nginx with the shipped configuration in front of
// the auth server auth, listening on authAddr. It stops auth if nginx does
// not start.
func startNginxAuth(ctx context.Context, e *runEnv, auth *proc, authAddr string) (*instance, error) {
	addr, err1 := freeAddr()
	backend, err2 := freeAddr()
	conf, err3 := os.ReadFile(e.o.nginxConf)
	if err := firstError(err1, err2, err3); err != nil {
		auth.stop()
		return nil, err
	}
	site, err := render(string(conf),
		"server authlimit:8080;", "server "+authAddr+";",
		"server backend:80;", "server "+backend+";",
		"listen 8000;", "listen "+addr+";",
		"        proxy_pass http://backend;\n        proxy_set_header Host $host;\n", "        root "+e.dir+"/html;\n        proxy_set_header Host $host;\n")
	if err != nil {
		auth.stop()
		return nil, fmt.Errorf("render %s: %w", e.o.nginxConf, err)
	}
	in, err := startNginx(ctx, e, addr, site, false, auth)
	if err != nil {
		auth.stop()
		return nil, err
	}
	return in, nil
}

// startOpenRestyAuthlimit renders nginx/openresty.conf as
// e2e/proxies_test.go does, with nginx/authlimit.lua copied into the run's
// directory, in front of authlimit (its default 429). As for
// nginx-authlimit-redis, the protected location serves the static file
// itself.
func startOpenRestyAuthlimit(ctx context.Context, e *runEnv) (*instance, error) {
	al, alAddr, err := startAuthlimit(ctx, e, rulesFor(e.workload, false, ""))
	if err != nil {
		return nil, err
	}
	in, err := startOpenResty(ctx, e, al, alAddr)
	if err != nil {
		return nil, fmt.Errorf("openresty-authlimit-redis: %w", err)
	}
	in.metrics = []string{"http://" + alAddr + "/metrics"}
	return in, nil
}

// startOpenRestyAuthNull is openresty-authlimit-redis with the null server
// in authlimit's place: what the Lua module's hop costs by itself.
func startOpenRestyAuthNull(ctx context.Context, e *runEnv) (*instance, error) {
	p, addr, err := startNullServer(ctx, e)
	if err != nil {
		return nil, err
	}
	in, err := startOpenResty(ctx, e, p, addr)
	if err != nil {
		return nil, fmt.Errorf("openresty-auth-null: %w", err)
	}
	return in, nil
}

// startOpenRestyNaive is openresty-authlimit-redis with the naive server
// in authlimit's place: authlimit.lua sends the client in X-Forwarded-For,
// which the naive server keys by, takes its 200 as an admission and relays
// its 429.
func startOpenRestyNaive(ctx context.Context, e *runEnv) (*instance, error) {
	p, addr, err := startNaiveServer(ctx, e, 429, "go-redis")
	if err != nil {
		return nil, err
	}
	in, err := startOpenResty(ctx, e, p, addr)
	if err != nil {
		return nil, fmt.Errorf("openresty-naive-redis: %w", err)
	}
	return in, nil
}

// startOpenResty starts nginx with the shipped OpenResty configuration in
// front of the auth server auth, listening on authAddr. It stops auth if
// nginx does not start.
func startOpenResty(ctx context.Context, e *runEnv, auth *proc, authAddr string) (*instance, error) {
	addr, err1 := freeAddr()
	backend, err2 := freeAddr()
	conf, err3 := os.ReadFile(e.o.restyConf)
	lua, err4 := os.ReadFile(e.o.restyLua)
	if err := firstError(err1, err2, err3, err4); err != nil {
		auth.stop()
		return nil, err
	}
	site, err := renderOpenResty(string(conf), e.dir, authAddr, backend, addr)
	if err == nil {
		err = os.WriteFile(filepath.Join(e.dir, "authlimit.lua"), lua, 0o644)
	}
	if err != nil {
		auth.stop()
		return nil, err
	}
	in, err := startNginx(ctx, e, addr, site, true, auth)
	if err != nil {
		auth.stop()
		return nil, err
	}
	return in, nil
}

// renderOpenResty renders nginx/openresty.conf: authlimit.lua from dir,
// authlimit on authAddr, the static file served in place of the backend.
func renderOpenResty(conf, dir, authAddr, backend, addr string) (string, error) {
	site, err := render(conf,
		`lua_package_path "/etc/nginx/lua/?.lua;;";`, `lua_package_path "`+dir+`/?.lua;;";`,
		`address = "authlimit:8080",`, `address = "`+authAddr+`",`,
		"server backend:80;", "server "+backend+";",
		"listen 8000;", "listen "+addr+";",
		"        proxy_pass http://backend;\n        proxy_set_header Host $host;\n", "        root "+dir+"/html;\n        proxy_set_header Host $host;\n")
	if err != nil {
		return "", fmt.Errorf("render nginx/openresty.conf: %w", err)
	}
	return site, nil
}

// render replaces each old string, which must occur exactly once, so that
// a change to the shipped file the harness no longer understands fails
// loudly.
func render(s string, pairs ...string) (string, error) {
	for i := 0; i+1 < len(pairs); i += 2 {
		if n := strings.Count(s, pairs[i]); n != 1 {
			return "", fmt.Errorf("%q occurs %d times, want once", pairs[i], n)
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	return s, nil
}

// startNginx writes nginx.conf and the static file into the run's
// directory, starts nginx and waits until addr answers. with, if not nil,
// is another server process of the system (authlimit).
func startNginx(ctx context.Context, e *runEnv, addr, site string, lua bool, with *proc) (*instance, error) {
	var head strings.Builder
	if os.Geteuid() == 0 {
		head.WriteString("user root;\n") // workers must read the run's directory
	}
	if lua {
		head.WriteString("load_module /usr/lib/nginx/modules/ndk_http_module.so;\n")
		head.WriteString("load_module " + luaModule + ";\n")
	}
	html := filepath.Join(e.dir, "html")
	conf := filepath.Join(e.dir, "nginx.conf")
	err := firstError(
		os.MkdirAll(html, 0o755),
		os.WriteFile(filepath.Join(html, "index.html"), []byte(indexBody), 0o644),
		os.WriteFile(conf, []byte(fmt.Sprintf(nginxMain, e.dir, head.String(), site)), 0o644),
	)
	if err != nil {
		return nil, fmt.Errorf("write nginx config: %w", err)
	}
	p, err := startProc(e.dir, "nginx", e.o.nginx, []string{"-p", e.dir, "-e", filepath.Join(e.dir, "error.log"), "-c", conf}, nil)
	if err != nil {
		return nil, err
	}
	in, err := proxyInstance(ctx, "nginx", addr, p, with)
	if err != nil {
		return nil, fmt.Errorf("%w\nnginx error.log:\n%s", err, fileTail(filepath.Join(e.dir, "error.log"), 4096))
	}
	return in, nil
}

// firstError is the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// proxyInstance waits until the proxy p answers on addr, and returns it as
// an instance whose proxy CPU is p's and, when with is not nil, whose
// server CPU is that of the server behind it. A proxy that does not get
// ready is stopped.
func proxyInstance(ctx context.Context, name, addr string, p, with *proc) (*instance, error) {
	in := &instance{addr: addr, procs: []*proc{p}, proxyRoots: []int{p.pid()}, denyStatus: 429}
	watch := []*proc{p}
	if with != nil {
		in.serverRoots = []int{with.pid()}
		watch = append(watch, with)
	}
	if err := waitReady(ctx, name, readyTimeout, wantStatus("http://"+addr+"/", 0), watch...); err != nil {
		p.stop()
		return nil, err
	}
	if with != nil {
		in.procs = append(in.procs, with)
	}
	return in, nil
}
