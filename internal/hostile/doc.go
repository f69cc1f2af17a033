// Package hostile is the attacks of authlimit's hostile-client tests and
// what they measure meanwhile. Each attack is a client that misbehaves on
// purpose against one address (loopback only: the tests never aim
// elsewhere), as long as its context lasts, reconnecting when the server
// closes on it, as a persistent attacker would; it returns what it saw.
// The attacks on the gRPC port speak HTTP/2 frames themselves (as h2spec
// and the floods of CVE-2023-44487 and CVE-2024-27316 do); those on the
// HTTP port write bytes.
//
// Usage reads a process's resident memory and CPU time from /proc; a
// Watch samples them while an attack runs. Legit is a well-behaved client
// whose latencies say what the attack cost everyone else. Log collects
// the outcomes into the hostile-client table, e2e/HOSTILE.md.
package hostile
