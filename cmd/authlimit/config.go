package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/denials"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/store/redis"
)

// envPrefix starts every variable authlimit reads.
const envPrefix = "AUTHLIMIT_"

// maxBreakerBackoff bounds AUTHLIMIT_BREAKER_MAX_BACKOFF: an open circuit
// is probed at least this often, so that decisions are back on Redis within
// 2s of Redis answering again.
const maxBreakerBackoff = time.Second

// config is authlimit's whole configuration, read from AUTHLIMIT_*
// variables. Its tags hold every default authlimit has, but those a package
// it configures owns, which defaultConfig takes from that package: the
// packages take every value from config. docs/configuration.md documents every field
// and its default; TestDocsDocumentEveryVariable keeps the two in step.
type config struct {
	Listen   string `env:"LISTEN" envDefault:":8080"`
	RedisURL string `env:"REDIS_URL"`
	// RedisMode picks the client: standalone, cluster or sentinel.
	RedisMode             string        `env:"REDIS_MODE" envDefault:"standalone"`
	RedisAddrs            []string      `env:"REDIS_ADDRS"`
	RedisMaster           string        `env:"REDIS_MASTER"`
	RedisSentinelUsername string        `env:"REDIS_SENTINEL_USERNAME"`
	RedisSentinelPassword string        `env:"REDIS_SENTINEL_PASSWORD"`
	RedisCAFile           string        `env:"REDIS_CA_FILE"`
	RedisCertFile         string        `env:"REDIS_CERT_FILE"`
	RedisKeyFile          string        `env:"REDIS_KEY_FILE"`
	RedisTimeout          time.Duration `env:"REDIS_TIMEOUT" envDefault:"50ms"`
	RedisPoolSize         int           `env:"REDIS_POOL_SIZE" envDefault:"4"`
	Rules                 string        `env:"RULES"`
	RulesFile             string        `env:"RULES_FILE"`
	TrustedProxies        []string      `env:"TRUSTED_PROXIES" envDefault:"127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"`
	DenyStatus            int           `env:"DENY_STATUS" envDefault:"429"`
	FailMode              string        `env:"FAIL_MODE" envDefault:"local"`
	LocalDivisor          int           `env:"LOCAL_DIVISOR" envDefault:"1"`
	AllowCIDRs            []string      `env:"ALLOW_CIDRS"`
	BlockCIDRs            []string      `env:"BLOCK_CIDRS"`
	IPv4Prefix            int           `env:"IPV4_PREFIX" envDefault:"32"`
	IPv6Prefix            int           `env:"IPV6_PREFIX" envDefault:"64"`
	KeyPrefix             string        `env:"KEY_PREFIX" envDefault:"authlimit"`
	Shadow                bool          `env:"SHADOW" envDefault:"false"`
	MethodHeader          string        `env:"METHOD_HEADER" envDefault:"X-Forwarded-Method"`
	URIHeader             string        `env:"URI_HEADER" envDefault:"X-Forwarded-Uri"`
	HostHeader            string        `env:"HOST_HEADER" envDefault:"X-Forwarded-Host"`
	URLHeader             string        `env:"URL_HEADER"`
	DenyCacheSize         int           `env:"DENY_CACHE_SIZE" envDefault:"100000"`
	BreakerFailures       int           `env:"BREAKER_FAILURES" envDefault:"5"`
	BreakerBackoff        time.Duration `env:"BREAKER_BACKOFF" envDefault:"100ms"`
	BreakerMaxBackoff     time.Duration `env:"BREAKER_MAX_BACKOFF" envDefault:"500ms"`
	MemoryMaxKeys         int           `env:"MEMORY_MAX_KEYS"` // default in defaultConfig
	MaxHeaderBytes        int           `env:"MAX_HEADER_BYTES" envDefault:"32768"`
	MaxBufferedBytes      int64         `env:"MAX_BUFFERED_BYTES" envDefault:"33554432"`
	MaxConns              int           `env:"MAX_CONNS"` // unset: derived from the open file limit
	ShutdownTimeout       time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"10s"`
	LogLevel              string        `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat             string        `env:"LOG_FORMAT" envDefault:"json"`
	PprofListen           string        `env:"PPROF_LISTEN"`
	GRPCListen            string        `env:"GRPC_LISTEN"`
	GRPCTrustedPeers      []string      `env:"GRPC_TRUSTED_PEERS"`
	RLSConfig             string        `env:"RLS_CONFIG"`
	RLSResponseMetadata   bool          `env:"RLS_RESPONSE_METADATA" envDefault:"false"`
	AdminListen           string        `env:"ADMIN_LISTEN"`
	AdminToken            string        `env:"ADMIN_TOKEN"`
	SPOAListen            string        `env:"SPOA_LISTEN"`
	TopSize               int           `env:"TOP_SIZE"` // default in defaultConfig
	TopWindow             time.Duration `env:"TOP_WINDOW"`
	TopShareInterval      time.Duration `env:"TOP_SHARE_INTERVAL"`
	DenialLogRate         int           `env:"DENIAL_LOG_RATE"`
	LogKeys               bool          `env:"LOG_KEYS" envDefault:"false"`
}

// defaultConfig holds the defaults that belong to the packages authlimit
// configures; env keeps them for variables that are unset.
func defaultConfig() config {
	return config{
		MemoryMaxKeys:    algo.DefaultMemoryMaxKeys,
		TopSize:          denials.DefaultSize,
		TopWindow:        denials.DefaultWindow,
		TopShareInterval: denials.DefaultShareInterval,
		DenialLogRate:    denials.DefaultLogRate,
	}
}

// settings is config validated and parsed into the types the program uses.
type settings struct {
	config
	rules         []*rules.Rule
	defaultRules  bool
	rulesHash     string // of the rules in force, see rulesHash
	failMode      guard.FailMode
	trusted       []netip.Prefix
	grpcPeers     []netip.Prefix // the peers the gRPC listener serves
	allow, block  []netip.Prefix
	logLevel      slog.Level
	redisOptions  *goredis.UniversalOptions // nil: the embedded memory store
	redisPlain    *goredis.Options          // standalone mode's options
	redisDisplay  string                    // the store, credentials hidden
	listenNetwork string
	// maxConns is AUTHLIMIT_MAX_CONNS, or when unset, once limitConns
	// ran, derived from the open file limit (0: no cap).
	maxConns       int
	fdLimit        uint64 // the open file limit limitConns was given; 0: unknown
	listenAddress  string
	unknownEnvVars []string
	// warnings are settings that are valid but do nothing in the usual
	// setups, each naming the variable: -check prints them and the start
	// logs them.
	warnings []string
	rls      *envoyconf.Config // nil: no rate-limit service
}

// limitConns sets the connection cap: AUTHLIMIT_MAX_CONNS if set, else
// the open file limit less a reserve of a tenth (at least 64) for the
// store's connections, the listeners and the files the process opens, so
// that new connections are closed at once rather than accepts failing.
func (s *settings) limitConns(fdLimit uint64) {
	s.fdLimit = fdLimit
	switch {
	case s.MaxConns > 0:
		s.maxConns = s.MaxConns
	case fdLimit == 0:
		s.maxConns = 0
	default:
		s.maxConns = defaultMaxConns(fdLimit)
	}
}

// defaultMaxConns is the connection cap for an open file limit.
func defaultMaxConns(fdLimit uint64) int {
	reserve := max(fdLimit/10, 64)
	if fdLimit <= 2*reserve {
		return int(max(fdLimit/2, 1))
	}
	return int(min(fdLimit-reserve, 1<<30))
}

// ConfigError is one configuration mistake: the variable and what is wrong.
type ConfigError struct {
	Var string
	Err error
}

func (e *ConfigError) Error() string { return e.Var + ": " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// loadConfig reads the AUTHLIMIT_* variables of environ and validates them,
// reporting every problem at once (errors.Join of *ConfigError).
func loadConfig(environ map[string]string) (*settings, error) {
	c := defaultConfig()
	var errs []error
	unparsed := map[string]bool{} // variables whose value could not be read
	problem := func(field string, err error) {
		if !unparsed[field] {
			errs = append(errs, &ConfigError{Var: envPrefix + field, Err: err})
		}
	}
	// A variable that is set must say something: empty would silently mean
	// the default, which for some (the trusted proxies) is the opposite of
	// what an operator emptying it may mean.
	for _, f := range envFields() {
		if v, ok := environ[envPrefix+f.key]; ok && strings.TrimSpace(v) == "" && f.def != "" {
			hint := ""
			if f.key == "TRUSTED_PROXIES" {
				hint = ", or none to trust no proxy"
			}
			problem(f.key, fmt.Errorf("set but empty: unset it for the default (%s)%s", f.def, hint))
			unparsed[f.key] = true
		}
	}
	if err := env.ParseWithOptions(&c, env.Options{Prefix: envPrefix, Environment: environ}); err != nil {
		keys := envKeys()
		var agg env.AggregateError
		if errors.As(err, &agg) {
			for _, e := range agg.Errors {
				var pe env.ParseError
				if errors.As(e, &pe) {
					key := keys[pe.Name]
					problem(key, fmt.Errorf("%q is not %s", environ[envPrefix+key], typeHint(pe.Type)))
					unparsed[key] = true
					continue
				}
				errs = append(errs, e)
			}
		} else {
			errs = append(errs, err)
		}
	}
	s := &settings{config: c}

	known := map[string]bool{}
	for _, k := range envKeys() {
		known[envPrefix+k] = true
	}
	for k := range environ {
		if strings.HasPrefix(k, envPrefix) && !known[k] && !strings.HasPrefix(k, envPrefix+"TEST_") {
			s.unknownEnvVars = append(s.unknownEnvVars, k)
		}
	}
	sort.Strings(s.unknownEnvVars)
	for _, k := range s.unknownEnvVars {
		errs = append(errs, &ConfigError{Var: k, Err: fmt.Errorf("unknown variable%s", suggest(k, known))})
	}

	if strings.HasPrefix(c.Listen, "unix:") {
		s.listenNetwork, s.listenAddress = "unix", strings.TrimPrefix(c.Listen, "unix:")
		if s.listenAddress == "" {
			problem("LISTEN", errors.New(`"unix:" needs a socket path, such as unix:/run/authlimit.sock`))
		}
	} else if err := checkHostPort(c.Listen); err != nil {
		problem("LISTEN", fmt.Errorf("%q is not host:port or unix:<path> (such as :8080 or 127.0.0.1:8080): %w", c.Listen, err))
	} else {
		s.listenNetwork, s.listenAddress = "tcp", c.Listen
	}
	if c.PprofListen != "" {
		if err := checkHostPort(c.PprofListen); err != nil {
			problem("PPROF_LISTEN", fmt.Errorf("%q is not host:port: %w", c.PprofListen, err))
		}
	}

	s.redisOptions, s.redisPlain, s.redisDisplay = redisSettings(&c, problem)
	grpcSettings(&c, s, problem)
	adminSettings(&c, s, problem)
	memorySettings(&c, problem)
	topSettings(&c, problem)

	_, rulesSet := environ[envPrefix+"RULES"]
	switch {
	case c.RulesFile != "" && rulesSet:
		problem("RULES_FILE", errors.New("set together with AUTHLIMIT_RULES: set one of them"))
	case c.RulesFile != "":
		rs, err := loadRulesFile(c.RulesFile)
		if err != nil {
			for _, e := range unjoin(err) {
				problem("RULES_FILE", e)
			}
		}
		s.rules = rs
	default:
		if !rulesSet {
			c.Rules, s.defaultRules = rules.Default, true
		}
		rs, err := rules.Parse(c.Rules)
		if err != nil {
			for _, e := range unjoin(err) {
				problem("RULES", e)
			}
		}
		s.rules = rs
	}
	rulesVar := "RULES"
	if c.RulesFile != "" {
		rulesVar = "RULES_FILE"
	}
	for _, r := range s.rules {
		for _, w := range r.Warnings() {
			s.warnings = append(s.warnings, envPrefix+rulesVar+": "+w)
		}
	}
	s.rulesHash = rulesHash(s.rules)

	if len(c.TrustedProxies) == 1 && strings.TrimSpace(c.TrustedProxies[0]) == "none" {
		s.trusted = nil
	} else {
		s.trusted = parsePrefixes("TRUSTED_PROXIES", c.TrustedProxies, problem)
	}
	spoaSettings(&c, s, problem)
	s.allow = parsePrefixes("ALLOW_CIDRS", c.AllowCIDRs, problem)
	s.block = parsePrefixes("BLOCK_CIDRS", c.BlockCIDRs, problem)
	grpcPeerSettings(&c, s, problem)

	if c.DenyStatus < 400 || c.DenyStatus > 599 {
		problem("DENY_STATUS", fmt.Errorf("%d is not a 4xx or 5xx status (nginx auth_request passes only 401 and 403: use 403 and map it to 429)", c.DenyStatus))
	}
	var err error
	if s.failMode, err = guard.ParseFailMode(c.FailMode); err != nil {
		problem("FAIL_MODE", err)
	}
	positive := func(field string, v int) {
		if v < 1 {
			problem(field, fmt.Errorf("%d is not positive", v))
		}
	}
	positive("LOCAL_DIVISOR", c.LocalDivisor)
	positive("BREAKER_FAILURES", c.BreakerFailures)
	positive("MEMORY_MAX_KEYS", c.MemoryMaxKeys)
	if v := environ[envPrefix+"MAX_CONNS"]; strings.TrimSpace(v) != "" {
		positive("MAX_CONNS", c.MaxConns)
	}
	if c.IPv4Prefix < 1 || c.IPv4Prefix > 32 {
		problem("IPV4_PREFIX", fmt.Errorf("%d is not a prefix length from 1 to 32", c.IPv4Prefix))
	}
	if c.IPv6Prefix < 1 || c.IPv6Prefix > 128 {
		problem("IPV6_PREFIX", fmt.Errorf("%d is not a prefix length from 1 to 128", c.IPv6Prefix))
	}
	if c.KeyPrefix == "" || strings.ContainsAny(c.KeyPrefix, "{} \t\r\n") {
		problem("KEY_PREFIX", fmt.Errorf("%q must be non-empty, without braces or spaces", c.KeyPrefix))
	}
	for field, v := range map[string]string{"METHOD_HEADER": c.MethodHeader, "URI_HEADER": c.URIHeader, "HOST_HEADER": c.HostHeader, "URL_HEADER": c.URLHeader} {
		if field == "URL_HEADER" && v == "" {
			continue // optional
		}
		if v == "" || strings.ContainsAny(v, " \t\r\n:()<>@,;\\\"/[]?={}") {
			problem(field, fmt.Errorf("%q is not a header name", v))
		}
	}
	if c.DenyCacheSize < 0 {
		problem("DENY_CACHE_SIZE", fmt.Errorf("%d is negative (0 disables the deny cache)", c.DenyCacheSize))
	}
	durations := []struct {
		field    string
		v        time.Duration
		min, max time.Duration
	}{
		{"REDIS_TIMEOUT", c.RedisTimeout, time.Millisecond, 10 * time.Second},
		{"BREAKER_BACKOFF", c.BreakerBackoff, time.Millisecond, maxBreakerBackoff},
		{"SHUTDOWN_TIMEOUT", c.ShutdownTimeout, 0, time.Hour},
	}
	for _, d := range durations {
		if d.v < d.min || d.v > d.max {
			problem(d.field, fmt.Errorf("%v is not between %v and %v", d.v, d.min, d.max))
		}
	}
	switch {
	case c.BreakerMaxBackoff < time.Millisecond || c.BreakerMaxBackoff > maxBreakerBackoff:
		problem("BREAKER_MAX_BACKOFF", fmt.Errorf("%v is not between 1ms and %v: an open circuit waits up to this long between probes, and decisions must be back on Redis within 2s of Redis answering again", c.BreakerMaxBackoff, maxBreakerBackoff))
	case c.BreakerBackoff > c.BreakerMaxBackoff && c.BreakerBackoff <= maxBreakerBackoff && !unparsed["BREAKER_MAX_BACKOFF"]:
		problem("BREAKER_BACKOFF", fmt.Errorf("%v is more than AUTHLIMIT_BREAKER_MAX_BACKOFF (%v): the gap between probes starts here and doubles up to that", c.BreakerBackoff, c.BreakerMaxBackoff))
	}
	if c.RedisPoolSize < 1 || c.RedisPoolSize > 256 {
		problem("REDIS_POOL_SIZE", fmt.Errorf("%d is not between 1 and 256", c.RedisPoolSize))
	}
	if c.MaxHeaderBytes < 4096 || c.MaxHeaderBytes > 1<<20 {
		problem("MAX_HEADER_BYTES", fmt.Errorf("%d is not between 4096 and 1048576", c.MaxHeaderBytes))
	}
	if err := s.logLevel.UnmarshalText([]byte(c.LogLevel)); err != nil {
		problem("LOG_LEVEL", fmt.Errorf("%q is not debug, info, warn or error", c.LogLevel))
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		problem("LOG_FORMAT", fmt.Errorf("%q is not json or text", c.LogFormat))
	}
	s.config = c
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// redisSpareConns is how many connections per node serve probes, pings
// and refunds, besides those that carry decisions.
const redisSpareConns = 4

// redisSettings turns the REDIS_* variables into client options, or nil for
// the embedded memory store. Standalone mode also gets plain client options,
// which keep a unix:// URL's network.
func redisSettings(c *config, problem func(string, error)) (*goredis.UniversalOptions, *goredis.Options, string) {
	if c.RedisURL == "" {
		if c.RedisMode != "standalone" || len(c.RedisAddrs) > 0 || c.RedisMaster != "" {
			problem("REDIS_URL", errors.New("not set, but other AUTHLIMIT_REDIS_* variables are: set it, or unset them for the embedded store"))
		}
		return nil, nil, "memory (embedded, this instance only)"
	}
	base, err := parseRedisURL(c.RedisURL)
	if err != nil {
		problem("REDIS_URL", err)
		return nil, nil, ""
	}
	for _, a := range c.RedisAddrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			problem("REDIS_ADDRS", fmt.Errorf("%q is not host:port", a))
		}
	}
	if base.TLSConfig != nil {
		tlsSettings(c, base.TLSConfig, problem)
	} else if c.RedisCAFile != "" || c.RedisCertFile != "" || c.RedisKeyFile != "" {
		problem("REDIS_CA_FILE", errors.New("the TLS files need a rediss:// URL"))
	}
	// Decisions carry a deadline: the client must respect it, and a pool
	// wait must not outlast it.
	base.ContextTimeoutEnabled = true
	base.DialTimeout = max(c.RedisTimeout, time.Second)
	if base.TLSConfig != nil {
		// go-redis's TLS dialing ignores the dial's context: a decision
		// that dials a Redis that accepts and never completes the
		// handshake would wait the dial timeout, not its budget.
		base.Dialer = redis.TLSDialer(base.TLSConfig, base.DialTimeout)
	}
	base.PoolTimeout = c.RedisTimeout
	// REDIS_POOL_SIZE connections carry decisions, a batch each; a few more
	// serve probes, pings and refunds. Those that carry decisions are
	// opened at start and kept, so that a burst never waits for a dial;
	// the pool dials nothing in the background (no minimum of idle
	// connections), so nothing dials during a burst. In a cluster they are
	// the pool's; a standalone or Sentinel store opens its own (see
	// redis.Options.Conns), and its pool keeps only the few.
	base.PoolSize = c.RedisPoolSize + redisSpareConns
	base.ConnMaxIdleTime = -1
	base.ClientName = "authlimit"
	// RESP2: authlimit needs no push messages, and go-redis looks for them
	// before every RESP3 call.
	base.Protocol = 2
	// A refused dial fails at once (the fail mode answers), and a call is
	// never sent twice: one whose reply was lost may have consumed, and a
	// retry would count its requests again.
	base.DialerRetries = 1
	base.MaxRetries = -1
	o := &goredis.UniversalOptions{
		Addrs:                 append([]string{base.Addr}, c.RedisAddrs...),
		Username:              base.Username,
		Password:              base.Password,
		DB:                    base.DB,
		TLSConfig:             base.TLSConfig,
		Dialer:                base.Dialer,
		PoolSize:              base.PoolSize,
		ConnMaxIdleTime:       base.ConnMaxIdleTime,
		ContextTimeoutEnabled: true,
		DialTimeout:           base.DialTimeout,
		PoolTimeout:           base.PoolTimeout,
		ClientName:            base.ClientName,
		Protocol:              base.Protocol,
		DialerRetries:         base.DialerRetries,
		MaxRetries:            base.MaxRetries,
	}
	display := redactURL(c.RedisURL)
	switch c.RedisMode {
	case "standalone":
		if len(c.RedisAddrs) > 0 {
			problem("REDIS_ADDRS", errors.New("only for cluster (seed nodes) or sentinel (sentinels) mode"))
		}
		if c.RedisMaster != "" {
			problem("REDIS_MASTER", errors.New("only for sentinel mode"))
		}
		base.PoolSize, o.PoolSize = redisSpareConns, redisSpareConns
		return o, base, "redis standalone " + display
	case "cluster":
		if c.RedisMaster != "" {
			problem("REDIS_MASTER", errors.New("only for sentinel mode"))
		}
		if base.DB != 0 {
			problem("REDIS_URL", errors.New("a Redis Cluster has only database 0"))
		}
		if base.Network == "unix" {
			problem("REDIS_URL", errors.New("cluster mode needs redis:// or rediss:// node addresses"))
		}
		o.IsClusterMode = true
		return o, nil, fmt.Sprintf("redis cluster, seeds %s", strings.Join(o.Addrs, ", "))
	case "sentinel":
		if c.RedisMaster == "" {
			problem("REDIS_MASTER", errors.New("sentinel mode needs the master's name, as the sentinels know it"))
		}
		if base.Network == "unix" {
			problem("REDIS_URL", errors.New("sentinel mode needs redis:// or rediss:// sentinel addresses"))
		}
		o.PoolSize = redisSpareConns
		o.MasterName = c.RedisMaster
		o.SentinelUsername = c.RedisSentinelUsername
		o.SentinelPassword = c.RedisSentinelPassword
		return o, nil, fmt.Sprintf("redis sentinel, master %q via %s", c.RedisMaster, strings.Join(o.Addrs, ", "))
	default:
		problem("REDIS_MODE", fmt.Errorf("%q is not standalone, cluster or sentinel", c.RedisMode))
		return nil, nil, ""
	}
}

// tlsSettings adds the REDIS_*_FILE settings to a rediss:// URL's TLS
// configuration: the CAs to trust instead of the system's, and a client
// certificate.
func tlsSettings(c *config, t *tls.Config, problem func(string, error)) {
	if c.RedisCAFile != "" {
		pem, err := os.ReadFile(c.RedisCAFile)
		pool := x509.NewCertPool()
		switch {
		case err != nil:
			problem("REDIS_CA_FILE", err)
		case !pool.AppendCertsFromPEM(pem):
			problem("REDIS_CA_FILE", fmt.Errorf("%s holds no PEM certificate", c.RedisCAFile))
		default:
			t.RootCAs = pool
		}
	}
	switch {
	case c.RedisCertFile == "" && c.RedisKeyFile == "":
	case c.RedisCertFile == "" || c.RedisKeyFile == "":
		problem("REDIS_CERT_FILE", errors.New("a client certificate needs both AUTHLIMIT_REDIS_CERT_FILE and AUTHLIMIT_REDIS_KEY_FILE"))
	default:
		cert, err := tls.LoadX509KeyPair(c.RedisCertFile, c.RedisKeyFile)
		if err != nil {
			problem("REDIS_CERT_FILE", err)
		} else {
			t.Certificates = []tls.Certificate{cert}
		}
	}
}

// parseRedisURL parses a Redis URL as go-redis does, but refuses one whose
// user information go-redis would read otherwise than redactURL hides it.
// Its errors quote nothing of the user information: go-redis's own quote
// the URL up to where it went wrong, which with a '#', '/' or '?' in the
// password is inside the password.
func parseRedisURL(raw string) (*goredis.Options, error) {
	shown := redactURL(raw)
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || scheme == "" {
		return nil, errors.New("not a URL: want redis://, rediss:// or unix:// (such as redis://user:password@host:6379/0)")
	}
	o, err := goredis.ParseURL(raw)
	if err == nil {
		if at := strings.LastIndexByte(rest, '@'); at >= 0 && !sameHost(raw, rest[at+1:]) {
			err = errors.New("user information read as host")
		}
	}
	if err == nil {
		return o, nil
	}
	if _, err := goredis.ParseURL(shown); err != nil {
		// The trouble is outside the user information, which shown
		// hides: go-redis's message about shown quotes no credential.
		return nil, fmt.Errorf("%s: %w", shown, err)
	}
	return nil, fmt.Errorf(`%s: its user information (all between :// and the last @) does not parse: percent-encode '#', '/', '?', '@' and '%%' in the user name and password (%%23, %%2F, %%3F, %%40, %%25)`, shown)
}

// sameHost reports whether url.Parse takes raw's host from hostPart (what
// follows raw's last '@'), and so its user information from before it.
func sameHost(raw, hostPart string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return false
	}
	if i := strings.IndexAny(hostPart, "/?#"); i >= 0 {
		hostPart = hostPart[:i]
	}
	return u.Host == hostPart
}

// redactURL shows a Redis URL without its user information, whatever
// characters the password holds ('#', '/', '@' and all): everything
// between "://" and the last '@' is hidden.
func redactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "(not a URL)"
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		return scheme + "://***@" + rest[at+1:]
	}
	return raw
}

// redact removes from text every part of raw's user information: the
// whole, and each piece of it between separators, so that no message
// quoting the URL (or a part of it) shows a credential. It serves the
// messages of a running client, which quote addresses, never the user
// information (parseRedisURL made sure no address comes from it): a
// one-character piece is left, as hiding every such letter would garble
// the message.
func redact(text, raw string) string {
	_, rest, ok := strings.Cut(raw, "://")
	at := strings.LastIndexByte(rest, '@')
	if !ok || at < 0 {
		return text
	}
	info := rest[:at]
	secrets := []string{info}
	secrets = append(secrets, strings.FieldsFunc(info, func(r rune) bool { return strings.ContainsRune(":#?/@", r) })...)
	for _, sec := range secrets {
		if len(sec) >= 2 {
			text = strings.ReplaceAll(text, sec, "***")
		}
	}
	return text
}

// checkHostPort checks a host:port to listen on: a numeric port up to 65535.
func checkHostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// parsePrefixes reads CIDRs or addresses. IPv4-mapped IPv6 forms
// (::ffff:203.0.113.0/120) become IPv4, as client addresses do, so they
// match.
func parsePrefixes(field string, vals []string, problem func(string, error)) []netip.Prefix {
	var out []netip.Prefix
	for _, v := range vals {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if p, err := netip.ParsePrefix(v); err == nil {
			if p.Addr().Is4In6() {
				if p.Bits() < 96 {
					problem(field, fmt.Errorf("%q reaches beyond the IPv4-mapped addresses (::ffff:0:0/96); write it as an IPv4 or an IPv6 prefix", v))
					continue
				}
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
		} else if a, err := netip.ParseAddr(v); err == nil {
			a = a.WithZone("").Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		} else {
			problem(field, fmt.Errorf("%q is not a CIDR or an IP address", v))
		}
	}
	return out
}

// envField is one variable: its name without the prefix and its default.
type envField struct{ key, def string }

// envFields lists config's variables, with their defaults from the tags
// or from defaultConfig.
func envFields() []envField {
	var out []envField
	t := reflect.TypeOf(config{})
	defaults := reflect.ValueOf(defaultConfig())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		def, tagged := f.Tag.Lookup("envDefault")
		if v := defaults.Field(i); !tagged && !v.IsZero() {
			def = fmt.Sprint(v.Interface())
		}
		out = append(out, envField{key: strings.Split(f.Tag.Get("env"), ",")[0], def: def})
	}
	return out
}

// envKeys maps config's field names to their variable names without the
// prefix.
func envKeys() map[string]string {
	keys := map[string]string{}
	t := reflect.TypeOf(config{})
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		keys[f.Name] = strings.Split(f.Tag.Get("env"), ",")[0]
	}
	return keys
}

func typeHint(t reflect.Type) string {
	switch {
	case t == reflect.TypeOf(time.Duration(0)):
		return "a duration (such as 50ms, 1s or 2m)"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Int:
		return "a whole number"
	}
	return "a " + t.String()
}

// suggest names a known variable close to an unknown one.
func suggest(k string, known map[string]bool) string {
	if best := rules.Closest(k, slices.Collect(maps.Keys(known))); best != "" {
		return fmt.Sprintf(" (did you mean %s?)", best)
	}
	return ""
}

// unjoin flattens errors.Join trees into their leaves.
func unjoin(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, unjoin(e)...)
	}
	return out
}

// describe prints the effective configuration for -check and the logs.
func (s *settings) describe() string {
	var b strings.Builder
	w := func(k, v string) { fmt.Fprintf(&b, "  %-16s %s\n", k, v) }
	b.WriteString("authlimit configuration:\n")
	w("listen", s.Listen)
	w("store", s.redisDisplay)
	fm := s.failMode.String()
	if s.failMode == guard.FailLocal {
		fm += fmt.Sprintf(" (limits divided by %d)", s.LocalDivisor)
	}
	if s.redisOptions == nil {
		fm += " (unused: the embedded store does not fail)"
	}
	w("fail mode", fm)
	if s.redisOptions != nil {
		w("redis timeout", s.RedisTimeout.String())
		w("redis conns", fmt.Sprintf("%d carry decisions, batched, per node", s.RedisPoolSize))
		w("circuit breaker", fmt.Sprintf("opens after %d failures; probes every %v to %v", s.BreakerFailures, s.BreakerBackoff, s.BreakerMaxBackoff))
	}
	w("deny status", fmt.Sprint(s.DenyStatus))
	if len(s.trusted) == 0 {
		w("trusted proxies", "none: forwarded headers are never believed")
	} else {
		w("trusted proxies", prefixes(s.trusted))
	}
	w("allow", prefixes(s.allow))
	w("block", prefixes(s.block))
	w("ip grouping", fmt.Sprintf("IPv4 /%d, IPv6 /%d", s.IPv4Prefix, s.IPv6Prefix))
	w("key prefix", s.KeyPrefix)
	w("shadow", fmt.Sprint(s.Shadow))
	headers := fmt.Sprintf("method %s, uri %s, host %s", s.MethodHeader, s.URIHeader, s.HostHeader)
	if s.URLHeader != "" {
		// The URL alone gives the host and the URI: the uri and host
		// headers are never read.
		headers = fmt.Sprintf("url %s (host and uri), method %s", s.URLHeader, s.MethodHeader)
	}
	w("headers", headers)
	w("deny cache", fmt.Sprintf("%d keys", s.DenyCacheSize))
	s.describeRLS(w)
	s.describeSPOA(w)
	s.describeGRPCPeers(w)
	switch {
	case s.MaxConns > 0:
		w("max conns", fmt.Sprint(s.MaxConns))
	case s.maxConns > 0:
		w("max conns", fmt.Sprintf("%d (the open file limit %d, less a reserve)", s.maxConns, s.fdLimit))
	default:
		w("max conns", "no cap: the open file limit is unknown")
	}
	s.describeAdmin(w)
	s.describeMemory(w)
	s.describeTop(w)
	suffix := ""
	switch {
	case s.defaultRules:
		suffix = " (AUTHLIMIT_RULES unset: the default rule)"
	case s.RulesFile != "":
		suffix = fmt.Sprintf(" (from %s, reloaded when it changes or on SIGHUP; hash %s)", s.RulesFile, s.rulesHash)
	}
	fmt.Fprintf(&b, "  rules%s:\n", suffix)
	for _, r := range s.rules {
		fmt.Fprintf(&b, "    %s\n", r)
	}
	if len(s.warnings) > 0 {
		b.WriteString("  warnings:\n")
		for _, w := range s.warnings {
			fmt.Fprintf(&b, "    %s\n", w)
		}
	}
	return b.String()
}

func prefixes(ps []netip.Prefix) string {
	if len(ps) == 0 {
		return "-"
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
