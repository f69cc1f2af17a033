package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/admin"
)

// adminSettings reads AUTHLIMIT_ADMIN_LISTEN and AUTHLIMIT_ADMIN_TOKEN: an
// admin API without a token would let anyone on its network reset
// quotas, so a listen address without one is a mistake.
func adminSettings(s *settings, _ map[string]string, p *problems) {
	c, problem := &s.config, p.add
	if c.AdminListen == "" {
		if c.AdminToken != "" {
			s.warnings = append(s.warnings, envPrefix+"ADMIN_TOKEN is set, AUTHLIMIT_ADMIN_LISTEN is not: there is no admin API")
		}
		return
	}
	if err := checkHostPort(c.AdminListen); err != nil {
		problem("ADMIN_LISTEN", fmt.Errorf("%q is not host:port (such as 127.0.0.1:9090): %w", c.AdminListen, err))
	}
	switch {
	case c.AdminToken == "":
		problem("ADMIN_TOKEN", errors.New("not set, and AUTHLIMIT_ADMIN_LISTEN is: the admin API needs a bearer token (at least 16 characters, say `openssl rand -hex 32`)"))
	case len(c.AdminToken) < minAdminToken:
		problem("ADMIN_TOKEN", fmt.Errorf("%d characters; at least %d are needed", len(c.AdminToken), minAdminToken))
	}
}

// minAdminToken is the shortest admin token taken: one that can be guessed
// is no protection.
const minAdminToken = 16

// describeAdmin adds the admin API to -check's output; the token is never
// shown.
func (s *settings) describeAdmin(w func(k, v string)) {
	if s.AdminListen == "" {
		w("admin api", "off (AUTHLIMIT_ADMIN_LISTEN unset)")
		return
	}
	w("admin api", s.AdminListen+" (bearer token from AUTHLIMIT_ADMIN_TOKEN, hidden)")
}

// adminFront is the admin API's server and listener.
type adminFront struct {
	server   *fasthttp.Server
	listener net.Listener
}

// newAdmin builds the admin API when AUTHLIMIT_ADMIN_LISTEN is set,
// listening at once so that a port in use stops authlimit at start.
func (a *app) newAdmin(s *settings) error {
	if s.AdminListen == "" {
		return nil
	}
	h, err := admin.New(admin.Options{
		Token:  s.AdminToken,
		Engine: a.engine,
		Store:  a.guard,
		Read:   a.handler.ReadInput,
		Config: func() admin.Config { return a.effectiveConfig(s) },
		Reload: func() []admin.ReloadResult {
			var out []admin.ReloadResult
			for _, r := range a.reload.reload("admin API") {
				out = append(out, admin.ReloadResult(r))
			}
			return out
		},
		Logger:   a.log,
		Timeout:  max(s.RedisTimeout, time.Second),
		Top:      a.denials,
		Circuits: a.guard.Circuits,
	})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", s.AdminListen)
	if err != nil {
		return fmt.Errorf("listen on AUTHLIMIT_ADMIN_LISTEN %s: %w", s.AdminListen, err)
	}
	a.admin = &adminFront{
		server: &fasthttp.Server{
			Handler:               h.Serve,
			Name:                  "authlimit-admin",
			NoDefaultServerHeader: true,
			ReadTimeout:           10 * time.Second,
			WriteTimeout:          10 * time.Second,
			IdleTimeout:           time.Minute,
			MaxRequestBodySize:    4 << 10,
			Logger:                fasthttpLogger{a.log},
		},
		listener: l,
	}
	a.closers = append(a.closers, l.Close)
	return nil
}

// effectiveConfig is the configuration in force: the settings read at
// start with the rules and the rate-limit configuration reloads put in
// force since, described as -check does, credentials hidden.
func (a *app) effectiveConfig(s *settings) admin.Config {
	rulesHash, rlsHash, at := a.reload.state()
	set := a.sets.Load()
	now := *s
	now.rules, now.rls = set.Rules(), set.RLS()
	now.rulesHash, now.rlsHash = rulesHash, rlsHash
	now.defaultRules = s.defaultRules && rulesHash == s.rulesHash
	hashes := map[string]string{configRules: rulesHash}
	if rlsHash != "" {
		hashes[configRLS] = rlsHash
	}
	return admin.Config{Text: now.describe(), Hashes: hashes, LoadedAt: at.UTC()}
}

// serveAdmin serves the admin API in the background; nil without it.
func (a *app) serveAdmin() <-chan error {
	if a.admin == nil {
		return nil
	}
	a.log.Info("admin api serving", "listen", a.admin.listener.Addr().String())
	served := make(chan error, 1)
	go func() { served <- a.admin.server.Serve(a.admin.listener) }()
	return served
}

// stopAdmin stops the admin API, waiting for its requests until ctx ends.
func (a *app) stopAdmin(ctx context.Context) {
	if a.admin != nil {
		_ = a.admin.server.ShutdownWithContext(ctx)
	}
}
