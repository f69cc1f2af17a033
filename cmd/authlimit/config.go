package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/handler"
)

// envPrefix starts every variable authlimit reads.
const envPrefix = "AUTHLIMIT_"

// config is authlimit's whole configuration, read from AUTHLIMIT_*
// variables. README documents every field; keep the two in step.
type config struct {
	Listen   string `env:"LISTEN" envDefault:":8080"`
	RedisURL string `env:"REDIS_URL"`
	// RedisMode picks the client: standalone, cluster or sentinel.
	RedisMode             string        `env:"REDIS_MODE" envDefault:"standalone"`
	RedisAddrs            []string      `env:"REDIS_ADDRS"`
	RedisMaster           string        `env:"REDIS_MASTER"`
	RedisSentinelUsername string        `env:"REDIS_SENTINEL_USERNAME"`
	RedisSentinelPassword string        `env:"REDIS_SENTINEL_PASSWORD"`
	RedisTimeout          time.Duration `env:"REDIS_TIMEOUT" envDefault:"50ms"`
	RedisPoolSize         int           `env:"REDIS_POOL_SIZE" envDefault:"0"`
	Rules                 string        `env:"RULES"`
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
	DenyCacheSize         int           `env:"DENY_CACHE_SIZE" envDefault:"100000"`
	BreakerFailures       int           `env:"BREAKER_FAILURES" envDefault:"5"`
	BreakerBackoff        time.Duration `env:"BREAKER_BACKOFF" envDefault:"1s"`
	BreakerMaxBackoff     time.Duration `env:"BREAKER_MAX_BACKOFF" envDefault:"30s"`
	MemoryMaxKeys         int           `env:"MEMORY_MAX_KEYS" envDefault:"1048576"`
	MaxHeaderBytes        int           `env:"MAX_HEADER_BYTES" envDefault:"32768"`
	ShutdownTimeout       time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"10s"`
	LogLevel              string        `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat             string        `env:"LOG_FORMAT" envDefault:"json"`
}

// settings is config validated and parsed into the types the program uses.
type settings struct {
	config
	rules          []*handler.Rule
	defaultRules   bool
	failMode       handler.FailMode
	trusted        []netip.Prefix
	allow, block   []netip.Prefix
	logLevel       slog.Level
	redisOptions   *redis.UniversalOptions // nil: the embedded memory store
	redisPlain     *redis.Options          // standalone mode's options
	redisDisplay   string                  // the store, credentials hidden
	listenNetwork  string
	listenAddress  string
	unknownEnvVars []string
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
	var c config
	var errs []error
	unparsed := map[string]bool{} // variables whose value could not be read
	problem := func(field string, err error) {
		if !unparsed[field] {
			errs = append(errs, &ConfigError{Var: envPrefix + field, Err: err})
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
	} else if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		problem("LISTEN", fmt.Errorf("%q is not host:port or unix:<path> (such as :8080 or 127.0.0.1:8080)", c.Listen))
	} else {
		s.listenNetwork, s.listenAddress = "tcp", c.Listen
	}

	s.redisOptions, s.redisPlain, s.redisDisplay = redisSettings(&c, problem)

	if strings.TrimSpace(c.Rules) == "" {
		c.Rules, s.defaultRules = handler.DefaultRules, true
	}
	rules, err := handler.ParseRules(c.Rules)
	if err != nil {
		for _, e := range unjoin(err) {
			problem("RULES", e)
		}
	}
	s.rules = rules

	s.trusted = parsePrefixes("TRUSTED_PROXIES", c.TrustedProxies, problem)
	s.allow = parsePrefixes("ALLOW_CIDRS", c.AllowCIDRs, problem)
	s.block = parsePrefixes("BLOCK_CIDRS", c.BlockCIDRs, problem)

	if c.DenyStatus < 400 || c.DenyStatus > 599 {
		problem("DENY_STATUS", fmt.Errorf("%d is not a 4xx or 5xx status (nginx auth_request passes only 401 and 403: use 403 and map it to 429)", c.DenyStatus))
	}
	if s.failMode, err = handler.ParseFailMode(c.FailMode); err != nil {
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
	if c.IPv4Prefix < 1 || c.IPv4Prefix > 32 {
		problem("IPV4_PREFIX", fmt.Errorf("%d is not a prefix length from 1 to 32", c.IPv4Prefix))
	}
	if c.IPv6Prefix < 1 || c.IPv6Prefix > 128 {
		problem("IPV6_PREFIX", fmt.Errorf("%d is not a prefix length from 1 to 128", c.IPv6Prefix))
	}
	if c.KeyPrefix == "" || strings.ContainsAny(c.KeyPrefix, "{} \t\r\n") {
		problem("KEY_PREFIX", fmt.Errorf("%q must be non-empty, without braces or spaces", c.KeyPrefix))
	}
	for field, v := range map[string]string{"METHOD_HEADER": c.MethodHeader, "URI_HEADER": c.URIHeader, "HOST_HEADER": c.HostHeader} {
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
		{"BREAKER_BACKOFF", c.BreakerBackoff, time.Millisecond, time.Hour},
		{"BREAKER_MAX_BACKOFF", c.BreakerMaxBackoff, c.BreakerBackoff, time.Hour},
		{"SHUTDOWN_TIMEOUT", c.ShutdownTimeout, 0, time.Hour},
	}
	for _, d := range durations {
		if d.v < d.min || d.v > d.max {
			problem(d.field, fmt.Errorf("%v is not between %v and %v", d.v, d.min, d.max))
		}
	}
	if c.RedisPoolSize < 0 {
		problem("REDIS_POOL_SIZE", fmt.Errorf("%d is negative (0 means 10 per CPU)", c.RedisPoolSize))
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

// redisSettings turns the REDIS_* variables into client options, or nil for
// the embedded memory store. Standalone mode also gets plain client options,
// which keep a unix:// URL's network.
func redisSettings(c *config, problem func(string, error)) (*redis.UniversalOptions, *redis.Options, string) {
	if c.RedisURL == "" {
		if c.RedisMode != "standalone" || len(c.RedisAddrs) > 0 || c.RedisMaster != "" {
			problem("REDIS_URL", errors.New("not set, but other AUTHLIMIT_REDIS_* variables are: set it, or unset them for the embedded store"))
		}
		return nil, nil, "memory (embedded, this instance only)"
	}
	base, err := redis.ParseURL(c.RedisURL)
	if err != nil {
		problem("REDIS_URL", fmt.Errorf("%s: %w", redactURL(c.RedisURL), err))
		return nil, nil, ""
	}
	for _, a := range c.RedisAddrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			problem("REDIS_ADDRS", fmt.Errorf("%q is not host:port", a))
		}
	}
	// Decisions carry a deadline: the client must respect it, and a pool
	// wait must not outlast it.
	base.ContextTimeoutEnabled = true
	base.DialTimeout = max(c.RedisTimeout, time.Second)
	base.PoolTimeout = c.RedisTimeout
	base.PoolSize = c.RedisPoolSize
	base.ClientName = "authlimit"
	// Within a budget of milliseconds, a refused dial should fail at once
	// (the fail mode answers) and a stale pooled connection be retried
	// once; go-redis's defaults retry for hundreds of milliseconds.
	base.DialerRetries = 1
	base.MaxRetries = 1
	o := &redis.UniversalOptions{
		Addrs:                 append([]string{base.Addr}, c.RedisAddrs...),
		Username:              base.Username,
		Password:              base.Password,
		DB:                    base.DB,
		TLSConfig:             base.TLSConfig,
		PoolSize:              base.PoolSize,
		ContextTimeoutEnabled: true,
		DialTimeout:           base.DialTimeout,
		PoolTimeout:           base.PoolTimeout,
		ClientName:            base.ClientName,
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
		return o, base, "redis standalone " + display
	case "cluster":
		if c.RedisMaster != "" {
			problem("REDIS_MASTER", errors.New("only for sentinel mode"))
		}
		if base.DB != 0 {
			problem("REDIS_URL", errors.New("Redis Cluster has only database 0"))
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
		o.MasterName = c.RedisMaster
		o.SentinelUsername = c.RedisSentinelUsername
		o.SentinelPassword = c.RedisSentinelPassword
		return o, nil, fmt.Sprintf("redis sentinel, master %q via %s", c.RedisMaster, strings.Join(o.Addrs, ", "))
	default:
		problem("REDIS_MODE", fmt.Errorf("%q is not standalone, cluster or sentinel", c.RedisMode))
		return nil, nil, ""
	}
}

// redactURL hides a URL's password.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func parsePrefixes(field string, vals []string, problem func(string, error)) []netip.Prefix {
	var out []netip.Prefix
	for _, v := range vals {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, p.Masked())
		} else if a, err := netip.ParseAddr(v); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		} else {
			problem(field, fmt.Errorf("%q is not a CIDR or an IP address", v))
		}
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
	best, bestD := "", 4
	for name := range known {
		if d := distance(k, name); d < bestD || d == bestD && name < best {
			best, bestD = name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

// distance is the Levenshtein distance of two short strings.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
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
	if s.failMode == handler.FailLocal {
		fm += fmt.Sprintf(" (limits divided by %d)", s.LocalDivisor)
	}
	if s.redisOptions == nil {
		fm += " (unused: the embedded store does not fail)"
	}
	w("fail mode", fm)
	if s.redisOptions != nil {
		w("redis timeout", s.RedisTimeout.String())
		w("circuit breaker", fmt.Sprintf("opens after %d failures, backoff %v to %v", s.BreakerFailures, s.BreakerBackoff, s.BreakerMaxBackoff))
	}
	w("deny status", fmt.Sprint(s.DenyStatus))
	w("trusted proxies", prefixes(s.trusted))
	w("allow", prefixes(s.allow))
	w("block", prefixes(s.block))
	w("ip grouping", fmt.Sprintf("IPv4 /%d, IPv6 /%d", s.IPv4Prefix, s.IPv6Prefix))
	w("key prefix", s.KeyPrefix)
	w("shadow", fmt.Sprint(s.Shadow))
	w("headers", fmt.Sprintf("method %s, uri %s, host %s", s.MethodHeader, s.URIHeader, s.HostHeader))
	w("deny cache", fmt.Sprintf("%d keys", s.DenyCacheSize))
	suffix := ""
	if s.defaultRules {
		suffix = " (AUTHLIMIT_RULES unset: the default rule)"
	}
	fmt.Fprintf(&b, "  rules%s:\n", suffix)
	for _, r := range s.rules {
		fmt.Fprintf(&b, "    %s\n", r)
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
