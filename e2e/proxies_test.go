//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// proxy is one way users put authlimit behind a proxy: the shipped file,
// started for real, and what it is documented to do.
type proxy struct {
	name string
	// denyStatus is the AUTHLIMIT_DENY_STATUS the setup needs ("" keeps 429).
	denyStatus string
	// relaysOnAllowed: the rate-limit headers reach the client on allowed
	// responses too (not with Traefik).
	relaysOnAllowed bool
	// authlimitDown is the status a client gets when authlimit is not
	// reachable; closed is the status when authlimit answers 503 (fail
	// mode closed with Redis down).
	authlimitDown, closed int
	// spoe: the proxy asks authlimit's SPOE agent (AUTHLIMIT_SPOA_LISTEN),
	// whose address start is given instead of /auth's.
	spoe bool
	// unix: the SPOE agent listens on a Unix socket
	// (AUTHLIMIT_SPOA_LISTEN=unix:<path>), and start is given its path as
	// HAProxy's server line takes it (unix@<path>).
	unix bool
	// scenarios names the scenarios of TestProxies the proxy runs; nil:
	// every one.
	scenarios []string
	// start runs the proxy in front of authlimit and backend and returns
	// its address. variant selects a documented alternative ("" or
	// "failopen"; for haproxy and haproxy-spoe also "slow", their timeout
	// to authlimit cut to slowTimeout, alone or with "failopen"; for
	// haproxy-spoe also "patient", its timeout raised to patientTimeout).
	start func(t *testing.T, authlimit, backend, variant string) string
}

var proxies = []proxy{
	{name: "nginx", denyStatus: "403", relaysOnAllowed: true, authlimitDown: 500, closed: 500, start: startNginx(false)},
	{name: "openresty", relaysOnAllowed: true, authlimitDown: 503, closed: 503, start: startNginx(true)},
	{name: "caddy", relaysOnAllowed: true, authlimitDown: 502, closed: 503, start: startCaddy},
	{name: "traefik", relaysOnAllowed: false, authlimitDown: 500, closed: 503, start: startTraefik},
	{name: "haproxy", relaysOnAllowed: true, authlimitDown: 503, closed: 503, start: startHAProxy},
	{name: "haproxy-spoe", relaysOnAllowed: true, authlimitDown: 503, closed: 503, spoe: true, start: startHAProxySPOE},
	// haproxy-spoe with the agent on a Unix socket: the same file, its
	// server line naming the socket; what differs is the hop alone.
	{name: "haproxy-spoe-unix", relaysOnAllowed: true, authlimitDown: 503, closed: 503, spoe: true, unix: true, scenarios: []string{"limit holds", "authlimit down"}, start: startHAProxySPOE},
}

// startNginx runs nginx with nginx/example.conf (auth_request) or
// nginx/openresty.conf (Lua), included in a minimal nginx.conf as a user
// would include it in theirs.
func startNginx(lua bool) func(t *testing.T, authlimit, backend, variant string) string {
	return func(t *testing.T, authlimit, backend, variant string) string {
		t.Helper()
		dir := t.TempDir()
		addr := freeAddr(t)
		var site string
		if lua {
			site = openrestySite(t, dir, authlimit, backend, addr)
		} else {
			site = render(t, "nginx/example.conf",
				"server authlimit:8080;", "server "+authlimit+";",
				"server backend:80;", "server "+backend+";",
				"listen 8000;", "listen "+addr+";")
		}
		switch {
		case variant == "failopen" && lua:
			site = render2(t, site, "set $authlimit_unreachable closed;", "set $authlimit_unreachable open;")
		case variant == "failopen":
			if !strings.Contains(site, "#failopen ") {
				t.Fatal("nginx/example.conf has no #failopen lines")
			}
			site = strings.ReplaceAll(site, "#failopen ", "")
		}
		name := "nginx"
		if lua {
			name = "openresty"
		}
		runNginx(t, name, dir, addr, site, lua)
		return addr
	}
}

// openrestySite renders nginx/openresty.conf for authlimit, backend and
// addr, with nginx/authlimit.lua copied into dir, where lua_package_path
// then points, as a user copies both files.
func openrestySite(t *testing.T, dir, authlimit, backend, addr string) string {
	t.Helper()
	writeFile(t, filepath.Join(dir, "authlimit.lua"), string(readRepo(t, "nginx/authlimit.lua")))
	return render(t, "nginx/openresty.conf",
		`lua_package_path "/etc/nginx/lua/?.lua;;";`, `lua_package_path "`+dir+`/?.lua;;";`,
		`address = "authlimit:8080",`, `address = "`+authlimit+`",`,
		"server backend:80;", "server "+backend+";",
		"listen 8000;", "listen "+addr+";")
}

// runNginx starts nginx in dir with site included in a minimal nginx.conf,
// as a user would include it in theirs (with the Lua module if lua), and
// waits until addr answers.
func runNginx(t *testing.T, name, dir, addr, site string, lua bool) {
	t.Helper()
	conf := writeNginxConf(t, dir, site, lua)
	p := start(t, name, bins.nginx, []string{"-p", dir, "-e", filepath.Join(dir, "startup.log"), "-c", conf}, nil, dir)
	waitProxy(t, p, addr, filepath.Join(dir, "error.log"))
}

// writeNginxConf writes site and a minimal nginx.conf including it into
// dir and returns the nginx.conf's path.
func writeNginxConf(t *testing.T, dir, site string, lua bool) string {
	t.Helper()
	writeFile(t, filepath.Join(dir, "site.conf"), site)
	var main strings.Builder
	if os.Geteuid() == 0 {
		main.WriteString("user root;\n") // workers must write the test's temp dirs
	}
	if lua {
		main.WriteString("load_module /usr/lib/nginx/modules/ndk_http_module.so;\n")
		main.WriteString("load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;\n")
	}
	fmt.Fprintf(&main, `daemon off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 1024; }
http {
    access_log %[1]s/access.log;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/site.conf;
}
`, dir)
	conf := filepath.Join(dir, "nginx.conf")
	writeFile(t, conf, main.String())
	return conf
}

func render2(t *testing.T, s, old, new string) string {
	t.Helper()
	if strings.Count(s, old) != 1 {
		t.Fatalf("%q occurs %d times, want once", old, strings.Count(s, old))
	}
	return strings.Replace(s, old, new, 1)
}

// startCaddy runs caddy with caddy/Caddyfile.
func startCaddy(t *testing.T, authlimit, backend, _ string) string {
	t.Helper()
	dir := t.TempDir()
	addr := freeAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	conf := render(t, "caddy/Caddyfile",
		"forward_auth 127.0.0.1:8080 {", "forward_auth "+authlimit+" {",
		"reverse_proxy 127.0.0.1:9000", "reverse_proxy "+backend,
		":8000 {", ":"+port+" {")
	writeFile(t, filepath.Join(dir, "Caddyfile"), conf)
	env := []string{"HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "XDG_DATA_HOME=" + dir, "PATH=" + os.Getenv("PATH")}
	p := start(t, "caddy", bins.caddy, []string{"run", "--config", filepath.Join(dir, "Caddyfile"), "--adapter", "caddyfile"}, env, dir)
	waitProxy(t, p, addr, "")
	return addr
}

// startTraefik runs Traefik with traefik/traefik.yml and traefik/dynamic.yml.
func startTraefik(t *testing.T, authlimit, backend, _ string) string {
	t.Helper()
	dir := t.TempDir()
	addr := freeAddr(t)
	dynamic := filepath.Join(dir, "dynamic.yml")
	writeFile(t, dynamic, render(t, "traefik/dynamic.yml",
		"address: http://127.0.0.1:8080/auth", "address: http://"+authlimit+"/auth",
		"url: http://127.0.0.1:9000", "url: http://"+backend))
	static := filepath.Join(dir, "traefik.yml")
	writeFile(t, static, render(t, "traefik/traefik.yml",
		"address: 127.0.0.1:8000", "address: "+addr,
		"filename: /etc/traefik/dynamic.yml", "filename: "+dynamic))
	p := start(t, "traefik", bins.traefik, []string{"--configFile=" + static}, []string{"HOME=" + dir, "PATH=" + os.Getenv("PATH")}, dir)
	waitProxy(t, p, addr, "")
	return addr
}

// slowTimeout is haproxy-lua.cfg's "timeout server" to authlimit, and
// spoe-authlimit.conf's "timeout processing", in the "slow" variant.
const slowTimeout = 700 * time.Millisecond

// patientTimeout is spoe-authlimit.conf's "timeout processing" in the
// "patient" variant: a test of many clients at once on a loaded machine,
// where a decision may take longer than the shipped 500ms without anything
// being wrong.
const patientTimeout = 5 * time.Second

// startHAProxy runs haproxy with haproxy/haproxy-lua.cfg and the
// haproxy/authlimit.lua it loads. Each instance binds its own abstract
// socket, as two HAProxy instances on one host must.
func startHAProxy(t *testing.T, authlimit, backend, variant string) string {
	t.Helper()
	dir := t.TempDir()
	addr := freeAddr(t)
	socket := "abns@authlimit-" + strings.ReplaceAll(addr, ":", "-")
	pairs := []string{
		"lua-load /etc/haproxy/authlimit.lua", "lua-load " + filepath.Join(bins.repo, "haproxy", "authlimit.lua"),
		`set-var proc.authlimit_socket str("abns@authlimit")`, `set-var proc.authlimit_socket str("` + socket + `")`,
		"bind abns@authlimit", "bind " + socket,
		"bind 127.0.0.1:8000", "bind " + addr,
		"server app 127.0.0.1:9000", "server app " + backend,
		"server authlimit 127.0.0.1:8080", "server authlimit " + authlimit,
	}
	if strings.Contains(variant, "failopen") {
		pairs = append(pairs, `set-var proc.authlimit_unreachable str("closed")`, `set-var proc.authlimit_unreachable str("open")`)
	}
	if strings.Contains(variant, "slow") {
		pairs = append(pairs, "timeout server 2s", fmt.Sprintf("timeout server %dms", slowTimeout.Milliseconds()))
	}
	writeFile(t, filepath.Join(dir, "haproxy.cfg"), render(t, "haproxy/haproxy-lua.cfg", pairs...))
	p := start(t, "haproxy", bins.haproxy, []string{"-db", "-f", filepath.Join(dir, "haproxy.cfg")}, []string{"PATH=" + os.Getenv("PATH")}, dir)
	waitProxy(t, p, addr, "")
	return addr
}

// startHAProxySPOE runs haproxy with haproxy/haproxy.cfg and the
// haproxy/spoe-authlimit.conf it names, asking the SPOE agent at agent
// (host:port, or unix@<path>: the file's commented Unix socket line).
// The variant "check" adds health checks of the agent (option spop-check)
// every 200ms; "smallframe" sets the agent's max-frame-size to 4096;
// "tiers" takes its #tiers lines, with haproxy/plans.map.
func startHAProxySPOE(t *testing.T, agent, backend, variant string) string {
	t.Helper()
	addr, _ := runHAProxySPOE(t, agent, backend, variant)
	return addr
}

// runHAProxySPOE is startHAProxySPOE, returning the process too.
func runHAProxySPOE(t *testing.T, agent, backend, variant string) (string, *proc) {
	t.Helper()
	dir := t.TempDir()
	addr := freeAddr(t)
	spoe := filepath.Join(dir, "spoe-authlimit.conf")
	var spoePairs []string
	if strings.Contains(variant, "slow") {
		spoePairs = append(spoePairs, "timeout processing 500ms", fmt.Sprintf("timeout processing %dms", slowTimeout.Milliseconds()))
	}
	if strings.Contains(variant, "patient") {
		spoePairs = append(spoePairs, "timeout processing 500ms", fmt.Sprintf("timeout processing %dms", patientTimeout.Milliseconds()))
	}
	if strings.Contains(variant, "smallframe") {
		spoePairs = append(spoePairs, "spoe-agent authlimit\n", "spoe-agent authlimit\n    max-frame-size 4096\n")
	}
	writeFile(t, spoe, render(t, "haproxy/spoe-authlimit.conf", spoePairs...))
	pairs := []string{
		"config /etc/haproxy/spoe-authlimit.conf", "config " + spoe,
		"bind 127.0.0.1:8000", "bind " + addr,
		"server app 127.0.0.1:9000", "server app " + backend,
	}
	if strings.Contains(variant, "failopen") {
		pairs = append(pairs, `set-var proc.authlimit_unreachable str("closed")`, `set-var proc.authlimit_unreachable str("open")`)
	}
	if strings.Contains(variant, "tiers") {
		plans := filepath.Join(dir, "plans.map")
		writeFile(t, plans, string(readRepo(t, "haproxy/plans.map")))
		pairs = append(pairs, "#tiers http-request del-header", "http-request del-header",
			"#tiers http-request set-header X-Plan %[req.hdr(X-Api-Key),map(/etc/haproxy/plans.map,)]", "http-request set-header X-Plan %[req.hdr(X-Api-Key),map("+plans+",)]")
	}
	if path, ok := strings.CutPrefix(agent, "unix@"); ok {
		// The file's Unix socket line, uncommented, in the TCP line's place.
		pairs = append(pairs, "    server authlimit 127.0.0.1:12345\n", "",
			"#server authlimit unix@/run/authlimit/spoa.sock", "server authlimit unix@"+path)
	} else {
		pairs = append(pairs, "server authlimit 127.0.0.1:12345", "server authlimit "+agent)
	}
	if strings.Contains(variant, "check") {
		pairs[len(pairs)-1] += " check inter 200ms fall 1 rise 1\n    option spop-check"
	}
	writeFile(t, filepath.Join(dir, "haproxy.cfg"), render(t, "haproxy/haproxy.cfg", pairs...))
	p := start(t, "haproxy-spoe", bins.haproxy, []string{"-db", "-f", filepath.Join(dir, "haproxy.cfg")}, []string{"PATH=" + os.Getenv("PATH")}, dir)
	waitProxy(t, p, addr, "")
	return addr, p
}

// waitProxy waits until the proxy answers through authlimit: any status
// but 404, which Traefik gives before it has loaded its routes. The probe
// comes from a client address no test uses, on a path no test counts.
func waitProxy(t *testing.T, p *proc, addr, errorLog string) {
	t.Helper()
	probe := newClient("127.0.0.254")
	probe.c.Timeout = 2e9
	waitFor(t, p, "answering", func() bool {
		r, err := probe.c.Get("http://" + addr + "/__ready")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode != http.StatusNotFound
	})
	if errorLog != "" {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("--- %s error.log ---\n%s", p.name, tail(errorLog, 30))
			}
		})
	}
}
