//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/authlimit/authlimit/internal/tlstest"
)

// helmVersion is the Helm the suite builds when none is given.
const helmVersion = "v3.22.0"

// chartDir is the chart, from the repository's root.
const chartDir = helmChart

// The chart's tests run the real helm CLI (lint, template and the schema
// check it makes), built once from the Go module proxy like Traefik. Using
// Helm's Go packages in the test instead would put Helm's module graph
// (client-go, oras, containerd and more) into authlimit's go.mod, raising
// shared dependencies for every package; the binary keeps it apart, and
// is what users run.
var helmBuild struct {
	once sync.Once
	bin  string
	err  error
}

// helm returns a helm binary: $AUTHLIMIT_E2E_HELM, or the one cached under
// the user cache directory by version, or one built now from the Go module
// proxy and cached (several minutes, once).
func helm(t *testing.T) string {
	t.Helper()
	helmBuild.once.Do(func() { helmBuild.bin, helmBuild.err = buildHelm() })
	if helmBuild.err != nil {
		t.Fatal(helmBuild.err)
	}
	return helmBuild.bin
}

func buildHelm() (string, error) {
	if p := os.Getenv("AUTHLIMIT_E2E_HELM"); p != "" {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "authlimit", "helm-"+helmVersion)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	unlock, err := lockBuild(bin)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // built by another run while this one waited
	}
	fmt.Fprintf(os.Stderr, "e2e: building Helm %s into %s (several minutes, once)\n", helmVersion, bin)
	b, err := exec.Command("go", "mod", "download", "-json", "helm.sh/helm/v3@"+helmVersion).Output()
	if err != nil {
		return "", fmt.Errorf("download Helm %s: %v", helmVersion, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(b, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("download Helm %s: %s %v", helmVersion, mod.Error, err)
	}
	src, err := os.MkdirTemp("", "helm-src-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	if b, err := exec.Command("cp", "-r", mod.Dir+"/.", src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copy Helm source: %v %s", err, b)
	}
	_ = exec.Command("chmod", "-R", "u+w", src).Run()
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	// Helm's own Makefile stamps in the Kubernetes version of its
	// client-go: lint checks deprecated APIs against it, and template and
	// install render for it. Without, they take Kubernetes 1.20.
	env := append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	lv := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "k8s.io/client-go")
	lv.Dir, lv.Env = src, env
	b, err = lv.Output()
	if err != nil {
		return "", fmt.Errorf("Helm %s's client-go version: %v", helmVersion, err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "v%d.%d.", &major, &minor); err != nil {
		return "", fmt.Errorf("Helm %s's client-go version %q: %v", helmVersion, b, err)
	}
	var ldflags []string
	for _, pkg := range []string{"helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"} {
		ldflags = append(ldflags, fmt.Sprintf("-X %s.k8sVersionMajor=%d -X %s.k8sVersionMinor=%d", pkg, major+1, pkg, minor))
	}
	gb := exec.Command("go", "build", "-ldflags", strings.Join(ldflags, " "), "-o", bin+".tmp", "./cmd/helm")
	gb.Dir = src
	gb.Env = env
	if b, err := gb.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build Helm %s: %v\n%s", helmVersion, err, b)
	}
	return bin, os.Rename(bin+".tmp", bin)
}

// runHelm runs helm with args in the repository's root, with its own
// configuration and cache directories, and returns its output; err holds
// its standard error.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helm(t), args...)
	cmd.Dir = repoRoot(t)
	cmd.Env = []string{
		"HOME=" + home,
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
		"PATH=" + os.Getenv("PATH"),
	}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String()+out.String())
	}
	return out.String(), nil
}

// chartValuesFiles lists the chart's ci/*-values.yaml and examples/*-values.yaml.
func chartValuesFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"ci/*-values.yaml", "examples/*-values.yaml"} {
		m, err := filepath.Glob(filepath.Join(repoRoot(t), chartDir, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(filepath.Join(repoRoot(t), chartDir), f)
			files = append(files, rel)
		}
	}
	if len(files) == 0 {
		t.Fatal("the chart has no ci/*-values.yaml")
	}
	return files
}

// TestHelmLint: helm lint --strict passes with the defaults and with every
// values file.
func TestHelmLint(t *testing.T) {
	if out, err := runHelm(t, "lint", "--strict", chartDir); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(out, "0 chart(s) failed") {
		t.Fatalf("helm lint:\n%s", out)
	}
	for _, f := range chartValuesFiles(t) {
		t.Run(f, func(t *testing.T) {
			if _, err := runHelm(t, "lint", "--strict", chartDir, "-f", filepath.Join(chartDir, f)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// chartObjects is a helm template's output, strictly decoded by kind.
type chartObjects struct {
	deployment      *appsv1.Deployment
	service         *corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	pdb             *policyv1.PodDisruptionBudget
	hpa             *autoscalingv2.HorizontalPodAutoscaler
	networkPolicy   *networkingv1.NetworkPolicy
	serviceMonitor  *chartServiceMonitor
	prometheusRule  *chartPrometheusRule
	deploymentBytes []byte
}

// chartServiceMonitor is the part of the Prometheus Operator's ServiceMonitor
// the chart renders: decoding into it strictly fails on any other field,
// or a misspelt one.
type chartServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// chartPrometheusRule is the Prometheus Operator's PrometheusRule as the chart
// renders it, strictly.
type chartPrometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              promRuleGroups `json:"spec"`
}

// promRuleGroups is Prometheus's rule file: also deploy/prometheus/alerts.yml.
type promRuleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// helmTemplate runs helm template with args and decodes every object strictly:
// an unknown field, or a kind the chart should not render, fails.
func helmTemplate(t *testing.T, args ...string) *chartObjects {
	t.Helper()
	return helmTemplateAs(t, "rl", "edge", args...)
}

// helmTemplateAs is helmTemplate of a release of that name in that
// namespace.
func helmTemplateAs(t *testing.T, release, namespace string, args ...string) *chartObjects {
	t.Helper()
	out, err := runHelm(t, append([]string{"template", release, chartDir, "--namespace", namespace}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := &chartObjects{configMaps: map[string]*corev1.ConfigMap{}}
	for _, doc := range strings.Split(out, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---")
		if strings.TrimSpace(doc) == "" || yamlOnlyComments(doc) {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("rendered object does not parse: %v\n%s", err, doc)
		}
		var obj any
		key := tm.APIVersion + " " + tm.Kind
		switch key {
		case "apps/v1 Deployment":
			if r.deployment != nil {
				t.Fatal("two Deployments")
			}
			r.deployment = &appsv1.Deployment{}
			obj = r.deployment
			r.deploymentBytes = []byte(doc)
		case "v1 Service":
			r.service = &corev1.Service{}
			obj = r.service
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "policy/v1 PodDisruptionBudget":
			r.pdb = &policyv1.PodDisruptionBudget{}
			obj = r.pdb
		case "autoscaling/v2 HorizontalPodAutoscaler":
			r.hpa = &autoscalingv2.HorizontalPodAutoscaler{}
			obj = r.hpa
		case "networking.k8s.io/v1 NetworkPolicy":
			r.networkPolicy = &networkingv1.NetworkPolicy{}
			obj = r.networkPolicy
		case "monitoring.coreos.com/v1 ServiceMonitor":
			r.serviceMonitor = &chartServiceMonitor{}
			obj = r.serviceMonitor
		case "monitoring.coreos.com/v1 PrometheusRule":
			r.prometheusRule = &chartPrometheusRule{}
			obj = r.prometheusRule
		default:
			t.Fatalf("the chart renders %q, which the test does not know:\n%s", key, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s does not decode strictly: %v\n%s", key, err, doc)
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			r.configMaps[cm.Name] = cm
		}
	}
	if r.deployment == nil || r.service == nil {
		t.Fatalf("no Deployment or Service rendered:\n%s", out)
	}
	return r
}

func yamlOnlyComments(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// chartWant is what a values file must render.
type chartWant struct {
	divisor        string
	pdb, hpa       bool
	serviceMonitor bool
	prometheusRule bool
	networkPolicy  bool
	redis          bool
	rulesMap       string // the rules ConfigMap's name
	rlsMap         string // envoyproxy/ratelimit's ConfigMap, if any
	extraPorts     []string
}

// TestHelmTemplate renders every values file, decodes every object
// strictly into Kubernetes' own types, checks what the chart promises,
// and runs authlimit -check on the environment the pod would get.
func TestHelmTemplate(t *testing.T) {
	wants := map[string]chartWant{
		"ci/default-values.yaml":        {divisor: "2", pdb: true, rulesMap: "rl-authlimit-rules"},
		"ci/single-replica-values.yaml": {divisor: "1", rulesMap: "rl-authlimit-rules"},
		"ci/redis-values.yaml":          {divisor: "3", pdb: true, redis: true, rulesMap: "rl-authlimit-rules"},
		"ci/sentinel-values.yaml":       {divisor: "2", pdb: true, redis: true, rulesMap: "rl-authlimit-rules"},
		"ci/autoscaling-values.yaml":    {divisor: "8", pdb: true, hpa: true, redis: true, rulesMap: "rl-authlimit-rules"},
		"ci/monitoring-values.yaml":     {divisor: "2", pdb: true, serviceMonitor: true, prometheusRule: true, networkPolicy: true, redis: true, rulesMap: "ratelimit-rules"},
		"ci/existing-rules-values.yaml": {divisor: "4", pdb: true, rulesMap: "my-authlimit-rules"},
		"examples/sidecar-values.yaml":  {divisor: "2", pdb: true, redis: true, rulesMap: "rl-authlimit-rules", extraPorts: []string{"proxy"}},
		"ci/admin-values.yaml":          {divisor: "2", pdb: true, networkPolicy: true, rulesMap: "rl-authlimit-rules", extraPorts: []string{"admin"}},
		"ci/rls-values.yaml":            {divisor: "2", pdb: true, redis: true, rulesMap: "rl-authlimit-rules", rlsMap: "ratelimit-config", extraPorts: []string{"grpc"}},
		"examples/envoy-values.yaml":    {divisor: "2", pdb: true, redis: true, rulesMap: "rl-authlimit-rules", extraPorts: []string{"grpc"}},
		"ci/grpc-peers-values.yaml":     {divisor: "2", pdb: true, networkPolicy: true, rulesMap: "rl-authlimit-rules", extraPorts: []string{"grpc"}},
		"ci/grpc-tls-values.yaml":       {divisor: "2", pdb: true, rulesMap: "rl-authlimit-rules", extraPorts: []string{"grpc"}},
	}
	files := chartValuesFiles(t)
	for _, f := range files {
		if _, ok := wants[f]; !ok {
			t.Errorf("%s has no expectations in TestHelmTemplate", f)
		}
	}
	for _, f := range files {
		w := wants[f]
		t.Run(f, func(t *testing.T) {
			r := helmTemplate(t, "-f", filepath.Join(chartDir, f))
			checkChartWorkload(t, r, w)
			if got := r.pdb != nil; got != w.pdb {
				t.Errorf("PodDisruptionBudget rendered: %v, want %v", got, w.pdb)
			}
			if got := r.hpa != nil; got != w.hpa {
				t.Errorf("HorizontalPodAutoscaler rendered: %v, want %v", got, w.hpa)
			}
			if got := r.serviceMonitor != nil; got != w.serviceMonitor {
				t.Errorf("ServiceMonitor rendered: %v, want %v", got, w.serviceMonitor)
			}
			if got := r.prometheusRule != nil; got != w.prometheusRule {
				t.Errorf("PrometheusRule rendered: %v, want %v", got, w.prometheusRule)
			}
			if got := r.networkPolicy != nil; got != w.networkPolicy {
				t.Errorf("NetworkPolicy rendered: %v, want %v", got, w.networkPolicy)
			}
			if r.pdb != nil {
				checkChartSelects(t, "PodDisruptionBudget", r.pdb.Spec.Selector, r.deployment)
			}
			if r.hpa != nil {
				if r.deployment.Spec.Replicas != nil {
					t.Error("with an autoscaler the Deployment still sets replicas, which each upgrade would reset")
				}
				if got := r.hpa.Spec.ScaleTargetRef.Name; got != r.deployment.Name {
					t.Errorf("the autoscaler scales %q, not the Deployment %q", got, r.deployment.Name)
				}
			}
			if r.networkPolicy != nil {
				checkChartSelects(t, "NetworkPolicy", &r.networkPolicy.Spec.PodSelector, r.deployment)
				if len(r.networkPolicy.Spec.Ingress) == 0 {
					t.Error("the NetworkPolicy lets no peer in")
				}
			}
			if r.serviceMonitor != nil {
				checkChartSelects(t, "ServiceMonitor (of the Service's labels)", &r.serviceMonitor.Spec.Selector, &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: r.service.Labels}}}})
				if ep := r.serviceMonitor.Spec.Endpoints; len(ep) != 1 || ep[0].Port != "http" || ep[0].Path != "/metrics" {
					t.Errorf("ServiceMonitor endpoints = %+v, want the http port's /metrics", ep)
				}
			}
			if r.prometheusRule != nil {
				checkChartAlerts(t, r.prometheusRule, r.service.Name)
			}
			var ports []string
			for _, p := range r.service.Spec.Ports {
				ports = append(ports, p.Name)
			}
			if got, want := ports, append([]string{"http"}, w.extraPorts...); !reflect.DeepEqual(got, want) {
				t.Errorf("Service ports = %v, want %v", got, want)
			}
			checkChartEnv(t, r, w)
		})
	}
}

// checkChartSelects checks that sel selects the Deployment's pods.
func checkChartSelects(t *testing.T, what string, sel *metav1.LabelSelector, d *appsv1.Deployment) {
	t.Helper()
	if sel == nil || len(sel.MatchLabels) == 0 {
		t.Errorf("%s has no selector", what)
		return
	}
	for k, v := range sel.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("%s selects %s=%s, which the pods do not have (%v)", what, k, v, d.Spec.Template.Labels)
		}
	}
}

// checkChartWorkload checks the Deployment's pod: restricted security, probes,
// resources, spread, the rules mounted as a directory.
func checkChartWorkload(t *testing.T, r *chartObjects, w chartWant) {
	t.Helper()
	d := r.deployment
	checkChartSelects(t, "the Deployment", d.Spec.Selector, d)
	checkChartSelects(t, "the Service", &metav1.LabelSelector{MatchLabels: r.service.Spec.Selector}, d)
	pod := d.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the pod mounts a service account token")
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v is not non-root with seccomp RuntimeDefault", psc)
	}
	var c *corev1.Container
	for i := range pod.Containers {
		if pod.Containers[i].Name == "authlimit" {
			c = &pod.Containers[i]
		}
	}
	if c == nil {
		t.Fatal("no authlimit container")
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container security context %+v is not restricted", sc)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe = %+v, want GET %s on port http", p.name, p.probe, p.path)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v lack a CPU request or a memory limit", c.Resources)
	}
	if len(pod.TopologySpreadConstraints) == 0 {
		t.Error("no topology spread")
	}
	for _, tc := range pod.TopologySpreadConstraints {
		checkChartSelects(t, "a topology spread constraint", tc.LabelSelector, d)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.Name != "rules" {
			continue
		}
		mounted = true
		if m.SubPath != "" {
			t.Errorf("the rules are mounted with subPath %q: the kubelet never updates a subPath mount", m.SubPath)
		}
	}
	if !mounted {
		t.Error("the rules are not mounted")
	}
	rlsMounted := ""
	for _, m := range c.VolumeMounts {
		if m.Name == "rls" {
			rlsMounted = m.MountPath
			if m.SubPath != "" {
				t.Errorf("envoyproxy/ratelimit's ConfigMap is mounted with subPath %q: the kubelet never updates a subPath mount", m.SubPath)
			}
		}
	}
	if (rlsMounted != "") != (w.rlsMap != "") {
		t.Errorf("envoyproxy/ratelimit's ConfigMap mounted at %q, want it mounted: %v", rlsMounted, w.rlsMap != "")
	}
	rlsVolume := ""
	for _, v := range pod.Volumes {
		if v.Name == "rules" && (v.ConfigMap == nil || v.ConfigMap.Name != w.rulesMap) {
			t.Errorf("the rules volume is %+v, want ConfigMap %s", v.VolumeSource, w.rulesMap)
		}
		if v.Name == "rls" {
			if v.ConfigMap == nil {
				t.Errorf("the rls volume is %+v, not a ConfigMap", v.VolumeSource)
			} else {
				rlsVolume = v.ConfigMap.Name
			}
		}
	}
	if rlsVolume != w.rlsMap {
		t.Errorf("the rls volume is ConfigMap %q, want %q", rlsVolume, w.rlsMap)
	}
	if _, ok := d.Spec.Template.Annotations["checksum/config"]; !ok {
		t.Error("the pod has no checksum/config annotation")
	}
}

// checkChartEnv builds the environment the authlimit container would get and
// runs authlimit -check on it, with the rules ConfigMap written where the
// pod mounts it (its own, or for one kept elsewhere, the chart's default
// rules).
func checkChartEnv(t *testing.T, r *chartObjects, w chartWant) {
	t.Helper()
	c := r.deployment.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	dir := t.TempDir()
	var mountPath string
	for _, m := range c.VolumeMounts {
		if m.Name == "rules" {
			mountPath = m.MountPath
		}
	}
	rules := "name=per-ip key=ip limit=100/1m\n"
	if cm, ok := r.configMaps[w.rulesMap]; ok {
		rules = cm.Data["rules.conf"]
	} else if w.rulesMap == "rl-authlimit-rules" || w.rulesMap == "ratelimit-rules" {
		t.Fatalf("no ConfigMap %s rendered", w.rulesMap)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.conf"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			switch e.Name {
			case "AUTHLIMIT_REDIS_URL":
				env[e.Name] = "redis://user:secret@redis:6379/0"
			case "AUTHLIMIT_ADMIN_TOKEN":
				env[e.Name] = "a-secret-admin-token-of-32-chars"
			default:
				env[e.Name] = "secret"
			}
		case e.ValueFrom != nil:
			t.Errorf("%s comes from %+v", e.Name, e.ValueFrom)
		default:
			env[e.Name] = e.Value
		}
	}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			t.Fatalf("envFrom %+v is not a ConfigMap", from)
		}
		cm, ok := r.configMaps[from.ConfigMapRef.Name]
		if !ok {
			t.Fatalf("envFrom names ConfigMap %s, which is not rendered", from.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			if _, dup := env[k]; dup {
				t.Errorf("%s is set both in env and in ConfigMap %s", k, cm.Name)
			}
			env[k] = v
		}
	}
	if got, want := env["AUTHLIMIT_LOCAL_DIVISOR"], w.divisor; got != want {
		t.Errorf("AUTHLIMIT_LOCAL_DIVISOR = %q, want %q", got, want)
	}
	if _, got := env["AUTHLIMIT_REDIS_URL"]; got != w.redis {
		t.Errorf("AUTHLIMIT_REDIS_URL set: %v, want %v", got, w.redis)
	}
	if got, want := env["AUTHLIMIT_RULES_FILE"], mountPath+"/rules.conf"; got != want {
		t.Errorf("AUTHLIMIT_RULES_FILE = %q, want %q, in the mounted directory", got, want)
	}
	env["AUTHLIMIT_RULES_FILE"] = filepath.Join(dir, "rules.conf")
	if rls, ok := env["AUTHLIMIT_RLS_CONFIG"]; ok {
		// The mounted directory of envoyproxy/ratelimit's ConfigMap: the
		// repository's example of its configuration, under a ConfigMap
		// key's name.
		var mountPath string
		for _, m := range c.VolumeMounts {
			if m.Name == "rls" {
				mountPath = m.MountPath
			}
		}
		if rls != mountPath {
			t.Errorf("AUTHLIMIT_RLS_CONFIG = %q, want the mounted directory %q", rls, mountPath)
		}
		rlsDir := filepath.Join(t.TempDir(), "rls")
		if err := os.Mkdir(rlsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rlsDir, "config.yaml"), readRepo(t, "envoy/ratelimit.yaml"), 0o644); err != nil {
			t.Fatal(err)
		}
		env["AUTHLIMIT_RLS_CONFIG"] = rlsDir
	}
	checkChartTLSFiles(t, c, env)
	out := checkChartEnvWithBinary(t, env)
	if !strings.Contains(out, "from "+env["AUTHLIMIT_RULES_FILE"]) {
		t.Errorf("-check does not say the rules come from the file:\n%s", out)
	}
}

// checkChartTLSFiles checks that the gRPC port's TLS files are the
// mounted Secret's, and points them at certificates of a test CA, as the
// Secret would hold them.
func checkChartTLSFiles(t *testing.T, c corev1.Container, env map[string]string) {
	t.Helper()
	vars := map[string]string{"AUTHLIMIT_GRPC_TLS_CERT": "tls.crt", "AUTHLIMIT_GRPC_TLS_KEY": "tls.key", "AUTHLIMIT_GRPC_TLS_CLIENT_CA": "ca.crt"}
	var mountPath string
	for _, m := range c.VolumeMounts {
		if m.Name == "grpc-tls" {
			mountPath = m.MountPath
		}
	}
	ca := tlstest.NewCA(t, "chart CA")
	srv := ca.Server(t, 5)
	dir := t.TempDir()
	files := map[string][]byte{"tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM, "ca.crt": ca.PEM}
	for v, name := range vars {
		p, ok := env[v]
		if !ok {
			continue
		}
		if mountPath == "" || p != mountPath+"/"+name {
			t.Errorf("%s = %q, want %s in the mounted Secret (%q)", v, p, name, mountPath)
		}
		env[v] = filepath.Join(dir, name)
		if err := os.WriteFile(env[v], files[name], 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// checkChartEnvWithBinary runs the suite's authlimit -check with env alone.
func checkChartEnvWithBinary(t *testing.T, env map[string]string) string {
	t.Helper()
	cmd := exec.Command(bins.authlimit, "-check")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("authlimit -check rejects the rendered environment %v: %v\n%s", env, err, out)
	}
	return string(out)
}

// checkAlerts: the PrometheusRule holds deploy/prometheus/alerts.yml's
// alerts, AuthlimitDown watching the release's Service as its job.
func checkChartAlerts(t *testing.T, pr *chartPrometheusRule, job string) {
	t.Helper()
	var file promRuleGroups
	if err := yaml.UnmarshalStrict(readRepo(t, "deploy/prometheus/alerts.yml"), &file); err != nil {
		t.Fatalf("deploy/prometheus/alerts.yml: %v", err)
	}
	if len(file.Groups) == 0 || len(file.Groups[0].Rules) < 5 {
		t.Fatalf("deploy/prometheus/alerts.yml has too few alerts: %+v", file)
	}
	for gi := range file.Groups {
		for ri := range file.Groups[gi].Rules {
			e := &file.Groups[gi].Rules[ri].Expr
			*e = strings.ReplaceAll(*e, `job="authlimit"`, fmt.Sprintf("job=%q", job))
		}
	}
	if !reflect.DeepEqual(pr.Spec, file) {
		got, _ := yaml.Marshal(pr.Spec)
		want, _ := yaml.Marshal(file)
		t.Errorf("PrometheusRule's groups differ from deploy/prometheus/alerts.yml's:\n got: %s\nwant: %s", got, want)
	}
	if !strings.Contains(fmt.Sprint(pr.Spec), fmt.Sprintf("up{job=%q}", job)) {
		t.Errorf("AuthlimitDown does not watch job %q", job)
	}
}

// TestHelmRulesReloadWithoutRollout: changing the rules changes the rules
// ConfigMap and nothing of the Deployment (authlimit reloads them, no pod
// restarts); changing a setting read at start changes the pods' checksum
// annotation, which rolls them; so does the replica count, through the
// divisor.
func TestHelmRulesReloadWithoutRollout(t *testing.T) {
	base := helmTemplate(t)
	otherRules := helmTemplate(t, "--set", "rules=name=x key=ip limit=5/1s")
	if !bytes.Equal(base.deploymentBytes, otherRules.deploymentBytes) {
		t.Errorf("new rules change the Deployment, which would restart the pods:\n%s\n---\n%s", base.deploymentBytes, otherRules.deploymentBytes)
	}
	if got := otherRules.configMaps["rl-authlimit-rules"].Data["rules.conf"]; !strings.Contains(got, "name=x key=ip limit=5/1s") {
		t.Errorf("the rules ConfigMap holds %q", got)
	}
	otherEnv := helmTemplate(t, "--set", "env.AUTHLIMIT_DENY_STATUS=403")
	a, b := base.deployment.Spec.Template.Annotations["checksum/config"], otherEnv.deployment.Spec.Template.Annotations["checksum/config"]
	if a == b {
		t.Errorf("a new AUTHLIMIT_DENY_STATUS leaves checksum/config at %s: the pods would keep the old setting", a)
	}
}

// TestHelmGRPC: grpc.enabled adds the gRPC port to the pod and the Service
// and sets AUTHLIMIT_GRPC_LISTEN to it.
func TestHelmGRPC(t *testing.T) {
	r := helmTemplate(t, "--set", "grpc.enabled=true")
	var ports []string
	for _, p := range r.service.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%s:%d->%s", p.Name, p.Port, p.TargetPort.String()))
	}
	if got, want := strings.Join(ports, ","), "http:8080->http,grpc:8081->grpc"; got != want {
		t.Errorf("Service ports = %s, want %s", got, want)
	}
	// As deploy/envoy-gateway/authlimit.yaml: Envoy Gateway and Istio
	// speak HTTP/2 in clear text to a port marked so.
	if p := r.service.Spec.Ports[1]; p.AppProtocol == nil || *p.AppProtocol != "kubernetes.io/h2c" {
		t.Errorf("the grpc port's appProtocol is %v, want kubernetes.io/h2c", p.AppProtocol)
	}
	c := r.deployment.Spec.Template.Spec.Containers[0]
	listen := ""
	for _, e := range c.Env {
		if e.Name == "AUTHLIMIT_GRPC_LISTEN" {
			listen = e.Value
		}
	}
	var containerPorts []string
	for _, p := range c.Ports {
		containerPorts = append(containerPorts, fmt.Sprintf("%s:%d", p.Name, p.ContainerPort))
	}
	if listen != ":8081" || !reflect.DeepEqual(containerPorts, []string{"http:8080", "grpc:8081"}) {
		t.Errorf("AUTHLIMIT_GRPC_LISTEN = %q, container ports %v; want :8081 on port grpc 8081", listen, containerPorts)
	}
	if c := r.deployment.Spec.Template.Spec.Containers[0]; len(c.VolumeMounts) != 1 {
		t.Errorf("without grpc.tls the pod mounts %v, want the rules alone", c.VolumeMounts)
	}
	// With TLS: the Secret mounted as a directory (so that its renewal
	// reaches the pod), its files named, and no h2c on the Service.
	tr := helmTemplate(t, "--set", "grpc.enabled=true", "--set", "grpc.tls.existingSecret=grpc-certs", "--set", "grpc.tls.clientCA=true")
	if p := tr.service.Spec.Ports[1]; p.AppProtocol != nil {
		t.Errorf("with TLS the grpc port's appProtocol is %q, want none (kubernetes.io/h2c says cleartext)", *p.AppProtocol)
	}
	tc := tr.deployment.Spec.Template.Spec.Containers[0]
	var mounted, secret string
	for _, m := range tc.VolumeMounts {
		if m.Name == "grpc-tls" && m.SubPath == "" && m.ReadOnly {
			mounted = m.MountPath
		}
	}
	for _, v := range tr.deployment.Spec.Template.Spec.Volumes {
		if v.Name == "grpc-tls" && v.Secret != nil {
			secret = v.Secret.SecretName
		}
	}
	if mounted == "" || secret != "grpc-certs" {
		t.Errorf("with grpc.tls the Secret %q is mounted at %q, want grpc-certs mounted whole, read-only", secret, mounted)
	}
	tlsEnv := map[string]string{}
	for _, e := range tc.Env {
		tlsEnv[e.Name] = e.Value
	}
	for v, name := range map[string]string{"AUTHLIMIT_GRPC_TLS_CERT": "tls.crt", "AUTHLIMIT_GRPC_TLS_KEY": "tls.key", "AUTHLIMIT_GRPC_TLS_CLIENT_CA": "ca.crt"} {
		if got := tlsEnv[v]; got != mounted+"/"+name {
			t.Errorf("%s = %q, want %s/%s", v, got, mounted, name)
		}
	}
	// The gRPC front's variable is checked by authlimit itself once it
	// knows it (the configuration reference lists it).
	if strings.Contains(string(readRepo(t, "docs/configuration.md")), "| `AUTHLIMIT_GRPC_LISTEN`") {
		checkChartEnv(t, r, chartWant{divisor: "2", rulesMap: "rl-authlimit-rules"})
	}
}

// TestHelmGRPCPeers: networkPolicy.grpcFrom opens the gRPC port to the
// gateway's pods alone, and the decision port to networkPolicy.from
// alone; without it, both go to networkPolicy.from.
func TestHelmGRPCPeers(t *testing.T) {
	peers := func(r *chartObjects) map[string][]string {
		out := map[string][]string{}
		for _, in := range r.networkPolicy.Spec.Ingress {
			for _, p := range in.Ports {
				for _, f := range in.From {
					out[p.Port.String()] = append(out[p.Port.String()], f.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
				}
			}
		}
		return out
	}
	r := helmTemplate(t, "-f", filepath.Join(chartDir, "ci/grpc-peers-values.yaml"))
	if got, want := peers(r), map[string][]string{"http": {"ingress-nginx"}, "grpc": {"envoy-gateway-system"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("with grpcFrom, the ports are open to %v, want %v", got, want)
	}
	r = helmTemplate(t, "-f", filepath.Join(chartDir, "ci/grpc-peers-values.yaml"), "--set", "networkPolicy.grpcFrom=null")
	if got, want := peers(r), map[string][]string{"http": {"ingress-nginx"}, "grpc": {"ingress-nginx"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("without grpcFrom, the ports are open to %v, want %v", got, want)
	}
}

// TestHelmAdmin: admin.enabled adds the admin port to the pod and the
// Service, sets AUTHLIMIT_ADMIN_LISTEN to it and AUTHLIMIT_ADMIN_TOKEN
// from the Secret, and lets only networkPolicy.adminFrom reach it.
func TestHelmAdmin(t *testing.T) {
	r := helmTemplate(t, "-f", filepath.Join(chartDir, "ci/admin-values.yaml"))
	var ports []string
	for _, p := range r.service.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%s:%d->%s", p.Name, p.Port, p.TargetPort.String()))
	}
	if got, want := strings.Join(ports, ","), "http:8080->http,admin:9090->admin"; got != want {
		t.Errorf("Service ports = %s, want %s", got, want)
	}
	c := r.deployment.Spec.Template.Spec.Containers[0]
	var listen, secret, key string
	for _, e := range c.Env {
		switch e.Name {
		case "AUTHLIMIT_ADMIN_LISTEN":
			listen = e.Value
		case "AUTHLIMIT_ADMIN_TOKEN":
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Fatalf("AUTHLIMIT_ADMIN_TOKEN is not from a Secret: %+v", e)
			}
			secret, key = e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
		}
	}
	var containerPorts []string
	for _, p := range c.Ports {
		containerPorts = append(containerPorts, fmt.Sprintf("%s:%d", p.Name, p.ContainerPort))
	}
	if listen != ":9090" || secret != "authlimit-admin" || key != "token" || !reflect.DeepEqual(containerPorts, []string{"http:8080", "admin:9090"}) {
		t.Errorf("AUTHLIMIT_ADMIN_LISTEN = %q, token from %s/%s, container ports %v; want :9090 on port admin, the token from authlimit-admin/token", listen, secret, key, containerPorts)
	}
	adminPeers := 0
	for _, in := range r.networkPolicy.Spec.Ingress {
		for _, p := range in.Ports {
			if p.Port != nil && p.Port.String() == "admin" {
				adminPeers++
				if len(in.From) != 1 || in.From[0].NamespaceSelector == nil || in.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "ops" {
					t.Errorf("the admin port is open to %+v, want the ops namespace alone", in.From)
				}
			} else if len(in.From) > 0 && in.From[0].NamespaceSelector != nil && in.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "ops" {
				t.Errorf("the operators reach port %s too", p.Port.String())
			}
		}
	}
	if adminPeers != 1 {
		t.Errorf("%d NetworkPolicy rules open the admin port, want 1", adminPeers)
	}
	off := helmTemplate(t)
	for _, e := range off.deployment.Spec.Template.Spec.Containers[0].Env {
		if strings.HasPrefix(e.Name, "AUTHLIMIT_ADMIN_") {
			t.Errorf("without admin.enabled the chart sets %s", e.Name)
		}
	}
}

// TestHelmSchemaRejects: values.schema.json, and the chart's own checks,
// refuse bad values with a message naming them where they are (helm's
// "at '/path'"): the env names are properties, not propertyNames, whose
// errors helm reports at a random other value.
func TestHelmSchemaRejects(t *testing.T) {
	tests := []struct {
		name, values, want string
	}{
		{"unknown top-level key", "replicas: 3\n", "additional properties 'replicas' not allowed"},
		{"zero replicas", "replicaCount: 0\n", "at '/replicaCount'"},
		{"replicas as a string", "replicaCount: \"2\"\n", "at '/replicaCount'"},
		{"empty rules", "rules: \"\"\n", "at '/rules'"},
		{"blank rules", "rules: \"  \\n\"\n", "at '/rules'"},
		{"unknown variable", "env:\n  AUTHLIMIT_DENY_STATU: \"403\"\n", "at '/env': additional properties 'AUTHLIMIT_DENY_STATU'"},
		{"a variable the chart sets", "env:\n  AUTHLIMIT_LISTEN: \":9090\"\n", "at '/env': additional properties 'AUTHLIMIT_LISTEN'"},
		{"rules as a variable", "env:\n  AUTHLIMIT_RULES: name=a limit=1/1m\n", "at '/env': additional properties 'AUTHLIMIT_RULES'"},
		{"a password in the values", "env:\n  AUTHLIMIT_REDIS_URL: redis://u:p@r:6379\n", "at '/env': additional properties 'AUTHLIMIT_REDIS_URL'"},
		{"not authlimit's", "env:\n  GOGC: \"50\"\n", "at '/env': additional properties 'GOGC'"},
		{"a variable's value as a map", "env:\n  AUTHLIMIT_DENY_STATUS:\n    code: 403\n", "at '/env/AUTHLIMIT_DENY_STATUS'"},
		{"pull policy", "image:\n  pullPolicy: Sometimes\n", "at '/image/pullPolicy'"},
		{"service type", "service:\n  type: Ingress\n", "at '/service/type'"},
		{"service port", "service:\n  port: 70000\n", "at '/service/port'"},
		{"divisor zero", "localDivisor: 0\n", "at '/localDivisor'"},
		{"redis secret name", "redis:\n  existingSecret: My_Secret\n", "at '/redis/existingSecret'"},
		{"admin without a token", "admin:\n  enabled: true\n", "at '/admin/existingSecret'"},
		{"admin token key empty", "admin:\n  enabled: true\n  existingSecret: s\n  tokenKey: \"\"\n", "at '/admin/tokenKey'"},
		{"admin misspelt", "admin:\n  enable: true\n", "at '/admin': additional properties 'enable'"},
		{"network policy without peers", "networkPolicy:\n  enabled: true\n", "at '/networkPolicy/from'"},
		{"scrape interval", "metrics:\n  serviceMonitor:\n    interval: often\n", "at '/metrics/serviceMonitor/interval'"},
		{"autoscaler upside down", "autoscaling:\n  enabled: true\n  minReplicas: 5\n  maxReplicas: 3\n", "minReplicas (5) is more than autoscaling.maxReplicas (3)"},
		{"autoscaler without replicas", "autoscaling:\n  maxReplicas: 0\n", "at '/autoscaling/maxReplicas'"},
		{"a container without a name", "extraContainers:\n  - image: nginx\n", "at '/extraContainers/0': missing property 'name'"},
		{"rls misspelt", "rls:\n  existingConfigmap: ratelimit\n", "at '/rls': additional properties 'existingConfigmap'"},
		{"rls ConfigMap name", "rls:\n  existingConfigMap: Ratelimit_Config\n", "at '/rls/existingConfigMap'"},
		{"grpc client CA without a Secret", "grpc:\n  enabled: true\n  tls:\n    clientCA: true\n", "at '/grpc/tls/existingSecret'"},
		{"grpc tls Secret name", "grpc:\n  tls:\n    existingSecret: My_Certs\n", "at '/grpc/tls/existingSecret'"},
		{"a TLS variable the chart sets", "env:\n  AUTHLIMIT_GRPC_TLS_CERT: /x.crt\n", "at '/env': additional properties 'AUTHLIMIT_GRPC_TLS_CERT'"},
		{"image repository empty", "image:\n  repository: \"\"\n", "at '/image/repository'"},
	}
	dir := t.TempDir()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := filepath.Join(dir, fmt.Sprintf("bad-%d-values.yaml", i))
			if err := os.WriteFile(f, []byte(tt.values), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := runHelm(t, "template", "rl", chartDir, "-f", f)
			if err == nil {
				t.Fatalf("helm template accepts %q:\n%s", tt.values, out)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("helm template refuses %q, but without naming %q: %v", tt.values, tt.want, err)
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Errorf("helm did not run: %v", err)
			}
		})
	}
}

// TestHelmNotes: the notes helm install prints say where proxies send
// their subrequests, warn when replicas share no Redis, and give the local
// divisor.
func TestHelmNotes(t *testing.T) {
	// helm install --dry-run asks a cluster for its version, and helm
	// template leaves NOTES.txt out: a copy of the chart renders the notes
	// into a document of their own.
	chart := filepath.Join(t.TempDir(), "authlimit")
	if b, err := exec.Command("cp", "-r", filepath.Join(repoRoot(t), chartDir), chart).CombinedOutput(); err != nil {
		t.Fatalf("copy the chart: %v %s", err, b)
	}
	notesText, err := os.ReadFile(filepath.Join(chart, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	wrapped := "{{- define \"test.notes\" -}}\n" + string(notesText) + "{{- end -}}\nnotes: {{ include \"test.notes\" . | toJson }}\n"
	if err := os.WriteFile(filepath.Join(chart, "templates", "notes.yaml"), []byte(wrapped), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		want    []string
		notWant []string
	}{
		{"defaults", nil,
			[]string{"http://rl-authlimit.edge.svc:8080/auth", "WARNING: redis.existingSecret is not set", "up to 2 times its limit", "2 (AUTHLIMIT_LOCAL_DIVISOR)", "ConfigMap rl-authlimit-rules"},
			[]string{"gRPC"}},
		{"redis, grpc, autoscaling", []string{"-f", chartDir + "/ci/autoscaling-values.yaml", "--set", "grpc.enabled=true"},
			[]string{"rl-authlimit.edge.svc:8081", "8 (AUTHLIMIT_LOCAL_DIVISOR): the autoscaler's maximum"},
			[]string{"WARNING"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runHelm(t, append([]string{"template", "rl", chart, "--namespace", "edge", "--show-only", "templates/notes.yaml"}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			var doc struct{ Notes string }
			if err := yaml.Unmarshal([]byte(out), &doc); err != nil || doc.Notes == "" {
				t.Fatalf("no notes rendered (%v):\n%s", err, out)
			}
			notes := doc.Notes
			for _, w := range tt.want {
				if !strings.Contains(notes, w) {
					t.Errorf("the notes do not say %q:\n%s", w, notes)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(notes, w) {
					t.Errorf("the notes say %q:\n%s", w, notes)
				}
			}
		})
	}
}

// TestHelmEnvoyWiring: installed as the release authlimit with
// examples/envoy-values.yaml, the chart serves what Envoy Gateway's
// SecurityPolicies and istiod's extension providers ask for (the Service
// authlimit, its http and grpc ports, HTTP/2 in clear text), without an
// Istio sidecar, and runs as deploy/envoy-gateway/authlimit.yaml does.
func TestHelmEnvoyWiring(t *testing.T) {
	r := helmTemplateAs(t, "authlimit", "default", "-f", filepath.Join(chartDir, "examples/envoy-values.yaml"))
	manifest := loadEnvoyAuthlimit(t)
	svc := r.service
	if svc.Name != "authlimit" || svc.Namespace != "default" {
		t.Errorf("the Service is %s/%s, want default/authlimit", svc.Namespace, svc.Name)
	}
	ports := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		ports[p.Name] = p.Port
		if manifest.ports[p.Port] != p.TargetPort.String() {
			t.Errorf("Service port %d goes to %s; deploy/envoy-gateway/authlimit.yaml's to %q", p.Port, p.TargetPort.String(), manifest.ports[p.Port])
		}
	}
	for _, tc := range []struct{ file, port string }{
		{"deploy/envoy-gateway/securitypolicy-grpc.yaml", "grpc"},
		{"deploy/envoy-gateway/securitypolicy-http.yaml", "http"},
	} {
		sp := object[*egv1a1.SecurityPolicy](t, tc.file, decodeObjects(t, tc.file), "SecurityPolicy/authlimit")
		var refs []egv1a1.BackendRef
		if ea := sp.Spec.ExtAuth; ea != nil && ea.GRPC != nil {
			refs = ea.GRPC.BackendRefs
		} else if ea != nil && ea.HTTP != nil {
			refs = ea.HTTP.BackendRefs
		}
		for _, ref := range refs {
			if string(ref.Name) != svc.Name || ref.Port == nil || int32(*ref.Port) != ports[tc.port] {
				t.Errorf("%s asks %s:%v; the chart serves %s on %s:%d", tc.file, ref.Name, ref.Port, tc.port, svc.Name, ports[tc.port])
			}
		}
		if len(refs) != 1 {
			t.Errorf("%s: %d backendRefs, want 1", tc.file, len(refs))
		}
	}
	type provider struct {
		Service string `json:"service"`
		Port    int32  `json:"port"`
	}
	var istiod struct {
		MeshConfig struct {
			ExtensionProviders []struct {
				HTTP *provider `json:"envoyExtAuthzHttp"`
				GRPC *provider `json:"envoyExtAuthzGrpc"`
			} `json:"extensionProviders"`
		} `json:"meshConfig"`
	}
	if err := yaml.Unmarshal(readRepo(t, "deploy/istio/istiod-values.yaml"), &istiod); err != nil {
		t.Fatal(err)
	}
	host := fmt.Sprintf("%s.%s.svc.cluster.local", svc.Name, svc.Namespace)
	asked := map[string]provider{}
	for _, p := range istiod.MeshConfig.ExtensionProviders {
		if p.HTTP != nil {
			asked["http"] = *p.HTTP
		}
		if p.GRPC != nil {
			asked["grpc"] = *p.GRPC
		}
	}
	for _, p := range []string{"http", "grpc"} {
		if got, want := asked[p], (provider{host, ports[p]}); got != want {
			t.Errorf("deploy/istio/istiod-values.yaml's %s provider asks %+v; the chart serves %+v", p, got, want)
		}
	}
	pod := r.deployment.Spec.Template
	if got := pod.Labels["sidecar.istio.io/inject"]; got != "false" {
		t.Errorf("sidecar.istio.io/inject = %q, want \"false\"", got)
	}
	env := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	for _, cm := range r.configMaps {
		if strings.HasSuffix(cm.Name, "-env") {
			for k, v := range cm.Data {
				env[k] = v
			}
		}
	}
	for _, k := range []string{"AUTHLIMIT_GRPC_LISTEN", "AUTHLIMIT_TRUSTED_PROXIES"} {
		if env[k] != manifest.env[k] {
			t.Errorf("%s = %q; deploy/envoy-gateway/authlimit.yaml has %q", k, env[k], manifest.env[k])
		}
	}
	normalize := func(rules string) []string {
		var out []string
		for _, r := range strings.FieldsFunc(rules, func(c rune) bool { return c == ';' || c == '\n' }) {
			if f := strings.Fields(r); len(f) > 0 {
				out = append(out, strings.Join(f, " "))
			}
		}
		return out
	}
	if got, want := normalize(r.configMaps["authlimit-rules"].Data["rules.conf"]), normalize(manifest.env["AUTHLIMIT_RULES"]); !reflect.DeepEqual(got, want) {
		t.Errorf("rules %q; deploy/envoy-gateway/authlimit.yaml has %q", got, want)
	}
}
