package denials

import (
	"testing"
	"unsafe"
)

// TestSummaryBytesAsDocumented holds the memory figures docs/operations.md
// gives: 152-byte entries, 82 KiB a rule at the default size.
func TestSummaryBytesAsDocumented(t *testing.T) {
	if got := unsafe.Sizeof(entry{}); got != 152 {
		t.Errorf("an entry is %d bytes; docs/operations.md says 152", got)
	}
	if got := SummaryBytes(DefaultSize) >> 10; got != 82 {
		t.Errorf("a rule takes %d KiB at the default size; docs/operations.md says 82", got)
	}
}
