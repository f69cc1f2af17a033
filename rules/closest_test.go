package rules

import "testing"

func TestClosest(t *testing.T) {
	known := []string{"AUTHLIMIT_RULES", "AUTHLIMIT_RULES_FILE", "minute", "hour", "key", "value"}
	for _, tc := range []struct{ word, want string }{
		{"AUTHLIMIT_RULE", "AUTHLIMIT_RULES"},
		{"AUTHLIMIT_RULES_FLIE", "AUTHLIMIT_RULES_FILE"},
		{"minutes", "minute"},
		{"hor", "hour"},
		{"kye", ""},        // two edits: too far for a short word
		{"vlaue", "value"}, // a transposition is two edits
		{"valu", "value"},
		{"AUTHLIMIT_NOTHING_LIKE", ""},
		{"", ""},
	} {
		if got := Closest(tc.word, known); got != tc.want {
			t.Errorf("Closest(%q) = %q, want %q", tc.word, got, tc.want)
		}
	}
	// Equally near: the one that sorts first, whatever the order given.
	if got := Closest("bat", []string{"cat", "bar"}); got != "bar" {
		t.Errorf("Closest(bat, [cat bar]) = %q, want bar", got)
	}
}
