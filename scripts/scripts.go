// Package scripts holds the Lua scripts that run inside Redis, embedded in
// the binary. Each file starts with its KEYS, ARGV and reply layout.
package scripts

import _ "embed"

// Decide is decide.lua: it decides every rule of one request atomically and
// all or nothing, with Redis TIME as the clock.
//
//go:embed decide.lua
var Decide string

// Refund is refund.lua: it takes back what Decide consumed, for decisions
// that span several Redis Cluster slots and so several Decide calls.
//
//go:embed refund.lua
var Refund string
