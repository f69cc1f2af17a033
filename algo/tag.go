package algo

import (
	"crypto/sha256"
	"encoding/hex"
)

// maxPlainKey is the longest key kept readable in storage keys; longer keys
// are hashed so that a client cannot grow keys (and memory) without bound.
const maxPlainKey = 64

// hashedTagLen is the length of a hashed tag: '#' and 32 hex digits.
const hashedTagLen = 1 + 2*16

// AppendTag appends to dst the key tag of key, client-controlled bytes, and
// returns the extended buffer. A tag is what Request.Key holds, and the body
// of the Redis Cluster hash tag in storage keys:
//
//   - a key of 1 to 64 bytes of printable ASCII without '{', '}', '#', '"'
//     and '\' is its own tag, so operators can find "203.0.113.7" in
//     redis-cli;
//   - any other key becomes '#' and the hex of the first 128 bits of its
//     SHA-256. No kept key starts with '#', and SHA-256 makes it infeasible
//     for a client to choose bytes that land on another client's state.
//
// A tag never contains braces, so user data cannot choose the cluster slot
// of another key, and it is never empty, so the hash tag always takes
// effect.
func AppendTag(dst, key []byte) []byte {
	if plainKey(key) {
		return append(dst, key...)
	}
	sum := sha256.Sum256(key)
	var b [hashedTagLen]byte
	b[0] = '#'
	hex.Encode(b[1:], sum[:16])
	return append(dst, b[:]...)
}

// Tag returns the key tag of key (see AppendTag).
func Tag(key string) []byte { return AppendTag(nil, []byte(key)) }

func plainKey(key []byte) bool {
	if len(key) == 0 || len(key) > maxPlainKey {
		return false
	}
	for _, c := range key {
		switch {
		case c <= ' ' || c > '~':
			return false
		case c == '{' || c == '}' || c == '#' || c == '"' || c == '\\':
			return false
		}
	}
	return true
}

// ValidTag reports whether key is a tag AppendTag can make.
func ValidTag(key []byte) bool {
	if plainKey(key) {
		return true
	}
	if len(key) != hashedTagLen || key[0] != '#' {
		return false
	}
	for _, c := range key[1:] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// AppendStorageKey appends the Redis key under which p keeps its state for
// the key tag:
//
//	<prefix>:<policy name>:{<tag>}:<algorithm letter>
//
// The policy name (validated to [a-z0-9_-]) keeps policies apart; the
// algorithm letter keeps a policy whose algorithm changed from reading state
// of another shape. Only the tag is hashed for the cluster slot, so every key
// of one policy and key lives in one slot, and policies that limit the same
// key (1/min, 5/h and 10/day on one phone number) share that slot and stay
// atomic in a cluster.
func (p *Policy) AppendStorageKey(dst []byte, prefix string, tag []byte) []byte {
	dst = append(dst, prefix...)
	dst = append(dst, ':')
	dst = append(dst, p.spec.Name...)
	dst = append(dst, ":{"...)
	dst = append(dst, tag...)
	dst = append(dst, "}:"...)
	return append(dst, p.suffix...)
}

// StorageKey returns the Redis key of p's state for the key tag (see
// AppendStorageKey), for operators and tests.
func (p *Policy) StorageKey(prefix string, tag []byte) string {
	return string(p.AppendStorageKey(nil, prefix, tag))
}
