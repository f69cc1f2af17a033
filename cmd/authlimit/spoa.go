package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/front/spoa"
	"github.com/authlimit/authlimit/rules"
)

// spoaSettings checks AUTHLIMIT_SPOA_LISTEN, the address HAProxy's SPOE
// connects to: host:port, or unix:<path> as AUTHLIMIT_LISTEN takes it. It
// takes connections from AUTHLIMIT_TRUSTED_PROXIES alone, so it needs
// some; a Unix socket's peer is local, and counts as 127.0.0.1.
func spoaSettings(s *settings, _ map[string]string, p *problems) {
	c, problem := &s.config, p.add
	if c.SPOAListen == "" {
		return
	}
	network, address, err := parseListen(c.SPOAListen, ":12345", "/run/authlimit/spoa.sock")
	if err != nil {
		problem("SPOA_LISTEN", err)
	}
	s.spoaNetwork, s.spoaAddress = network, address
	switch {
	case len(s.trusted) == 0:
		problem("SPOA_LISTEN", errors.New("set, but AUTHLIMIT_TRUSTED_PROXIES is none: the SPOE agent takes connections from trusted proxies alone, so HAProxy could never connect"))
	case network == "unix" && !(&rules.Proxies{Trusted: s.trusted}).Trusts(spoa.UnixPeer()):
		problem("SPOA_LISTEN", fmt.Errorf("a Unix socket, but AUTHLIMIT_TRUSTED_PROXIES does not hold %s: a Unix socket's peer counts as %s, so HAProxy could never connect", spoa.UnixPeer(), spoa.UnixPeer()))
	}
}

// describeSPOA adds the SPOE agent to -check's output.
func (s *settings) describeSPOA(w func(k, v string)) {
	switch {
	case s.SPOAListen == "":
		w("spoa", "off (AUTHLIMIT_SPOA_LISTEN unset)")
	case s.spoaNetwork == "unix":
		w("spoa", fmt.Sprintf("%s (HAProxy SPOE agent on a Unix socket: made with authlimit's umask, removed at exit; a peer counts as %s, one of the trusted proxies)", s.SPOAListen, spoa.UnixPeer()))
	default:
		w("spoa", s.SPOAListen+" (HAProxy SPOE agent; connections from the trusted proxies)")
	}
}

// spoaFront is the SPOE agent's server and listener.
type spoaFront struct {
	server   *spoa.Server
	listener net.Listener
}

// newSPOA builds the SPOE agent on the engine, listening at once so that
// a port in use stops authlimit at start; nothing without
// AUTHLIMIT_SPOA_LISTEN.
func (a *app) newSPOA(s *settings) error {
	if s.SPOAListen == "" {
		return nil
	}
	agent, err := spoa.NewAgent(spoa.AgentOptions{Engine: a.engine, Stopping: a.stopping, Log: a.log})
	if err != nil {
		return err
	}
	accepted := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "authlimit_spoa_connections_accepted_total",
		Help: "Connections the SPOE agent (AUTHLIMIT_SPOA_LISTEN) accepted. HAProxy keeps a few per thread alive: a count that grows with the requests means its connections end (see authlimit_spoa_protocol_errors_total).",
	})
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "authlimit_spoa_connections_refused_total",
		Help: "Connections to the SPOE agent closed at once because their peer is not in AUTHLIMIT_TRUSTED_PROXIES.",
	})
	protocol := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_spoa_protocol_errors_total",
		Help: "Connections the SPOE agent ended with AGENT-DISCONNECT for a frame that breaks SPOP, by SPOP status code (3 frame too big, 4 invalid frame, 10 fragmentation, 13 no room in AUTHLIMIT_MAX_BUFFERED_BYTES for a frame, ...).",
	}, []string{"status"})
	if err := registerAll(a.reg, accepted, refused, protocol); err != nil {
		return err
	}
	srv, err := spoa.NewServer(spoa.Options{
		Handler:       agent,
		Trusted:       s.trusted,
		Conns:         a.connCap,
		Budget:        a.budget,
		HelloTimeout:  serverTimeouts.Read,
		FrameTimeout:  serverTimeouts.Read,
		IdleTimeout:   serverTimeouts.Idle,
		WriteTimeout:  streamWriteTimeout,
		Accepted:      accepted.Inc,
		Refused:       refused.Inc,
		ProtocolError: func(status int) { protocol.WithLabelValues(strconv.Itoa(status)).Inc() },
		Log:           a.log,
	})
	if err != nil {
		return err
	}
	l, err := listen(s.spoaNetwork, s.spoaAddress)
	if err != nil {
		return fmt.Errorf("listen on AUTHLIMIT_SPOA_LISTEN %s: %w", s.SPOAListen, err)
	}
	a.spoa = &spoaFront{server: srv, listener: l}
	a.closers = append(a.closers, func() error { srv.Close(); _ = l.Close(); return nil })
	return nil
}

func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// serveSPOA serves the SPOE agent in the background; nil without it.
func (a *app) serveSPOA() <-chan error {
	if a.spoa == nil {
		return nil
	}
	a.log.Info("spoa serving", "listen", a.spoa.listener.Addr().String())
	served := make(chan error, 1)
	go func() {
		err := a.spoa.server.Serve(a.spoa.listener)
		if errors.Is(err, spoa.ErrServerClosed) {
			return
		}
		served <- fmt.Errorf("serve the spoe agent: %w", err)
	}()
	return served
}

// stopSPOA shuts the SPOE agent down: the frames in flight are answered,
// each connection says AGENT-DISCONNECT, until ctx ends. The channel
// closes once it has stopped.
func (a *app) stopSPOA(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	if a.spoa == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		_ = a.spoa.server.Shutdown(ctx)
	}()
	return done
}
