package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/authlimit/authlimit/rules"
)

// maxRulesFileBytes bounds AUTHLIMIT_RULES_FILE: a rule set is a few
// kilobytes; a larger file is a mistake (a wrong path), not rules.
const maxRulesFileBytes = 1 << 20

// loadRulesFile reads and parses the rules file at path. Its errors name the
// file; a parse error lists every mistake, as rules.Parse does.
func loadRulesFile(path string) ([]*rules.Rule, error) {
	b, err := readRulesFile(path)
	if err != nil {
		return nil, err
	}
	return parseRulesFile(path, b)
}

// readRulesFile reads the rules file, refusing what cannot be one.
func readRulesFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > maxRulesFileBytes {
		return nil, fmt.Errorf("%s is %d bytes; the most a rules file may hold is %d", path, fi.Size(), maxRulesFileBytes)
	}
	return os.ReadFile(path)
}

// parseRulesFile parses the rules file's text b, naming path in its errors.
func parseRulesFile(path string, b []byte) ([]*rules.Rule, error) {
	rs, err := rules.Parse(string(b))
	if err != nil {
		errs := unjoin(err)
		for i, e := range errs {
			errs[i] = fmt.Errorf("%s: %w", path, e)
		}
		return nil, errors.Join(errs...)
	}
	return rs, nil
}

// rulesHash identifies a rule set by what it means: the hash of its rules
// written back (rules.Rule.Text, override keys whole), so that comments,
// spacing and the order of a rule's fields do not change it. It is the hash label of
// authlimit_config_info and what -check prints.
func rulesHash(rs []*rules.Rule) string {
	h := sha256.New()
	for _, r := range rs {
		h.Write([]byte(r.Text()))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
