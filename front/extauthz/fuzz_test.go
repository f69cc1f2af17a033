package extauthz

import (
	"context"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

// FuzzCheck sends requests with arbitrary attributes through Check: it
// never panics or hangs, and answers OK or a denied response with a status
// README lists, with a problem body.
func FuzzCheck(f *testing.F) {
	f.Add("203.0.113.7", "POST", "/login?x=1", "api.example.com", "10.0.0.1, 203.0.113.8", "k1", "3", true)
	f.Add("garbage", "", "", "", "", "", "", false)
	f.Add("[::1]:80", "\x00", "//x/../login;a", "API.example.com:8080", strings.Repeat("1.1.1.1,", 100), "a,b", "-1", false)
	rs, err := rules.Parse("name=per-ip limit=3/1m; name=login key=ip+header:X-Api-Key limit=2/1m path=/login on_missing=deny;" +
		"name=cost key=header:X-Api-Key limit=10/1m algorithm=token_bucket cost=header:X-Cost host=*.example.com")
	if err != nil {
		f.Fatal(err)
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	f.Cleanup(func() { _ = m.Close() })
	h := rulesettest.Holder(f, rs)
	g, err := guard.New(guard.Options{Store: m, Rules: h, DenyCacheSize: 100})
	if err != nil {
		f.Fatal(err)
	}
	e, err := decide.New(decide.Options{Rules: h, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429})
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(Options{Engine: e, Proxies: rules.Proxies{Trusted: trusted}, Sleep: func(context.Context, time.Duration) {}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, source, method, path, host, xff, apiKey, cost string, raw bool) {
		lines := []string{"x-forwarded-for", xff, "x-api-key", apiKey, "x-cost", cost}
		h := &authv3.AttributeContext_HttpRequest{Method: method, Path: path, Host: host}
		if raw {
			h.HeaderMap = &corev3.HeaderMap{}
			for i := 0; i < len(lines); i += 2 {
				h.HeaderMap.Headers = append(h.HeaderMap.Headers, &corev3.HeaderValue{Key: lines[i], RawValue: []byte(lines[i+1])})
			}
		} else {
			h.Headers = map[string]string{}
			for i := 0; i < len(lines); i += 2 {
				h.Headers[lines[i]] = lines[i+1]
			}
		}
		resp, err := s.Check(context.Background(), &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: source}}}},
			Request: &authv3.AttributeContext_Request{Http: h},
		}})
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		switch r := resp.GetHttpResponse().(type) {
		case *authv3.CheckResponse_OkResponse:
		case *authv3.CheckResponse_DeniedResponse:
			if c := r.DeniedResponse.GetStatus().GetCode(); c != 429 || !strings.HasPrefix(r.DeniedResponse.GetBody(), `{"type":"urn:authlimit:`) {
				t.Fatalf("denied %d %q", c, r.DeniedResponse.GetBody())
			}
		default:
			t.Fatalf("no HTTP response: %v", resp)
		}
	})
}
