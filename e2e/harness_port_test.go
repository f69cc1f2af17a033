//go:build e2e

package e2e

import (
	"net"
	"testing"
)

// TestHarnessTakenPort: authlimit started on an address something else
// holds starts again on a fresh one, so a port taken between freeAddr and
// authlimit's bind fails no test.
func TestHarnessTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held := l.Addr().String()
	a := startAuthlimit(t, "authlimit-taken", map[string]string{"AUTHLIMIT_SPOA_LISTEN": held})
	if a.spoa == held || a.spoa == "" {
		t.Fatalf("authlimit's SPOE address is %q, want a fresh one in place of %s, which is held", a.spoa, held)
	}
	c, err := net.Dial("tcp", a.spoa)
	if err != nil {
		t.Fatalf("authlimit does not listen on its new SPOE address %s: %v", a.spoa, err)
	}
	c.Close()
}
