package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
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
	MaxBufferedBytes      int64         `env:"MAX_BUFFERED_BYTES" envDefault:"16777216"`
	MaxConns              int           `env:"MAX_CONNS"` // unset: derived from the open file limit
	ShutdownTimeout       time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"10s"`
	LogLevel              string        `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat             string        `env:"LOG_FORMAT" envDefault:"json"`
	PprofListen           string        `env:"PPROF_LISTEN"`
	GRPCListen            string        `env:"GRPC_LISTEN"`
	GRPCTrustedPeers      []string      `env:"GRPC_TRUSTED_PEERS"`
	GRPCTLSCert           string        `env:"GRPC_TLS_CERT"`
	GRPCTLSKey            string        `env:"GRPC_TLS_KEY"`
	GRPCTLSClientCA       string        `env:"GRPC_TLS_CLIENT_CA"`
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
	rlsHash       string // of AUTHLIMIT_RLS_CONFIG's files, see hashRLS
	failMode      guard.FailMode
	trusted       []netip.Prefix
	grpcPeers     []netip.Prefix // the peers the gRPC listener serves
	grpcTLS       *tls.Config    // the gRPC listener's TLS files, loaded; nil: h2c
	allow, block  []netip.Prefix
	logLevel      slog.Level
	redisOptions  *goredis.UniversalOptions // nil: the embedded memory store
	redisPlain    *goredis.Options          // standalone mode's options
	redisDisplay  string                    // the store, credentials hidden
	listenNetwork string
	// spoaNetwork and spoaAddress are AUTHLIMIT_SPOA_LISTEN's ("tcp" or
	// "unix"); empty without it.
	spoaNetwork, spoaAddress string
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

// loadConfig reads the AUTHLIMIT_* variables of environ and validates them
// in steps that share one list of problems, reporting every problem at
// once (errors.Join of *ConfigError).
func loadConfig(environ map[string]string) (*settings, error) {
	p := &problems{unparsed: map[string]bool{}}
	s := &settings{config: readEnv(environ, p)}
	for _, step := range []func(*settings, map[string]string, *problems){
		unknownVariables,
		listenSettings,
		storeSettings,
		grpcSettings,
		grpcTLSSettings,
		adminSettings,
		memorySettings,
		topSettings,
		ruleSettings,
		clientSettings,
		grpcPeerSettings,
		spoaSettings,
		decisionSettings,
		limitSettings,
		logSettings,
	} {
		step(s, environ, p)
	}
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return s, nil
}

// problems are the configuration's mistakes, each naming its variable.
type problems struct {
	errs []error
	// unparsed are the variables whose value could not be read: their
	// value is the default, and no further mistake of theirs is reported.
	unparsed map[string]bool
}

// add adds a mistake of the variable envPrefix+field.
func (p *problems) add(field string, err error) {
	if !p.unparsed[field] {
		p.errs = append(p.errs, &ConfigError{Var: envPrefix + field, Err: err})
	}
}

// readEnv reads environ's AUTHLIMIT_* variables into a config, with the
// defaults of those unset. A variable set but empty, or whose value is not
// of its type, is a mistake, and left unparsed.
func readEnv(environ map[string]string, p *problems) config {
	c := defaultConfig()
	// A variable that is set must say something: empty would silently mean
	// the default, which for some (the trusted proxies) is the opposite of
	// what an operator emptying it may mean.
	for _, f := range envFields() {
		if v, ok := environ[envPrefix+f.key]; ok && strings.TrimSpace(v) == "" && f.def != "" {
			hint := ""
			if f.key == "TRUSTED_PROXIES" {
				hint = ", or none to trust no proxy"
			}
			p.add(f.key, fmt.Errorf("set but empty: unset it for the default (%s)%s", f.def, hint))
			p.unparsed[f.key] = true
		}
	}
	if err := env.ParseWithOptions(&c, env.Options{Prefix: envPrefix, Environment: environ}); err != nil {
		keys := envKeys()
		var agg env.AggregateError
		if !errors.As(err, &agg) {
			p.errs = append(p.errs, err)
			return c
		}
		for _, e := range agg.Errors {
			var pe env.ParseError
			if errors.As(e, &pe) {
				key := keys[pe.Name]
				p.add(key, fmt.Errorf("%q is not %s", environ[envPrefix+key], typeHint(pe.Type)))
				p.unparsed[key] = true
				continue
			}
			p.errs = append(p.errs, e)
		}
	}
	return c
}

// unknownVariables refuses AUTHLIMIT_* variables authlimit does not read,
// suggesting the one meant.
func unknownVariables(s *settings, environ map[string]string, p *problems) {
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
		p.errs = append(p.errs, &ConfigError{Var: k, Err: fmt.Errorf("unknown variable%s", suggest(k, known))})
	}
}

// listenSettings reads AUTHLIMIT_LISTEN and AUTHLIMIT_PPROF_LISTEN.
func listenSettings(s *settings, _ map[string]string, p *problems) {
	c := &s.config
	network, address, err := parseListen(c.Listen, ":8080", "/run/authlimit.sock")
	if err != nil {
		p.add("LISTEN", err)
	}
	s.listenNetwork, s.listenAddress = network, address
	if c.PprofListen != "" {
		if err := checkHostPort(c.PprofListen); err != nil {
			p.add("PPROF_LISTEN", fmt.Errorf("%q is not host:port: %w", c.PprofListen, err))
		}
	}
}

// storeSettings reads the AUTHLIMIT_REDIS_* variables.
func storeSettings(s *settings, _ map[string]string, p *problems) {
	s.redisOptions, s.redisPlain, s.redisDisplay = redisSettings(&s.config, p.add)
}

// ruleSettings reads AUTHLIMIT_RULES or AUTHLIMIT_RULES_FILE (the default
// rule without either), with the rules' warnings and hash.
func ruleSettings(s *settings, environ map[string]string, p *problems) {
	c := &s.config
	_, rulesSet := environ[envPrefix+"RULES"]
	switch {
	case c.RulesFile != "" && rulesSet:
		p.add("RULES_FILE", errors.New("set together with AUTHLIMIT_RULES: set one of them"))
	case c.RulesFile != "":
		rs, err := loadRulesFile(c.RulesFile)
		if err != nil {
			for _, e := range unjoin(err) {
				p.add("RULES_FILE", e)
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
				p.add("RULES", e)
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
}

// clientSettings reads what finds and groups the client: the trusted
// proxies, the allow and block lists, the IP grouping and the headers
// that carry the original request.
func clientSettings(s *settings, _ map[string]string, p *problems) {
	c := &s.config
	if len(c.TrustedProxies) == 1 && strings.TrimSpace(c.TrustedProxies[0]) == "none" {
		s.trusted = nil
	} else {
		s.trusted = parsePrefixes("TRUSTED_PROXIES", c.TrustedProxies, p.add)
	}
	s.allow = parsePrefixes("ALLOW_CIDRS", c.AllowCIDRs, p.add)
	s.block = parsePrefixes("BLOCK_CIDRS", c.BlockCIDRs, p.add)
	if c.IPv4Prefix < 1 || c.IPv4Prefix > 32 {
		p.add("IPV4_PREFIX", fmt.Errorf("%d is not a prefix length from 1 to 32", c.IPv4Prefix))
	}
	if c.IPv6Prefix < 1 || c.IPv6Prefix > 128 {
		p.add("IPV6_PREFIX", fmt.Errorf("%d is not a prefix length from 1 to 128", c.IPv6Prefix))
	}
	for field, v := range map[string]string{"METHOD_HEADER": c.MethodHeader, "URI_HEADER": c.URIHeader, "HOST_HEADER": c.HostHeader, "URL_HEADER": c.URLHeader} {
		if field == "URL_HEADER" && v == "" {
			continue // optional
		}
		if v == "" || strings.ContainsAny(v, " \t\r\n:()<>@,;\\\"/[]?={}") {
			p.add(field, fmt.Errorf("%q is not a header name", v))
		}
	}
}

// decisionSettings reads how decisions are made and answered: the deny
// status, the fail mode and its divisor, the key prefix, the deny cache
// and the circuit breaker.
func decisionSettings(s *settings, environ map[string]string, p *problems) {
	c := &s.config
	if c.DenyStatus < 400 || c.DenyStatus > 599 {
		p.add("DENY_STATUS", fmt.Errorf("%d is not a 4xx or 5xx status (nginx auth_request passes only 401 and 403: use 403 and map it to 429)", c.DenyStatus))
	}
	var err error
	if s.failMode, err = guard.ParseFailMode(c.FailMode); err != nil {
		p.add("FAIL_MODE", err)
	}
	positive := func(field string, v int) {
		if v < 1 {
			p.add(field, fmt.Errorf("%d is not positive", v))
		}
	}
	positive("LOCAL_DIVISOR", c.LocalDivisor)
	positive("BREAKER_FAILURES", c.BreakerFailures)
	positive("MEMORY_MAX_KEYS", c.MemoryMaxKeys)
	if v := environ[envPrefix+"MAX_CONNS"]; strings.TrimSpace(v) != "" {
		positive("MAX_CONNS", c.MaxConns)
	}
	if c.KeyPrefix == "" || strings.ContainsAny(c.KeyPrefix, "{} \t\r\n") {
		p.add("KEY_PREFIX", fmt.Errorf("%q must be non-empty, without braces or spaces", c.KeyPrefix))
	}
	if c.DenyCacheSize < 0 {
		p.add("DENY_CACHE_SIZE", fmt.Errorf("%d is negative (0 disables the deny cache)", c.DenyCacheSize))
	}
	switch {
	case c.BreakerMaxBackoff < time.Millisecond || c.BreakerMaxBackoff > maxBreakerBackoff:
		p.add("BREAKER_MAX_BACKOFF", fmt.Errorf("%v is not between 1ms and %v: an open circuit waits up to this long between probes, and decisions must be back on Redis within 2s of Redis answering again", c.BreakerMaxBackoff, maxBreakerBackoff))
	case c.BreakerBackoff > c.BreakerMaxBackoff && c.BreakerBackoff <= maxBreakerBackoff && !p.unparsed["BREAKER_MAX_BACKOFF"]:
		p.add("BREAKER_BACKOFF", fmt.Errorf("%v is more than AUTHLIMIT_BREAKER_MAX_BACKOFF (%v): the gap between probes starts here and doubles up to that", c.BreakerBackoff, c.BreakerMaxBackoff))
	}
}

// limitSettings reads the bounds on time and size: the Redis budget and
// pool, the breaker's first backoff, the shutdown timeout, the largest
// header block.
func limitSettings(s *settings, _ map[string]string, p *problems) {
	c := &s.config
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
			p.add(d.field, fmt.Errorf("%v is not between %v and %v", d.v, d.min, d.max))
		}
	}
	if c.RedisPoolSize < 1 || c.RedisPoolSize > 256 {
		p.add("REDIS_POOL_SIZE", fmt.Errorf("%d is not between 1 and 256", c.RedisPoolSize))
	}
	if c.MaxHeaderBytes < 4096 || c.MaxHeaderBytes > 1<<20 {
		p.add("MAX_HEADER_BYTES", fmt.Errorf("%d is not between 4096 and 1048576", c.MaxHeaderBytes))
	}
}

// logSettings reads AUTHLIMIT_LOG_LEVEL and AUTHLIMIT_LOG_FORMAT.
func logSettings(s *settings, _ map[string]string, p *problems) {
	if err := s.logLevel.UnmarshalText([]byte(s.LogLevel)); err != nil {
		p.add("LOG_LEVEL", fmt.Errorf("%q is not debug, info, warn or error", s.LogLevel))
	}
	if s.LogFormat != "json" && s.LogFormat != "text" {
		p.add("LOG_FORMAT", fmt.Errorf("%q is not json or text", s.LogFormat))
	}
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
