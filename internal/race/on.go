//go:build race

// Package race tells tests whether the race detector is on: it makes
// sync.Pool drop items, so pooled memory is allocated again and allocation
// counts mean nothing.
package race

// Enabled reports that the race detector is on.
const Enabled = true
