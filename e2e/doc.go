// Package e2e runs authlimit behind real proxies (nginx auth_request, nginx
// with Lua, Caddy, Traefik), with real Redis, all as processes on loopback
// ports chosen at run time. Its tests carry the e2e build tag: make e2e.
package e2e
