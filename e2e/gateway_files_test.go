package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	securityv1beta1 "istio.io/api/security/v1beta1"
	istiosecurity "istio.io/client-go/pkg/apis/security/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	sigsjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"
)

// The Kubernetes recipes for Envoy Gateway and Istio cannot run here (no
// cluster): each object is decoded strictly into its project's own API
// type (Kubernetes, Gateway API, Envoy Gateway, Istio), an unknown or
// misplaced field failing, and what the recipes must say is asserted.

// k8sObjects maps apiVersion/kind to a new object of its project's type.
var k8sObjects = map[string]func() any{
	"apps/v1/Deployment": func() any { return new(appsv1.Deployment) },
	"v1/Service":         func() any { return new(corev1.Service) },
	"gateway.networking.k8s.io/v1/GatewayClass":     func() any { return new(gwapiv1.GatewayClass) },
	"gateway.networking.k8s.io/v1/Gateway":          func() any { return new(gwapiv1.Gateway) },
	"gateway.networking.k8s.io/v1/HTTPRoute":        func() any { return new(gwapiv1.HTTPRoute) },
	"gateway.envoyproxy.io/v1alpha1/SecurityPolicy": func() any { return new(egv1a1.SecurityPolicy) },
	"security.istio.io/v1/AuthorizationPolicy":      func() any { return new(istiosecurity.AuthorizationPolicy) },
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeObjects decodes every object of a multi-document YAML file
// strictly into its type, and returns them by kind/name.
func decodeObjects(t *testing.T, rel string) map[string]any {
	t.Helper()
	objs := map[string]any{}
	for _, doc := range docSeparator.Split(string(readRepo(t, rel)), -1) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if head.Kind == "" {
			continue // comments only
		}
		newObj, ok := k8sObjects[head.APIVersion+"/"+head.Kind]
		if !ok {
			t.Fatalf("%s: %s %s: no API type known for it here", rel, head.APIVersion, head.Kind)
		}
		obj := newObj()
		js, err := sigsyaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %s %s: %v", rel, head.Kind, head.Metadata.Name, err)
		}
		// As the API server decodes: field names in their exact case,
		// and none unknown or twice.
		strict, err := sigsjson.UnmarshalStrict(js, obj)
		if err == nil {
			err = errors.Join(strict...)
		}
		if err != nil {
			t.Fatalf("%s: %s %s: %v", rel, head.Kind, head.Metadata.Name, err)
		}
		if ap, ok := obj.(*istiosecurity.AuthorizationPolicy); ok {
			// Istio's own JSON decoding of a spec passes over unknown
			// fields: decode the spec again with protojson, which does
			// not.
			var raw struct {
				Spec json.RawMessage `json:"spec"`
			}
			if err := json.Unmarshal(js, &raw); err != nil {
				t.Fatal(err)
			}
			var spec securityv1beta1.AuthorizationPolicy
			if err := protojson.Unmarshal(raw.Spec, &spec); err != nil {
				t.Fatalf("%s: AuthorizationPolicy %s: spec: %v", rel, head.Metadata.Name, err)
			}
			proto.Reset(&ap.Spec)
			proto.Merge(&ap.Spec, &spec)
		}
		key := head.Kind + "/" + head.Metadata.Name
		if _, dup := objs[key]; dup {
			t.Fatalf("%s: %s twice", rel, key)
		}
		objs[key] = obj
	}
	return objs
}

func object[T any](t *testing.T, rel string, objs map[string]any, key string) T {
	t.Helper()
	o, ok := objs[key].(T)
	if !ok {
		t.Fatalf("%s: no %s", rel, key)
	}
	return o
}

// checkHeadersToAuthz asserts that a list of headers sent to authlimit
// holds X-Forwarded-For and X-Api-Key and none a client could forge.
func checkHeadersToAuthz(t *testing.T, where string, headers []string) {
	t.Helper()
	for _, want := range []string{"x-forwarded-for", "x-api-key"} {
		if !slices.Contains(headers, want) {
			t.Errorf("%s: %s is not sent to authlimit (%v)", where, want, headers)
		}
	}
	for _, h := range headers {
		if slices.Contains(forgeable, strings.ToLower(h)) {
			t.Errorf("%s: sends %s to authlimit: a client's own would be taken as the original request's", where, h)
		}
	}
}

// envoyAuthlimit is the authlimit Deployment and Service both recipes run.
type envoyAuthlimit struct {
	env   map[string]string
	ports map[int32]string // the Service's ports, to the container port names
}

// TestEnvoyAuthlimitDeployment: deploy/envoy-gateway/authlimit.yaml runs
// an authlimit that -check accepts, keeps its 429, serves gRPC on the port
// its Service names grpc (HTTP/2 in clear text), and has a Redis.
func TestEnvoyAuthlimitDeployment(t *testing.T) {
	a := loadEnvoyAuthlimit(t)
	env := map[string]string{}
	for k, v := range a.env {
		env[k] = v
	}
	out := check(t, env)
	if !strings.Contains(out, "deny status      429") {
		t.Errorf("authlimit for Envoy must keep its 429 (Envoy relays any status):\n%s", out)
	}
	if a.env["AUTHLIMIT_URL_HEADER"] != "" || a.env["AUTHLIMIT_URI_HEADER"] != "" || a.env["AUTHLIMIT_METHOD_HEADER"] != "" {
		t.Errorf("authlimit for Envoy reads the request line, not headers: %v", a.env)
	}
	if got := a.env["AUTHLIMIT_GRPC_LISTEN"]; got != ":8081" {
		t.Errorf("AUTHLIMIT_GRPC_LISTEN %q, want :8081 (the Service's grpc port)", got)
	}
	if a.ports[8080] != "http" || a.ports[8081] != "grpc" {
		t.Errorf("the authlimit Service's ports %v, want 8080 → http and 8081 → grpc", a.ports)
	}
}

func loadEnvoyAuthlimit(t *testing.T) envoyAuthlimit {
	t.Helper()
	const rel = "deploy/envoy-gateway/authlimit.yaml"
	objs := decodeObjects(t, rel)
	d := object[*appsv1.Deployment](t, rel, objs, "Deployment/authlimit")
	a := envoyAuthlimit{env: map[string]string{}, ports: map[int32]string{}}
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "authlimit" {
		t.Fatalf("%s: want one container, authlimit", rel)
	}
	for _, e := range cs[0].Env {
		a.env[e.Name] = e.Value
	}
	named := map[string]int32{}
	for _, p := range cs[0].Ports {
		named[p.Name] = p.ContainerPort
	}
	if named["http"] != 8080 || named["grpc"] != 8081 {
		t.Errorf("%s: container ports %v, want http 8080 and grpc 8081", rel, named)
	}
	if cs[0].LivenessProbe.HTTPGet.Path != "/healthz" || cs[0].ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: probes want /healthz and /readyz", rel)
	}
	if got := d.Spec.Template.Labels["sidecar.istio.io/inject"]; got != "false" {
		t.Errorf("%s: sidecar.istio.io/inject %q, want \"false\": behind a sidecar, authlimit would not see the gateway as its peer", rel, got)
	}
	svc := object[*corev1.Service](t, rel, objs, "Service/authlimit")
	for _, p := range svc.Spec.Ports {
		a.ports[p.Port] = p.TargetPort.StrVal
		if p.Name == "grpc" && (p.AppProtocol == nil || *p.AppProtocol != "kubernetes.io/h2c") {
			t.Errorf("%s: the grpc port's appProtocol is not kubernetes.io/h2c", rel)
		}
	}
	if !strings.HasPrefix(a.env["AUTHLIMIT_REDIS_URL"], "redis://authlimit-redis:") {
		t.Errorf("%s: AUTHLIMIT_REDIS_URL %q is not the authlimit-redis Service", rel, a.env["AUTHLIMIT_REDIS_URL"])
	}
	object[*corev1.Service](t, rel, objs, "Service/authlimit-redis")
	object[*appsv1.Deployment](t, rel, objs, "Deployment/authlimit-redis")
	return a
}

// TestEnvoyGatewayRecipes: each SecurityPolicy attaches to the HTTPRoute
// of gateway.yaml, whose Gateway and GatewayClass are Envoy Gateway's, and
// asks authlimit's Service on the port it serves that protocol on, with
// only the headers rules read.
func TestEnvoyGatewayRecipes(t *testing.T) {
	a := loadEnvoyAuthlimit(t)
	const gw = "deploy/envoy-gateway/gateway.yaml"
	objs := decodeObjects(t, gw)
	class := object[*gwapiv1.GatewayClass](t, gw, objs, "GatewayClass/eg")
	if class.Spec.ControllerName != "gateway.envoyproxy.io/gatewayclass-controller" {
		t.Errorf("%s: GatewayClass eg is %s's, not Envoy Gateway's", gw, class.Spec.ControllerName)
	}
	g := object[*gwapiv1.Gateway](t, gw, objs, "Gateway/eg")
	if string(g.Spec.GatewayClassName) != class.Name {
		t.Errorf("%s: Gateway eg's class %s, want %s", gw, g.Spec.GatewayClassName, class.Name)
	}
	route := object[*gwapiv1.HTTPRoute](t, gw, objs, "HTTPRoute/api")
	if len(route.Spec.ParentRefs) != 1 || string(route.Spec.ParentRefs[0].Name) != g.Name {
		t.Errorf("%s: HTTPRoute api is not attached to Gateway %s", gw, g.Name)
	}

	for _, tc := range []struct {
		file  string
		port  int32
		proto string
	}{
		{"deploy/envoy-gateway/securitypolicy-grpc.yaml", 8081, "grpc"},
		{"deploy/envoy-gateway/securitypolicy-http.yaml", 8080, "http"},
	} {
		t.Run(tc.proto, func(t *testing.T) {
			sp := object[*egv1a1.SecurityPolicy](t, tc.file, decodeObjects(t, tc.file), "SecurityPolicy/authlimit")
			refs := sp.Spec.TargetRefs
			if len(refs) != 1 || refs[0].Kind != "HTTPRoute" || refs[0].Group != gwapiv1.GroupName || string(refs[0].Name) != route.Name {
				t.Errorf("%s: targetRefs %v, want the HTTPRoute %s", tc.file, refs, route.Name)
			}
			ea := sp.Spec.ExtAuth
			if ea == nil {
				t.Fatalf("%s: no extAuth", tc.file)
			}
			var bc *egv1a1.BackendCluster
			switch tc.proto {
			case "grpc":
				if ea.GRPC == nil || ea.HTTP != nil {
					t.Fatalf("%s: want extAuth.grpc alone", tc.file)
				}
				bc = &ea.GRPC.BackendCluster
			case "http":
				if ea.HTTP == nil || ea.GRPC != nil {
					t.Fatalf("%s: want extAuth.http alone", tc.file)
				}
				bc = &ea.HTTP.BackendCluster
				if ea.HTTP.Path == nil || *ea.HTTP.Path != "/auth" {
					t.Errorf("%s: extAuth.http.path %v, want /auth", tc.file, ea.HTTP.Path)
				}
				for _, h := range rateLimitHeaders {
					if !slices.Contains(ea.HTTP.HeadersToBackend, h) {
						t.Errorf("%s: headersToBackend lacks %s", tc.file, h)
					}
				}
			}
			if len(bc.BackendRefs) != 1 || bc.BackendRefs[0].Name != "authlimit" || bc.BackendRefs[0].Port == nil || int32(*bc.BackendRefs[0].Port) != tc.port {
				t.Errorf("%s: backendRefs %v, want the Service authlimit on port %d", tc.file, bc.BackendRefs, tc.port)
			}
			if a.ports[tc.port] != tc.proto {
				t.Errorf("%s: authlimit's Service port %d is %q, want %s", tc.file, tc.port, a.ports[tc.port], tc.proto)
			}
			checkHeadersToAuthz(t, tc.file+": headersToExtAuth", ea.HeadersToExtAuth)
			if ea.FailOpen == nil || *ea.FailOpen {
				t.Errorf("%s: failOpen is not false", tc.file)
			}
			if ea.Timeout == nil {
				t.Errorf("%s: no timeout", tc.file)
			} else if d, err := time.ParseDuration(string(*ea.Timeout)); err != nil || d < 500*time.Millisecond {
				t.Errorf("%s: timeout %s: shorter than a store budget and a little shaping", tc.file, *ea.Timeout)
			}
		})
	}
}

// TestIstioRecipes: istiod-values.yaml's meshConfig decodes strictly into
// Istio's MeshConfig with an HTTP and a gRPC provider for authlimit's
// Service, and authorizationpolicy.yaml is a CUSTOM policy on the ingress
// gateway naming one of them.
func TestIstioRecipes(t *testing.T) {
	a := loadEnvoyAuthlimit(t)
	const values = "deploy/istio/istiod-values.yaml"
	var top map[string]json.RawMessage
	js, err := sigsyaml.YAMLToJSONStrict(readRepo(t, values))
	if err != nil {
		t.Fatalf("%s: %v", values, err)
	}
	if err := json.Unmarshal(js, &top); err != nil {
		t.Fatalf("%s: %v", values, err)
	}
	if len(top) != 1 || top["meshConfig"] == nil {
		t.Fatalf("%s: want meshConfig alone, have %d keys", values, len(top))
	}
	var mesh meshv1alpha1.MeshConfig
	if err := protojson.Unmarshal(top["meshConfig"], &mesh); err != nil {
		t.Fatalf("%s: meshConfig: %v", values, err)
	}
	const svc = "authlimit.default.svc.cluster.local"
	providers := map[string]bool{}
	for _, p := range mesh.GetExtensionProviders() {
		providers[p.GetName()] = true
		where := fmt.Sprintf("%s: provider %s", values, p.GetName())
		switch {
		case p.GetEnvoyExtAuthzHttp() != nil:
			h := p.GetEnvoyExtAuthzHttp()
			if h.GetService() != svc || h.GetPort() != 8080 || a.ports[8080] != "http" {
				t.Errorf("%s: %s:%d, want %s:8080, authlimit's http port", where, h.GetService(), h.GetPort(), svc)
			}
			if h.GetPathPrefix() != "/auth" {
				t.Errorf("%s: pathPrefix %q, want /auth", where, h.GetPathPrefix())
			}
			//lint:ignore SA1019 a check that the values avoid the deprecated field
			if len(h.GetIncludeHeadersInCheck()) > 0 {
				t.Errorf("%s: includeHeadersInCheck is deprecated: use includeRequestHeadersInCheck", where)
			}
			if len(h.GetIncludeAdditionalHeadersInCheck()) > 0 {
				t.Errorf("%s: includeAdditionalHeadersInCheck would add headers authlimit reads", where)
			}
			checkHeadersToAuthz(t, where+": includeRequestHeadersInCheck", h.GetIncludeRequestHeadersInCheck())
			for _, hd := range rateLimitHeaders {
				for name, list := range map[string][]string{
					"headersToUpstreamOnAllow":   h.GetHeadersToUpstreamOnAllow(),
					"headersToDownstreamOnAllow": h.GetHeadersToDownstreamOnAllow(),
					"headersToDownstreamOnDeny":  h.GetHeadersToDownstreamOnDeny(),
				} {
					if !slices.Contains(list, hd) {
						t.Errorf("%s: %s lacks %s", where, name, hd)
					}
				}
			}
			if !slices.Contains(h.GetHeadersToDownstreamOnDeny(), "retry-after") {
				t.Errorf("%s: headersToDownstreamOnDeny lacks retry-after", where)
			}
			if h.GetFailOpen() || h.GetStatusOnError() != "503" {
				t.Errorf("%s: failOpen %v, statusOnError %q; want false and 503", where, h.GetFailOpen(), h.GetStatusOnError())
			}
			if h.GetTimeout().AsDuration() < 500*time.Millisecond {
				t.Errorf("%s: timeout %v: shorter than a store budget and a little shaping", where, h.GetTimeout().AsDuration())
			}
		case p.GetEnvoyExtAuthzGrpc() != nil:
			g := p.GetEnvoyExtAuthzGrpc()
			if g.GetService() != svc || g.GetPort() != 8081 || a.ports[8081] != "grpc" {
				t.Errorf("%s: %s:%d, want %s:8081, authlimit's grpc port", where, g.GetService(), g.GetPort(), svc)
			}
			if g.GetFailOpen() || g.GetStatusOnError() != "503" {
				t.Errorf("%s: failOpen %v, statusOnError %q; want false and 503", where, g.GetFailOpen(), g.GetStatusOnError())
			}
		default:
			t.Errorf("%s: neither envoyExtAuthzHttp nor envoyExtAuthzGrpc", where)
		}
	}
	if !providers["authlimit-http"] || !providers["authlimit-grpc"] {
		t.Errorf("%s: providers %v, want authlimit-http and authlimit-grpc", values, providers)
	}

	const policy = "deploy/istio/authorizationpolicy.yaml"
	ap := object[*istiosecurity.AuthorizationPolicy](t, policy, decodeObjects(t, policy), "AuthorizationPolicy/authlimit")
	if ap.Spec.GetAction() != securityv1beta1.AuthorizationPolicy_CUSTOM {
		t.Errorf("%s: action %v, want CUSTOM", policy, ap.Spec.GetAction())
	}
	if name := ap.Spec.GetProvider().GetName(); !providers[name] {
		t.Errorf("%s: provider %q is none of istiod-values.yaml's", policy, name)
	}
	if ap.Namespace != "istio-system" || ap.Spec.GetSelector().GetMatchLabels()["istio"] != "ingressgateway" {
		t.Errorf("%s: not on the ingress gateway (namespace %q, selector %v)", policy, ap.Namespace, ap.Spec.GetSelector())
	}
	if rules := ap.Spec.GetRules(); len(rules) != 1 || len(rules[0].GetFrom()) != 0 || len(rules[0].GetTo()) != 0 || len(rules[0].GetWhen()) != 0 {
		t.Errorf("%s: want one empty rule (every request), have %v", policy, rules)
	}
}
