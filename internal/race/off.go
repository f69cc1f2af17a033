//go:build !race

package race

// Enabled reports that the race detector is off.
const Enabled = false
