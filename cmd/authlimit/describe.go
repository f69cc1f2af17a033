package main

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/authlimit/authlimit/guard"
)

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
	s.describeGRPCTLS(w)
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
	suffix := fmt.Sprintf(" (hash %s)", s.rulesHash)
	switch {
	case s.defaultRules:
		suffix = fmt.Sprintf(" (AUTHLIMIT_RULES unset: the default rule; hash %s)", s.rulesHash)
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
