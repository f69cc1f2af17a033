// Package rulesettest builds rule sets for tests.
package rulesettest

import (
	"testing"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset"
)

// Holder returns a holder of the set of rs and, each as a rule of its own
// that matches every request, ps: a guard given it numbers them all, as
// it numbers the policies of a rate-limit configuration.
func Holder(t testing.TB, rs []*rules.Rule, ps ...*algo.Policy) *ruleset.Holder {
	t.Helper()
	for _, p := range ps {
		rs = append(rs[:len(rs):len(rs)], &rules.Rule{Name: p.Name(), Policy: p})
	}
	set, err := ruleset.New(rs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ruleset.NewHolder(set)
}

// Parse returns a holder of the rules src holds.
func Parse(t testing.TB, src string) *ruleset.Holder {
	t.Helper()
	rs, err := rules.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	return Holder(t, rs)
}
