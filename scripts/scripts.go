// Package scripts holds the Lua scripts that run inside Redis, embedded in
// the binary, and the numbers of their wire (layout.go). Each script starts
// with its KEYS, ARGV and reply layout; PERF.md says what each costs Redis
// and why the scripts are written as they are.
package scripts

import (
	_ "embed"
	"regexp"
	"strings"
)

// decideSource and refundSource are the scripts as written, wire names
// and all.
var (
	//go:embed decide.lua
	decideSource string
	//go:embed refund.lua
	refundSource string
)

// Decide is decide.lua as Redis runs it (see inline): it decides every rule
// of one request atomically and all or nothing, with Redis TIME as the
// clock.
var Decide = inline(decideSource)

// Refund is refund.lua as Redis runs it (see inline): it takes back what
// Decide consumed, for decisions that span several Redis Cluster slots and
// so several Decide calls.
var Refund = inline(refundSource)

// wireNamesHead starts a script's block of wire names: comment lines,
// then one name per line, "local NAME = value", up to the first line that
// is not one.
const wireNamesHead = "-- wire names"

// wireName is one line of the block.
var wireName = regexp.MustCompile(`^local ([A-Z][A-Z0-9_]*) = (-?[0-9]+)\s*(--.*)?$`)

// wireNames returns the names a script's block declares, with their
// values as written, and where the block starts and ends in src.
func wireNames(src string) (names map[string]string, from, to int) {
	from = strings.Index(src, "\n"+wireNamesHead)
	if from < 0 {
		return nil, 0, 0
	}
	from++
	names = map[string]string{}
	to = from
	for to < len(src) && strings.HasPrefix(src[to:], "--") {
		to += strings.IndexByte(src[to:], '\n') + 1
	}
	for to < len(src) {
		end := strings.IndexByte(src[to:], '\n')
		if end < 0 {
			end = len(src) - to
		}
		m := wireName.FindStringSubmatch(src[to : to+end])
		if m == nil {
			break
		}
		names[m[1]] = m[2]
		to += end + 1
	}
	return names, from, to
}

// inline returns src without its block of wire names, each name the block
// declares replaced by its value: Lua has no constants, and a local costs
// Redis an instruction at every run, an upvalue more in every closure
// that reads it, where a literal costs nothing (Lua folds arithmetic on
// literals when it compiles the script).
func inline(src string) string {
	names, from, to := wireNames(src)
	if len(names) == 0 {
		return src
	}
	alts := make([]string, 0, len(names))
	for n := range names {
		alts = append(alts, n)
	}
	re := regexp.MustCompile(`\b(` + strings.Join(alts, "|") + `)\b`)
	return src[:from] + re.ReplaceAllStringFunc(src[to:], func(n string) string { return names[n] })
}
