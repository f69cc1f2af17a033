package main

import (
	"context"
	"time"

	"github.com/authlimit/authlimit/front/extauthz"
	"github.com/authlimit/authlimit/front/grpcwire"
	"github.com/authlimit/authlimit/rules"
)

// registerExtAuthz registers Envoy's external authorization service
// (envoy.service.auth.v3.Authorization/Check) on g: it decides with the
// engine, the rules and the trusted proxies /auth decides with.
func registerExtAuthz(g *grpcwire.Server, a *app, s *settings) error {
	srv, err := extauthz.New(extauthz.Options{Engine: a.engine, Proxies: rules.Proxies{Trusted: s.trusted}, Sleep: a.holdCtx})
	if err != nil {
		return err
	}
	return srv.Register(g)
}

// holdCtx holds a shaped Check for d, until its caller goes away, or until
// shutdown begins: like hold, it admits a request whose quota is spent
// rather than drop it.
func (a *app) holdCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-a.stopping:
	}
}
