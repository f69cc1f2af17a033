package rls

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/internal/race"
)

// TestDetailedMetric: a descriptor with detailed_metric: true has its
// decisions counted per descriptor as sent, values included, besides its
// limit's; a limit without it is counted per limit only. Past
// MaxDetailedPerLimit descriptors, a limit's further ones share the series
// (other).
func TestDetailedMetric(t *testing.T) {
	e := start(t, memoryStore, `
domain: api
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {name: per_user, unit: hour, requests_per_unit: 1}
  - key: plan
    rate_limit: {name: per_plan, unit: hour, requests_per_unit: 100}
`)
	awayFromWindowEdge(t, time.Hour, 10*time.Second)
	e.ask(t, "api", desc("user", "alice"))
	e.ask(t, "api", desc("user", "alice"))
	e.ask(t, "api", desc("user", "bob"))
	e.ask(t, "api", desc("plan", "gold"))
	got := e.counters(t)
	for k, v := range map[string]float64{
		"authlimit_rls_detailed_decisions_total{descriptor=user_alice,outcome=allowed,rule=per_user}": 1,
		"authlimit_rls_detailed_decisions_total{descriptor=user_alice,outcome=denied,rule=per_user}":  1,
		"authlimit_rls_detailed_decisions_total{descriptor=user_bob,outcome=allowed,rule=per_user}":   1,
		"authlimit_decisions_total{outcome=allowed,rule=per_user}":                                    2,
		"authlimit_decisions_total{outcome=allowed,rule=per_plan}":                                    1,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "authlimit_rls_detailed_decisions_total") && strings.Contains(k, "per_plan") {
			t.Errorf("%s: a limit without detailed_metric counted per descriptor", k)
		}
	}

	for i := 0; i < MaxDetailedPerLimit+5; i++ {
		e.ask(t, "api", desc("user", fmt.Sprintf("u%03d", i)))
	}
	got = e.counters(t)
	apart := 0
	for k := range got {
		if strings.HasPrefix(k, "authlimit_rls_detailed_decisions_total{") && strings.HasSuffix(k, "outcome=allowed,rule=per_user}") && !strings.Contains(k, DetailedOther) {
			apart++
		}
	}
	if apart != MaxDetailedPerLimit {
		t.Errorf("%d descriptors of per_user counted apart, want the bound, %d", apart, MaxDetailedPerLimit)
	}
	// alice and bob took two of the places: 107 users in all, 100 apart.
	if k, want := "authlimit_rls_detailed_decisions_total{descriptor="+DetailedOther+",outcome=allowed,rule=per_user}", float64(MaxDetailedPerLimit+5+2-MaxDetailedPerLimit); got[k] != want {
		t.Errorf("%s = %v, want %v", k, got[k], want)
	}
}

// TestDetailedBounds: the bound across limits, labels that are valid
// UTF-8 and of bounded length whatever a client sends, and a descriptor
// seen before counted without an allocation.
func TestDetailedBounds(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	detailed := &envoyconf.Limit{Detailed: true}
	result := func(label string) *decide.Result {
		return &decide.Result{Limit: &decide.Limit{Name: label}}
	}
	var buf []byte
	for l := 0; l < MaxDetailed/MaxDetailedPerLimit+2; l++ {
		label := fmt.Sprintf("l%d", l)
		for i := 0; i < MaxDetailedPerLimit; i++ {
			buf = m.countDetailed(detailed, []envoyconf.Entry{{Key: "k", Value: fmt.Sprint(i)}}, result(label), buf)
		}
	}
	if m.detailed.apart != MaxDetailed {
		t.Errorf("%d descriptors counted apart, want the bound %d", m.detailed.apart, MaxDetailed)
	}
	if n := len(m.detailed.series); n != MaxDetailed+2 {
		t.Errorf("%d series, want %d apart and the (other) of the 2 limits past the bound", n, MaxDetailed+2)
	}

	m, _ = NewMetrics(prometheus.NewRegistry())
	long := strings.Repeat("é", 300)
	buf = m.countDetailed(detailed, []envoyconf.Entry{{Key: "k\xff", Value: "v\xc3"}, {Key: "long", Value: long}}, result("l"), buf)
	for key := range m.detailed.series {
		desc := key[strings.IndexByte(key, 0)+1:]
		if !strings.HasPrefix(desc, "k\uFFFD_v\uFFFD.long_éé") || len(desc) > maxDetailedLabel || !strings.HasSuffix(desc, "é") {
			t.Errorf("descriptor label %q (%d bytes): want valid UTF-8, cut on a rune, at most %d bytes", desc, len(desc), maxDetailedLabel)
		}
	}
	if race.Enabled {
		return
	}
	entries := []envoyconf.Entry{{Key: "user", Value: "alice"}}
	r := result("l")
	buf = m.countDetailed(detailed, entries, r, buf)
	if n := testing.AllocsPerRun(100, func() { buf = m.countDetailed(detailed, entries, r, buf) }); n != 0 {
		t.Errorf("a descriptor seen before: %v allocations, want 0", n)
	}
}
