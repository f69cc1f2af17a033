package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/store/redis"
)

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
	// Pipelines (the top limited clients' exchange) run on the pool
	// above: go-redis's own pool for them would dial beside it, during a
	// burst too.
	base.PipelinePoolSize = -1
	o := &goredis.UniversalOptions{
		Addrs:                 append([]string{base.Addr}, c.RedisAddrs...),
		Username:              base.Username,
		Password:              base.Password,
		DB:                    base.DB,
		TLSConfig:             base.TLSConfig,
		Dialer:                base.Dialer,
		PoolSize:              base.PoolSize,
		PipelinePoolSize:      base.PipelinePoolSize,
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
