//go:build race

package algo

// raceEnabled: the race detector makes sync.Pool drop items, so pooled
// memory is allocated again and allocation counts mean nothing.
const raceEnabled = true
