package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
)

// These tests check the Helm chart against the rest of the repository
// without helm; helm_test.go (make e2e) renders it.

// TestHelmEnvNamesAreAuthlimits: the schema's env names and the chart's
// own variables are exactly docs/configuration.md's tables: nothing the
// binary does not know (which would stop it), nothing left out.
func TestHelmEnvNamesAreAuthlimits(t *testing.T) {
	var schema struct {
		Properties struct {
			Env struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"env"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(readRepo(t, helmChart+"/values.schema.json"), &schema); err != nil {
		t.Fatal(err)
	}
	offered := map[string]string{}
	for n := range schema.Properties.Env.Properties {
		offered[n] = "values.env"
	}
	// Set by the chart's templates; AUTHLIMIT_RULES is left out for good:
	// the rules come from the file.
	for _, n := range []string{"AUTHLIMIT_LISTEN", "AUTHLIMIT_RULES_FILE", "AUTHLIMIT_REDIS_URL", "AUTHLIMIT_REDIS_SENTINEL_PASSWORD", "AUTHLIMIT_LOCAL_DIVISOR", "AUTHLIMIT_GRPC_LISTEN", "AUTHLIMIT_GRPC_TLS_CERT", "AUTHLIMIT_GRPC_TLS_KEY", "AUTHLIMIT_GRPC_TLS_CLIENT_CA", "AUTHLIMIT_RLS_CONFIG", "AUTHLIMIT_ADMIN_LISTEN", "AUTHLIMIT_ADMIN_TOKEN", "AUTHLIMIT_RULES"} {
		if offered[n] != "" {
			t.Errorf("values.env offers %s, which the chart sets itself", n)
		}
		offered[n] = "the chart"
	}
	documented := readmeEnvVariables(t)
	var problems []string
	for n, by := range offered {
		if !documented[n] && n != "AUTHLIMIT_GRPC_LISTEN" {
			problems = append(problems, fmt.Sprintf("%s (set by %s) is not in docs/configuration.md's tables: authlimit would stop at start", n, by))
		}
	}
	for n := range documented {
		if offered[n] == "" {
			problems = append(problems, n+" is in docs/configuration.md's tables, but the chart offers no way to set it (add it to values.schema.json's env properties)")
		}
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
}

// readmeEnvVariables lists the variables of the configuration
// reference's tables (docs/configuration.md).
func readmeEnvVariables(t *testing.T) map[string]bool {
	t.Helper()
	vars := map[string]bool{}
	for _, line := range strings.Split(string(readRepo(t, "docs/configuration.md")), "\n") {
		if !strings.HasPrefix(line, "| `AUTHLIMIT_") {
			continue
		}
		first := strings.Split(line, " | ")[0]
		for _, part := range strings.Split(first, "`") {
			if strings.HasPrefix(part, "AUTHLIMIT_") {
				vars[part] = true
			}
		}
	}
	if len(vars) < 10 {
		t.Fatalf("docs/configuration.md's tables have only %d variables", len(vars))
	}
	return vars
}

// TestHelmAlertsAreDeploys: the chart's files/alerts.yml is
// deploy/prometheus/alerts.yml (a chart cannot read outside itself).
func TestHelmAlertsAreDeploys(t *testing.T) {
	if !bytes.Equal(readRepo(t, helmChart+"/files/alerts.yml"), readRepo(t, "deploy/prometheus/alerts.yml")) {
		t.Error("deploy/helm/authlimit/files/alerts.yml differs from deploy/prometheus/alerts.yml: copy it over")
	}
}

// helmChart is the chart, from the repository's root.
const helmChart = "deploy/helm/authlimit"
