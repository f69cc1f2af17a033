package main

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// grpcPeerSettings reads AUTHLIMIT_GRPC_TRUSTED_PEERS: the addresses the
// gRPC listener serves, AUTHLIMIT_TRUSTED_PROXIES's when unset. A gRPC
// call names the client it is for in its message, as a proxy's forwarded
// headers do: whoever may call may spend any client's quota and choose
// its tier, so only the gateway's addresses should.
func grpcPeerSettings(s *settings, _ map[string]string, p *problems) {
	c, problem := &s.config, p.add
	if len(c.GRPCTrustedPeers) == 0 {
		s.grpcPeers = s.trusted
	} else {
		s.grpcPeers = parsePrefixes("GRPC_TRUSTED_PEERS", c.GRPCTrustedPeers, problem)
	}
	if c.GRPCListen != "" && len(s.grpcPeers) == 0 && len(c.GRPCTrustedPeers) == 0 {
		problem("GRPC_TRUSTED_PEERS", errors.New("unset, and AUTHLIMIT_TRUSTED_PROXIES trusts no one: no peer could call the gRPC port; set it to the gateway's addresses"))
	}
}

// describeGRPCPeers adds the gRPC port's peers to -check's output.
func (s *settings) describeGRPCPeers(w func(k, v string)) {
	if s.GRPCListen == "" {
		return
	}
	from := "AUTHLIMIT_GRPC_TRUSTED_PEERS"
	if len(s.GRPCTrustedPeers) == 0 {
		from = "AUTHLIMIT_TRUSTED_PROXIES"
	}
	w("grpc peers", prefixes(s.grpcPeers)+" (from "+from+"); others are closed at accept")
}

// untrustedLogEvery bounds the log of refused gRPC peers: a line at most
// this often, with the count since the last.
const untrustedLogEvery = 10 * time.Second

// refusedPeers counts and logs the connections the gRPC listener refused
// because their peer is not trusted.
type refusedPeers struct {
	count  prometheus.Counter
	log    *slog.Logger
	mu     sync.Mutex
	last   time.Time
	unsaid int
}

func newRefusedPeers(reg prometheus.Registerer, log *slog.Logger) *refusedPeers {
	r := &refusedPeers{log: log, count: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "authlimit_grpc_untrusted_connections_total",
		Help: "Connections the gRPC listener closed at accept because their peer is not in AUTHLIMIT_GRPC_TRUSTED_PEERS (AUTHLIMIT_TRUSTED_PROXIES when unset).",
	})}
	reg.MustRegister(r.count)
	return r
}

// refused counts a refused connection from a, and logs it, or keeps it
// for the next line if one was logged less than untrustedLogEvery ago.
func (r *refusedPeers) refused(a net.Addr) {
	r.count.Inc()
	r.mu.Lock()
	r.unsaid++
	now := time.Now()
	if now.Sub(r.last) < untrustedLogEvery {
		r.mu.Unlock()
		return
	}
	n := r.unsaid
	r.unsaid, r.last = 0, now
	r.mu.Unlock()
	r.log.Warn("grpc connection refused: its peer is not trusted (AUTHLIMIT_GRPC_TRUSTED_PEERS)", "peer", a.String(), "refused", n)
}
