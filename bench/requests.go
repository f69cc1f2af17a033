package main

// This file prebuilds the workloads' requests and their client addresses.

import (
	"fmt"
	"net/netip"
)

// buildRequests prebuilds one GET of path per client IP, each carrying the
// IP in X-Forwarded-For.
func buildRequests(path string, ips []netip.Addr) [][]byte {
	reqs := make([][]byte, len(ips))
	for i, ip := range ips {
		reqs[i] = fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: authlimit-bench\r\nX-Forwarded-For: %s\r\n\r\n", path, ip)
	}
	return reqs
}

// clientIPs returns n (at most maxIPs) distinct addresses from
// 198.18.0.0/15, the range set aside for benchmarks (RFC 2544), so no
// trusted-proxy range holds them.
func clientIPs(n int) []netip.Addr {
	ips := make([]netip.Addr, n)
	for i := range ips {
		v := uint32(i) + 1
		ips[i] = netip.AddrFrom4([4]byte{198, 18 + byte(v>>16), byte(v >> 8), byte(v)})
	}
	return ips
}

// maxIPs is how many client IPs clientIPs can make, hotIP left out.
const maxIPs = 1<<17 - 2

// hotIP is the one client of the hot workload.
func hotIP() netip.Addr { return netip.AddrFrom4([4]byte{198, 19, 255, 255}) }
