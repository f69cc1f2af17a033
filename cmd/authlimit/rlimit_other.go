//go:build !unix

package main

// raiseFDLimit reports an unknown open file limit where there is none to
// raise: connections are then not capped unless AUTHLIMIT_MAX_CONNS is set.
func raiseFDLimit() (uint64, error) { return 0, nil }
