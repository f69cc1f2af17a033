//go:build !e2e

package e2e

import (
	"os"
	"testing"
)

// TestMain removes the binary the tests of the shipped files built; with
// the e2e tag, harness_test.go's TestMain does.
func TestMain(m *testing.M) {
	code := m.Run()
	removeBuiltAuthlimit()
	os.Exit(code)
}
