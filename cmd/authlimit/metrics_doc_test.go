package main

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// metricsDoc holds the metrics table, a row per metric family.
const metricsDoc = "../../docs/operations.md"

// TestDocsDocumentEveryMetric: every metric family authlimit exports,
// with Redis, the gRPC services and both fronts in use, has a row in
// the metrics table of docs/operations.md. A family only appears once one
// of its series has a value, so the test first makes every front decide
// and deny.
func TestDocsDocumentEveryMetric(t *testing.T) {
	readme, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string][]string{} // family → its labels, as the table lists them
	row := regexp.MustCompile("^\\| `(authlimit_[a-z0-9_]+)` \\|([^|]*)\\|")
	label := regexp.MustCompile("`([a-z_]+)`")
	for _, line := range strings.Split(string(readme), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			labels := []string{}
			for _, l := range label.FindAllStringSubmatch(m[2], -1) {
				labels = append(labels, l[1])
			}
			sort.Strings(labels)
			documented[m[1]] = labels
		}
	}
	if len(documented) < 10 {
		t.Fatalf("found %d metric rows in %s; has its table moved?", len(documented), metricsDoc)
	}

	body := exportEveryFront(t)
	var missing []string
	seen := 0
	exported := exportedLabels(body)
	for _, line := range strings.Split(body, "\n") {
		name, ok := strings.CutPrefix(line, "# HELP ")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, " ")
		if !strings.HasPrefix(name, "authlimit_") {
			continue
		}
		seen++
		if _, ok := documented[name]; !ok {
			missing = append(missing, name)
		}
	}
	for name, labels := range exported {
		doc, ok := documented[name]
		if !ok {
			continue // reported above, or a histogram's series
		}
		got := make([]string, 0, len(labels))
		for l := range labels {
			got = append(got, l)
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(doc, ",") {
			t.Errorf("%s has the labels %v; the metrics table of %s lists %v", name, got, metricsDoc, doc)
		}
	}
	if seen < 10 {
		t.Fatalf("/metrics exports %d authlimit_ families; want the store's, the fronts' and the connections'", seen)
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("exported but not in the metrics table of %s:\n  %s", metricsDoc, strings.Join(missing, "\n  "))
	}
}
