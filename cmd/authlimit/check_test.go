package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// check runs authlimit -check with environ and returns what it printed.
func check(t *testing.T, environ ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"-check"}, environ, &out, &errOut); err != nil {
		t.Fatalf("-check %v: %v", environ, err)
	}
	return out.String()
}

// TestCheckPrintsEveryHash: -check prints the hash of every configuration,
// the one authlimit_config_info carries: the rules' (AUTHLIMIT_RULES, its
// default, or AUTHLIMIT_RULES_FILE) and AUTHLIMIT_RLS_CONFIG's.
func TestCheckPrintsEveryHash(t *testing.T) {
	rulesFile := writeFile(t, "rules.conf", "name=f limit=5/1m\n")
	rlsFile := writeFile(t, "ratelimit.yaml", rlsYAML(2, "hour"))
	for _, environ := range [][]string{
		{"AUTHLIMIT_RULES=name=r limit=5/1m"},
		{},
		{"AUTHLIMIT_RULES_FILE=" + rulesFile},
		{"AUTHLIMIT_RULES=name=r limit=5/1m", "AUTHLIMIT_RLS_CONFIG=" + rlsFile, "AUTHLIMIT_GRPC_LISTEN=127.0.0.1:0"},
	} {
		s, err := loadConfig(envMap(environ))
		if err != nil {
			t.Fatal(err)
		}
		out := check(t, environ...)
		if !strings.Contains(out, "hash "+s.rulesHash) {
			t.Errorf("-check %v does not print the rules' hash %s:\n%s", environ, s.rulesHash, out)
		}
		if s.rls == nil {
			continue
		}
		hash, err := hashRLS(rlsFile)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "hash "+hash) {
			t.Errorf("-check %v does not print AUTHLIMIT_RLS_CONFIG's hash %s:\n%s", environ, hash, out)
		}
	}
}

// TestCheckWarnsOfRLSWithoutGRPC: AUTHLIMIT_RLS_CONFIG without
// AUTHLIMIT_GRPC_LISTEN serves POST /json only, which -check says.
func TestCheckWarnsOfRLSWithoutGRPC(t *testing.T) {
	rlsFile := writeFile(t, "ratelimit.yaml", rlsYAML(2, "hour"))
	out := check(t, "AUTHLIMIT_RLS_CONFIG="+rlsFile)
	if !strings.Contains(out, "warnings:") || !strings.Contains(out, "AUTHLIMIT_RLS_CONFIG is set, AUTHLIMIT_GRPC_LISTEN is not") {
		t.Errorf("-check of AUTHLIMIT_RLS_CONFIG without AUTHLIMIT_GRPC_LISTEN warns of nothing:\n%s", out)
	}
	if out := check(t, "AUTHLIMIT_RLS_CONFIG="+rlsFile, "AUTHLIMIT_GRPC_LISTEN=127.0.0.1:0"); strings.Contains(out, "AUTHLIMIT_GRPC_LISTEN is not") {
		t.Errorf("-check warns with AUTHLIMIT_GRPC_LISTEN set:\n%s", out)
	}
}

// TestCheckReportsEveryMistakeOfARule: a rule whose field does not parse
// still has its other mistakes reported, all at once.
func TestCheckReportsEveryMistakeOfARule(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-check"}, []string{"AUTHLIMIT_RULES=name=login limit=5/1m algorithm=leaky_bucket burst=zero delay=2h"}, &out, &errOut)
	if err == nil {
		t.Fatal("-check accepted the rule")
	}
	for _, want := range []string{`AUTHLIMIT_RULES: rule 1 "login": burst "zero"`, `AUTHLIMIT_RULES: rule 1 "login": delay "2h": 2h0m0s is longer than the maximum`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("-check does not say %q:\n%v", want, err)
		}
	}
}
