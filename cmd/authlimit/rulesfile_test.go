package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRulesFileConfig: AUTHLIMIT_RULES_FILE gives the rules; its mistakes
// name the variable and the file, every one at once.
func TestRulesFileConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "# per client\nname=a key=ip limit=10/1m\nname=b key=global limit=5/1s\n")
	bad := write("bad", "name=a limit=5/x\nname=b limit=1/1m algorithm=nope\n")
	empty := write("empty", "# nothing\n")

	t.Run("good", func(t *testing.T) {
		s, err := loadConfig(map[string]string{"AUTHLIMIT_RULES_FILE": good})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(s.rules), 2; got != want {
			t.Fatalf("rules = %d, want %d", got, want)
		}
		if s.defaultRules {
			t.Error("rules from a file are taken for the default rule")
		}
		if !strings.Contains(s.describe(), "from "+good) {
			t.Errorf("-check does not name the rules file:\n%s", s.describe())
		}
	})
	t.Run("the same rules written otherwise hash alike", func(t *testing.T) {
		other := write("other", "name=a   limit=10/1m key=ip ; name=b key=global limit=5/1s")
		s1, err1 := loadConfig(map[string]string{"AUTHLIMIT_RULES_FILE": good})
		s2, err2 := loadConfig(map[string]string{"AUTHLIMIT_RULES_FILE": other})
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if s1.rulesHash != s2.rulesHash || s1.rulesHash == "" {
			t.Errorf("hashes %q and %q differ for the same rules", s1.rulesHash, s2.rulesHash)
		}
		s3, err := loadConfig(map[string]string{"AUTHLIMIT_RULES": "name=a key=ip limit=11/1m"})
		if err != nil {
			t.Fatal(err)
		}
		if s3.rulesHash == s1.rulesHash {
			t.Errorf("hash %q is the same for other rules", s3.rulesHash)
		}
	})
	tests := []struct {
		name string
		env  map[string]string
		want []string // each must be one of AUTHLIMIT_RULES_FILE's problems
	}{
		{"both set", map[string]string{"AUTHLIMIT_RULES_FILE": good, "AUTHLIMIT_RULES": "name=a limit=1/1m"}, []string{"set together with AUTHLIMIT_RULES"}},
		{"missing", map[string]string{"AUTHLIMIT_RULES_FILE": filepath.Join(dir, "nope")}, []string{"no such file"}},
		{"a directory", map[string]string{"AUTHLIMIT_RULES_FILE": dir}, []string{"is not a regular file"}},
		{"every mistake", map[string]string{"AUTHLIMIT_RULES_FILE": bad}, []string{bad + `: rule 1 "a": limit "5/x"`, bad + `: rule 2 "b": algorithm`}},
		{"no rules", map[string]string{"AUTHLIMIT_RULES_FILE": empty}, []string{empty + ": no rules"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			said, err := checkEnv(t, tt.env)
			if err == nil {
				t.Fatalf("-check passed:\n%s", said)
			}
			_, cerr := loadConfig(tt.env)
			got := configErrors(cerr)["AUTHLIMIT_RULES_FILE"]
			if len(got) != len(tt.want) {
				t.Fatalf("AUTHLIMIT_RULES_FILE problems = %q, want %d like %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d = %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}
