package main

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/authlimit/authlimit/front/spoa/spoatest"
	"github.com/authlimit/authlimit/internal/redistest"
)

// The files users load into Prometheus and Grafana.
const (
	alertsFile    = "../../deploy/prometheus/alerts.yml"
	dashboardFile = "../../deploy/grafana/authlimit-dashboard.json"
)

// exportEveryFront returns /metrics of an authlimit on Redis whose every
// front (/auth, the rate limit service over gRPC, the SPOE agent) has decided and
// denied: a family only appears once one of its series has a value.
func exportEveryFront(t *testing.T) string {
	t.Helper()
	srv := redistest.New(t)
	app := startApp(t, map[string]string{
		"AUTHLIMIT_REDIS_URL":     srv.URL,
		"AUTHLIMIT_KEY_PREFIX":    srv.Prefix(t),
		"AUTHLIMIT_RULES":         "name=per-ip key=ip limit=1/1m",
		"AUTHLIMIT_GRPC_LISTEN":   "127.0.0.1:0",
		"AUTHLIMIT_RLS_CONFIG":    writeFile(t, "rls.yaml", rlsConfig),
		"AUTHLIMIT_REDIS_TIMEOUT": "1s",
		"AUTHLIMIT_SPOA_LISTEN":   "127.0.0.1:0",
	})
	for range 3 {
		app.do(t, authFrom("203.0.113.7"))
	}
	conn := grpcClient(t, app.app.grpc.listener.Addr().String())
	rl := pb.NewRateLimitServiceClient(conn)
	for range 2 {
		shouldRateLimit(t, rl, "another", "key3", "metrics")
	}
	// The SPOE agent: a decision, then a frame that breaks the protocol.
	spoaAddr := app.app.spoa.listener.Addr().String()
	sc, err := spoatest.Dial(spoaAddr, 16380)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Ask(spoatest.Request{Method: "GET", Target: "/", Headers: []string{"Host", "h"}}); err != nil {
		t.Fatal(err)
	}
	sc.Close()
	if nc, err := net.Dial("tcp", spoaAddr); err == nil {
		_, _ = nc.Write([]byte{0, 0, 0, 3, 1, 0, 0})
		_, _ = io.Copy(io.Discard, nc)
		nc.Close()
	}
	m := app.do(t, request{path: "/metrics"})
	wantStatus(t, m, 200, "/metrics")
	return m.body
}

var (
	sampleLine = regexp.MustCompile(`^(authlimit_[a-z0-9_]+?)(?:_bucket|_sum|_count)?(?:\{(.*)\})? `)
	labelPair  = regexp.MustCompile(`([a-z_]+)="(?:[^"\\]|\\.)*"`)
)

// exportedLabels maps each authlimit_ family of a /metrics body to the
// labels its series carry (a histogram's le left out).
func exportedLabels(body string) map[string]map[string]bool {
	exported := map[string]map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		s := sampleLine.FindStringSubmatch(line)
		if s == nil {
			continue
		}
		if exported[s[1]] == nil {
			exported[s[1]] = map[string]bool{}
		}
		for _, p := range labelPair.FindAllStringSubmatch(s[2], -1) {
			if p[1] != "le" {
				exported[s[1]][p[1]] = true
			}
		}
	}
	return exported
}

// shippedQueries returns the PromQL of the shipped alert rules and
// dashboard (panel queries and variables' definitions), by where each is.
func shippedQueries(t *testing.T) map[string]string {
	t.Helper()
	queries := map[string]string{}
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var alerts struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &alerts); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	for _, g := range alerts.Groups {
		for _, r := range g.Rules {
			queries["alert "+r.Alert] = r.Expr
		}
	}
	if b, err = os.ReadFile(dashboardFile); err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			queries["panel "+p.Title+" "+q.RefID] = q.Expr
		}
	}
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			queries["variable "+v.Name] = v.Definition
		}
	}
	return queries
}

var (
	selector    = regexp.MustCompile(`(authlimit_[a-z0-9_]+?)(_bucket|_sum|_count)?\b\s*(?:\{([^}]*)\})?`)
	matcher     = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	grouping    = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	labelValues = regexp.MustCompile(`label_values\(\s*(authlimit_[a-z0-9_]+)\s*,\s*([a-z_]+)\s*\)`)
)

// TestShippedQueriesUseRealMetricsAndLabels: every authlimit_* metric the
// shipped alert rules and dashboard query is one authlimit exports, and
// every label they select, group by or list values of is one of that
// metric's (or, in a grouping, of one of the query's metrics).
func TestShippedQueriesUseRealMetricsAndLabels(t *testing.T) {
	exported := exportedLabels(exportEveryFront(t))
	queries := shippedQueries(t)
	if len(queries) < 15 {
		t.Fatalf("found %d queries in the alerts and the dashboard; have they moved?", len(queries))
	}
	for where, q := range queries {
		labelsOfQuery := map[string]bool{}
		for _, m := range selector.FindAllStringSubmatch(q, -1) {
			family, suffix := m[1], m[2]
			labels, ok := exported[family]
			if !ok {
				t.Errorf("%s queries %s, which authlimit does not export", where, family+suffix)
				continue
			}
			for l := range labels {
				labelsOfQuery[l] = true
			}
			if suffix == "_bucket" {
				labelsOfQuery["le"] = true
			}
			for _, mm := range matcher.FindAllStringSubmatch(m[3], -1) {
				if !labels[mm[1]] {
					t.Errorf("%s selects %s by %s, a label it does not have (it has %v)", where, family, mm[1], keys(labels))
				}
			}
		}
		for _, g := range grouping.FindAllStringSubmatch(q, -1) {
			for _, l := range strings.Split(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !labelsOfQuery[l] {
					t.Errorf("%s groups by %s, which none of its metrics has (they have %v)", where, l, keys(labelsOfQuery))
				}
			}
		}
		for _, lv := range labelValues.FindAllStringSubmatch(q, -1) {
			if !exported[lv[1]][lv[2]] {
				t.Errorf("%s lists the values of %s's %s, a label it does not have", where, lv[1], lv[2])
			}
		}
	}
}

// TestShippedQueriesShowFrontsShardsAndBuilds: the dashboard and the alert
// rules break requests and their latency down by front, circuits by
// shard, and replicas by build, as the metrics allow.
func TestShippedQueriesShowFrontsShardsAndBuilds(t *testing.T) {
	queries := shippedQueries(t)
	for _, want := range []struct {
		in     string // "panel" or "alert"
		metric string
		by     string
	}{
		{"panel", "authlimit_requests_total", "front"},
		{"panel", "authlimit_request_duration_seconds_bucket", "front"},
		{"panel", "authlimit_circuit_state", "shard"},
		{"panel", "authlimit_build_info", "version"},
		{"alert", "authlimit_requests_total", "front"},
		{"alert", "authlimit_request_duration_seconds_bucket", "front"},
		{"alert", "authlimit_circuit_state", "shard"},
		{"alert", "authlimit_build_info", "version"},
	} {
		found := false
		for where, q := range queries {
			if !strings.HasPrefix(where, want.in+" ") || !strings.Contains(q, want.metric) {
				continue
			}
			for _, g := range grouping.FindAllStringSubmatch(q, -1) {
				for _, l := range strings.Split(g[1], ",") {
					found = found || strings.TrimSpace(l) == want.by
				}
			}
		}
		if !found {
			t.Errorf("no %s groups %s by %s", want.in, want.metric, want.by)
		}
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
