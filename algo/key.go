package algo

import (
	"crypto/sha256"
	"encoding/hex"
)

// maxPlainKey is the longest key kept readable in storage keys; longer keys
// are hashed so that a client cannot grow keys (and memory) without bound.
const maxPlainKey = 64

// keyTag maps a request's key (client-controlled bytes) to the body of a
// Redis Cluster hash tag. It is injective in practice:
//
//   - a short key of printable ASCII without '{', '}', '#', '"' and '\' is
//     kept as it is, so operators can find "203.0.113.7" in redis-cli;
//   - any other key becomes "#" and the hex of the first 128 bits of its
//     SHA-256. No kept key starts with '#', and SHA-256 makes it infeasible
//     for a client to choose a value that lands on another client's state.
//
// Because the result never contains braces, user data cannot choose the
// hash slot of another key, and because it is never empty, the tag always
// takes effect.
func keyTag(key string) string {
	if plainKey(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	var b [1 + 2*16]byte
	b[0] = '#'
	hex.Encode(b[1:], sum[:16])
	return string(b[:])
}

func plainKey(key string) bool {
	if key == "" || len(key) > maxPlainKey {
		return false
	}
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c <= ' ' || c > '~':
			return false
		case c == '{' || c == '}' || c == '#' || c == '"' || c == '\\':
			return false
		}
	}
	return true
}

// StorageKey returns the Redis key under which rule r keeps its state for
// key:
//
//	<prefix>:<rule name>:{<tag>}:<algorithm>
//
// The rule name (validated to [a-z0-9_-]) keeps rules apart; the algorithm
// keeps a rule whose algorithm changed from reading state of another shape.
// Only the tag is hashed for the cluster slot, so every key of one rule and
// key lives in one slot, and rules that limit the same key (1/min, 5/h and
// 10/day on one phone number) share that slot and stay atomic in a cluster.
func (r *Rule) StorageKey(prefix, key string) string {
	return prefix + ":" + r.spec.Name + ":{" + keyTag(key) + "}:" + r.suffix
}
