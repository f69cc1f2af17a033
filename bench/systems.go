package main

// This file is the catalogue of systems under test: what each one is and
// how it starts for a workload.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// luaModule is the Debian path of the nginx Lua module.
const luaModule = "/usr/lib/nginx/modules/ngx_http_lua_module.so"

// systemNames lists every system in the order of the results tables.
func systemNames() []string {
	return []string{
		"null", "naive", "naive-raw", "naive-clock", "redis-floor", "authlimit-memory", "authlimit-redis-1", "authlimit-redis-fw", "authlimit-redis-3", "authlimit-cluster-1",
		"nginx", "nginx-limit_req", "nginx-lua-redis", "nginx-auth-null", "nginx-naive-redis", "nginx-authlimit-redis",
		"haproxy", "haproxy-authlimit-redis", "haproxy-spoe-null", "haproxy-spoe-authlimit-redis", "haproxy-spoe-unix-authlimit-redis",
		"openresty-auth-null", "openresty-naive-redis", "openresty-authlimit-redis",
		"grpc-null", "envoy-ratelimit", "authlimit-rls", "authlimit-check",
	}
}

// system is one contender.
type system struct {
	name      string
	about     string // one line for the results
	usesRedis bool   // gets a fresh redis-server per run
	cluster   bool   // gets a fresh Redis Cluster per run instead
	nginx     bool   // needs nginx
	lua       bool   // needs nginx's Lua module
	haproxy   bool   // needs haproxy
	path      string // the path the load requests
	start     func(ctx context.Context, e *runEnv) (*instance, error)
	// rpc, for a gRPC system, builds the requests of the gRPC load from
	// the workload's clients; nil for an HTTP system.
	rpc       func(ips []netip.Addr) *rpc
	ratelimit bool // needs envoyproxy/ratelimit's binary
}

// runEnv is what a system starts with.
type runEnv struct {
	o        *options
	dir      string         // a fresh directory for this run
	workload string         // "ips" or "hot"
	redis    *redisServer   // nil unless the system uses Redis
	cluster  []*redisServer // the primaries, if the system uses a Redis Cluster
}

// clusterPrimaries is the size of a cluster system's Redis Cluster.
const clusterPrimaries = 3

// instance is a started system.
type instance struct {
	addr  string  // where the load goes
	procs []*proc // every process started, leaders of their groups
	// proxyRoots are the proxy's processes (nginx, HAProxy) and
	// serverRoots those of the server that decides apart from it
	// (authlimit, envoyproxy/ratelimit, a `bench serve-*` reference
	// server): their CPU is measured apart, each with its descendants.
	proxyRoots  []int
	serverRoots []int
	metrics     []string // authlimit /metrics URLs to check after the run
	denyStatus  int      // the status of a denial, as the client sees it
}

// stop stops every process of the instance.
func (in *instance) stop() {
	for _, p := range in.procs {
		p.stop()
	}
}

// limit is a rule's N per window for a workload: far above the load for
// ips (everything admitted), tiny for hot (nearly everything denied).
type limit struct {
	n      int64
	window string // authlimit's syntax
	ms     int64  // the window in milliseconds
}

func limitFor(workload string) limit {
	if workload == "hot" {
		return limit{n: 10, window: "1h", ms: 3_600_000}
	}
	return limit{n: 1_000_000, window: "1m", ms: 60_000}
}

// rulesFor is authlimit's AUTHLIMIT_RULES with one rule of the given
// algorithm (empty: the default), or three rules on the same key (one round
// trip either way).
func rulesFor(workload string, three bool, algorithm string) string {
	l := limitFor(workload)
	if !three {
		if algorithm != "" {
			return fmt.Sprintf("name=bench key=ip limit=%d/%s algorithm=%s", l.n, l.window, algorithm)
		}
		return fmt.Sprintf("name=bench key=ip limit=%d/%s", l.n, l.window)
	}
	var rules []string
	for _, a := range []string{"sliding_window_counter", "token_bucket", "gcra"} {
		rules = append(rules, fmt.Sprintf("name=%s key=ip limit=%d/%s algorithm=%s", strings.ReplaceAll(a, "_", "-"), l.n, l.window, a))
	}
	return strings.Join(rules, "; ")
}

// nginxPath is the file the nginx systems serve, asked for by name: a
// request for "/" would be redirected internally to the index file, which
// runs the access phase again, so that every request would be limited (and
// ask authlimit or Redis) twice.
const nginxPath = "/index.html"

// catalogue describes every system.
func catalogue() []system {
	return []system{
		{name: "null", about: "fasthttp answering 200 with an empty body (`bench serve-null`)", path: "/auth", start: startNull},
		{name: "naive", about: "fasthttp + go-redis, one EVALSHA (INCR, PEXPIRE on the first hit) per request keyed by X-Forwarded-For (`bench serve-naive`)", usesRedis: true, path: "/auth", start: startNaive},
		{name: "naive-raw", about: "naive's EVALSHA written and read on redis-floor's pooled connections, no go-redis (`bench serve-naive -client raw`): the least a limiter with one atomic Redis call per decision costs", usesRedis: true, path: "/auth", start: startNaiveRaw},
		{name: "naive-clock", about: "naive-raw on Redis's clock: its script also reads Redis `TIME` and counts in a key per window index, windows aligned to the clock as authlimit's are (`bench serve-naive -client raw -clock`): the least a limiter that answers from Redis's clock costs, one `INCR` and one `TIME` in one atomic call per decision, no go-redis", usesRedis: true, path: "/auth", start: startNaiveClock},
		{name: "redis-floor", about: "fasthttp + one Redis round trip per request that limits nothing: a raw RESP `PING` written and read on a pooled connection of the request's own (no go-redis, no pipelining across requests), then 200 (`bench serve-redis-floor`): the floor of any handler making one Redis round trip per decision", usesRedis: true, path: "/auth", start: startRedisFloor},
		{name: "authlimit-memory", about: "authlimit, embedded memory store, 1 rule", path: "/auth", start: authlimitSystem(false)},
		{name: "authlimit-redis-1", about: "authlimit on Redis, 1 rule (sliding_window_counter)", usesRedis: true, path: "/auth", start: authlimitSystem(false)},
		{name: "authlimit-redis-fw", about: "authlimit on Redis, 1 rule (fixed_window, the naive handler's own algorithm)", usesRedis: true, path: "/auth", start: authlimitAlgorithm("fixed_window")},
		{name: "authlimit-redis-3", about: "authlimit on Redis, 3 rules on the same key (sliding_window_counter, token_bucket, gcra)", usesRedis: true, path: "/auth", start: authlimitSystem(true)},
		{name: "authlimit-cluster-1", about: fmt.Sprintf("authlimit on a Redis Cluster of %d primaries (no replicas, sharing the same cores as everything else), 1 rule (sliding_window_counter)", clusterPrimaries), cluster: true, path: "/auth", start: authlimitSystem(false)},
		{name: "nginx", about: "nginx alone serving a small static file", nginx: true, path: nginxPath, start: startNginxStatic},
		{name: "nginx-limit_req", about: "nginx `limit_req` per client address (rate=100r/s burst=200 nodelay) in front of the static file", nginx: true, path: nginxPath, start: startNginxLimitReq},
		{name: "nginx-lua-redis", about: "nginx `access_by_lua_block` speaking RESP to Redis (INCR, PEXPIRE on the first hit; pooled with setkeepalive)", nginx: true, lua: true, usesRedis: true, path: nginxPath, start: startNginxLuaRedis},
		{name: "nginx-auth-null", about: "nginx with the shipped nginx/example.conf, as nginx-authlimit-redis, but the null server in authlimit's place (200 to every subrequest): the auth_request hop alone, the ceiling of any auth server behind it", nginx: true, path: nginxPath, start: startNginxAuthNull},
		{name: "nginx-naive-redis", about: "nginx with the shipped nginx/example.conf, as nginx-authlimit-redis, but the naive server in authlimit's place, keyed by the subrequest's X-Forwarded-For and denying 403 as the file requires: auth_request with the simplest limiter behind it", nginx: true, usesRedis: true, path: nginxPath, start: startNginxNaive},
		{name: "nginx-authlimit-redis", about: "nginx with the shipped nginx/example.conf: auth_request → authlimit (AUTHLIMIT_DENY_STATUS=403) → Redis, 1 rule; backend a static-file server block of the same nginx", nginx: true, usesRedis: true, path: nginxPath, start: startNginxAuthlimit},
		{name: "haproxy", about: "HAProxy alone (one thread) answering a small body itself (`http-request return`)", haproxy: true, path: "/", start: startHAProxyAlone},
		{name: "haproxy-authlimit-redis", about: "HAProxy (one thread) with the shipped haproxy/haproxy-lua.cfg and haproxy/authlimit.lua: a Lua action → core.httpclient() → the config's listen section → authlimit → Redis, 1 rule; the frontend answers allowed requests itself, as haproxy alone does", haproxy: true, usesRedis: true, path: "/", start: startHAProxyAuthlimit},
		{name: "haproxy-spoe-null", about: "HAProxy (one thread) with the shipped haproxy/haproxy.cfg and haproxy/spoe-authlimit.conf, as haproxy-spoe-authlimit-redis, but an agent that decides nothing in authlimit's place (`bench serve-spoa-null`, on authlimit's own SPOP server, answering every NOTIFY with an empty ACK): the SPOE hop alone, the ceiling of any agent behind it", haproxy: true, path: "/", start: startHAProxySPOENull},
		{name: "haproxy-spoe-authlimit-redis", about: "HAProxy (one thread) with the shipped haproxy/haproxy.cfg and haproxy/spoe-authlimit.conf: SPOE → authlimit's agent (AUTHLIMIT_SPOA_LISTEN) → Redis, 1 rule; the frontend answers allowed requests itself, as haproxy alone does", haproxy: true, usesRedis: true, path: "/", start: startHAProxySPOEAuthlimit},
		{name: "haproxy-spoe-unix-authlimit-redis", about: "haproxy-spoe-authlimit-redis with the agent on a Unix socket (AUTHLIMIT_SPOA_LISTEN=unix:<path> in the run's directory, HAProxy's `server authlimit unix@<path>`) instead of loopback TCP: what the socket saves both processes", haproxy: true, usesRedis: true, path: "/", start: startHAProxySPOEUnixAuthlimit},
		{name: "openresty-auth-null", about: "OpenResty with the shipped nginx/openresty.conf and nginx/authlimit.lua, as openresty-authlimit-redis, but the null server in authlimit's place: the Lua module's hop alone, the ceiling of any auth server behind it", nginx: true, lua: true, path: nginxPath, start: startOpenRestyAuthNull},
		{name: "openresty-naive-redis", about: "OpenResty with the shipped nginx/openresty.conf and nginx/authlimit.lua, as openresty-authlimit-redis, but the naive server in authlimit's place, keyed by the X-Forwarded-For the module sends (its 200 admits, its 429 is relayed): the Lua module with the simplest limiter behind it", nginx: true, lua: true, usesRedis: true, path: nginxPath, start: startOpenRestyNaive},
		{name: "openresty-authlimit-redis", about: "OpenResty (nginx + Lua module) with the shipped nginx/openresty.conf and nginx/authlimit.lua: access_by_lua asks authlimit over pooled cosocket connections (no subrequest) → Redis, 1 rule; backend a static-file server block of the same nginx", nginx: true, lua: true, usesRedis: true, path: nginxPath, start: startOpenRestyAuthlimit},
		{name: "grpc-null", about: "authlimit's own gRPC server (front/grpcwire, as authlimit serves `Check` and `ShouldRateLimit`) answering every `Check` with an `ok_response` encoded once, reading nothing of the request and deciding nothing (`bench serve-grpc-null`), driven by the gRPC load with authlimit-check's requests: the floor of any gRPC answer of authlimit's, as null is of any HTTP answer", rpc: checkRPC, start: startGRPCNull},
		{name: "envoy-ratelimit", about: fmt.Sprintf("envoyproxy/ratelimit %s (built with `go install` from the Go module proxy) answering gRPC `ShouldRateLimit` on Redis from the rate-limit configuration below, its settings at their defaults (a pool of 10 Redis connections, no pipelining window, no local cache of keys over their limit), driven by the gRPC load", ratelimitVersion), usesRedis: true, ratelimit: true, rpc: rlsRPC, start: startEnvoyRatelimit},
		{name: "authlimit-rls", about: "authlimit on Redis answering gRPC `ShouldRateLimit` from the same rate-limit configuration file (`AUTHLIMIT_RLS_CONFIG`), driven by the gRPC load", usesRedis: true, rpc: rlsRPC, start: startAuthlimitRLS},
		{name: "authlimit-check", about: "authlimit on Redis answering Envoy's ext_authz gRPC `Check` with the 1 rule of authlimit-redis-1, the client in the request's source address, driven by the gRPC load", usesRedis: true, rpc: checkRPC, start: startAuthlimitCheck},
	}
}

// selectSystems returns the chosen systems in catalogue order, and notes
// on those that cannot run here.
func selectSystems(o *options) ([]system, []string) {
	var out []system
	var notes []string
	_, nginxErr := exec.LookPath(o.nginx)
	_, luaErr := os.Stat(luaModule)
	_, haproxyErr := exec.LookPath(o.haproxy)
	for _, s := range catalogue() {
		if !slices.Contains(o.systems, s.name) {
			continue
		}
		switch {
		case s.nginx && nginxErr != nil:
			notes = append(notes, fmt.Sprintf("`%s` skipped: nginx not found (%v); install Debian's nginx", s.name, nginxErr))
		case s.lua && luaErr != nil:
			notes = append(notes, fmt.Sprintf("`%s` skipped: the Lua module is not installed (%v); install libnginx-mod-http-lua", s.name, luaErr))
		case s.haproxy && haproxyErr != nil:
			notes = append(notes, fmt.Sprintf("`%s` skipped: haproxy not found (%v); install Debian's haproxy", s.name, haproxyErr))
		default:
			out = append(out, s)
		}
	}
	return out, notes
}

func startNull(ctx context.Context, e *runEnv) (*instance, error) {
	p, addr, err := startNullServer(ctx, e)
	if err != nil {
		return nil, err
	}
	return &instance{addr: addr, procs: []*proc{p}, serverRoots: []int{p.pid()}, denyStatus: 429}, nil
}

// startNullServer starts `bench serve-null` on a free loopback port and
// waits until it answers.
func startNullServer(ctx context.Context, e *runEnv) (*proc, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	p, err := startProc(e.dir, "null", e.o.selfBinary, []string{"serve-null", "-listen", addr}, nil)
	if err != nil {
		return nil, "", err
	}
	if err := waitReady(ctx, "null server", readyTimeout, wantStatus("http://"+addr+"/", 200), p); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, addr, nil
}

func startNaive(ctx context.Context, e *runEnv) (*instance, error) {
	p, addr, err := startNaiveServer(ctx, e, 429, "go-redis")
	if err != nil {
		return nil, err
	}
	return &instance{addr: addr, procs: []*proc{p}, serverRoots: []int{p.pid()}, denyStatus: 429}, nil
}

func startNaiveRaw(ctx context.Context, e *runEnv) (*instance, error) {
	return startNaiveRawWith(ctx, e)
}

func startNaiveClock(ctx context.Context, e *runEnv) (*instance, error) {
	return startNaiveRawWith(ctx, e, "-clock")
}

// startNaiveRawWith starts serve-naive on its own connections (-client
// raw) with the flags extra.
func startNaiveRawWith(ctx context.Context, e *runEnv, extra ...string) (*instance, error) {
	p, addr, err := startNaiveServer(ctx, e, 429, "raw", extra...)
	if err != nil {
		return nil, err
	}
	return &instance{addr: addr, procs: []*proc{p}, serverRoots: []int{p.pid()}, denyStatus: 429}, nil
}

// startNaiveServer starts `bench serve-naive` on a free loopback port,
// denying with denyStatus, with the Redis client kind client and the flags
// extra, and waits until it answers.
func startNaiveServer(ctx context.Context, e *runEnv, denyStatus int, client string, extra ...string) (*proc, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	l := limitFor(e.workload)
	p, err := startProc(e.dir, "naive", e.o.selfBinary, append([]string{"serve-naive", "-listen", addr,
		"-redis", e.redis.addr, "-limit", fmt.Sprint(l.n), "-window", fmt.Sprintf("%dms", l.ms),
		"-deny-status", fmt.Sprint(denyStatus), "-client", client}, extra...), nil)
	if err != nil {
		return nil, "", err
	}
	if err := waitReady(ctx, "naive server", readyTimeout, wantStatus("http://"+addr+"/healthz", 200), p); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, addr, nil
}

func startRedisFloor(ctx context.Context, e *runEnv) (*instance, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := startProc(e.dir, "redis-floor", e.o.selfBinary, []string{"serve-redis-floor", "-listen", addr, "-redis", e.redis.addr}, nil)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, "redis-floor server", readyTimeout, wantStatus("http://"+addr+"/healthz", 200), p); err != nil {
		p.stop()
		return nil, err
	}
	return &instance{addr: addr, procs: []*proc{p}, serverRoots: []int{p.pid()}, denyStatus: 429}, nil
}

// authlimitSystem starts authlimit with one rule or three, on Redis if the
// run has one, else on the embedded store.
func authlimitSystem(three bool) func(ctx context.Context, e *runEnv) (*instance, error) {
	return authlimitRules(three, "")
}

// authlimitAlgorithm starts authlimit with one rule of the algorithm.
func authlimitAlgorithm(algorithm string) func(ctx context.Context, e *runEnv) (*instance, error) {
	return authlimitRules(false, algorithm)
}

func authlimitRules(three bool, algorithm string) func(ctx context.Context, e *runEnv) (*instance, error) {
	return func(ctx context.Context, e *runEnv) (*instance, error) {
		p, addr, err := startAuthlimit(ctx, e, rulesFor(e.workload, three, algorithm))
		if err != nil {
			return nil, err
		}
		return &instance{addr: addr, procs: []*proc{p}, serverRoots: []int{p.pid()}, metrics: []string{"http://" + addr + "/metrics"}, denyStatus: 429}, nil
	}
}
