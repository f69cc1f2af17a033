package main

import (
	"google.golang.org/grpc"

	"github.com/authlimit/authlimit/front/extauthz"
	"github.com/authlimit/authlimit/rules"
)

// registerExtAuthz registers Envoy's external authorization service
// (envoy.service.auth.v3.Authorization/Check) on g: it decides with the
// engine, the rules and the trusted proxies /auth decides with.
func registerExtAuthz(g *grpc.Server, a *app, s *settings) error {
	srv, err := extauthz.New(extauthz.Options{Engine: a.engine, Proxies: rules.Proxies{Trusted: s.trusted}})
	if err != nil {
		return err
	}
	srv.Register(g)
	return nil
}
