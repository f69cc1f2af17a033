//go:build !race

package main

// raceFactor scales the memory bounds of tests: the race detector pads
// allocations and goroutine stacks.
const raceFactor = 1
