package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The gRPC listener's TLS: AUTHLIMIT_GRPC_TLS_CERT and _KEY serve TLS,
// AUTHLIMIT_GRPC_TLS_CLIENT_CA requires and verifies a client certificate
// it signed (mutual TLS). The files are read again when they change (see
// grpcTLS.check), so a renewed certificate is served without a restart.

// tlsFiles are the gRPC listener's certificate, key and client CA files.
type tlsFiles struct{ cert, key, clientCA string }

// tlsFileError is a mistake in one of the files, naming its variable.
type tlsFileError struct {
	field string // the variable, without envPrefix
	err   error
}

func (e *tlsFileError) Error() string { return envPrefix + e.field + ": " + e.err.Error() }
func (e *tlsFileError) Unwrap() error { return e.err }

// grpcTLSSettings reads AUTHLIMIT_GRPC_TLS_CERT, _KEY and _CLIENT_CA, and
// loads the files: each mistake names its variable.
func grpcTLSSettings(s *settings, _ map[string]string, p *problems) {
	c := &s.config
	f := tlsFiles{c.GRPCTLSCert, c.GRPCTLSKey, c.GRPCTLSClientCA}
	if f == (tlsFiles{}) {
		return
	}
	bad := false
	if f.cert != "" && f.key == "" {
		p.add("GRPC_TLS_KEY", errors.New("unset, and AUTHLIMIT_GRPC_TLS_CERT is set: set both, the certificate's private key here"))
		bad = true
	}
	if f.key != "" && f.cert == "" {
		p.add("GRPC_TLS_CERT", errors.New("unset, and AUTHLIMIT_GRPC_TLS_KEY is set: set both, the certificate chain here"))
		bad = true
	}
	if f.clientCA != "" && f.cert == "" {
		p.add("GRPC_TLS_CLIENT_CA", errors.New("set without AUTHLIMIT_GRPC_TLS_CERT and AUTHLIMIT_GRPC_TLS_KEY: mutual TLS needs the server's certificate too"))
		bad = true
	}
	if bad {
		return
	}
	if c.GRPCListen == "" {
		s.warnings = append(s.warnings, envPrefix+"GRPC_TLS_CERT is set, AUTHLIMIT_GRPC_LISTEN is not: no gRPC listener serves TLS")
	}
	cfg, err := loadTLSFiles(f)
	if err != nil {
		for _, e := range unjoin(err) {
			var fe *tlsFileError
			if errors.As(e, &fe) {
				p.add(fe.field, fe.err)
			} else {
				p.add("GRPC_TLS_CERT", e)
			}
		}
		return
	}
	s.grpcTLS = cfg
}

// loadTLSFiles reads the files into the configuration of a handshake: TLS
// 1.2 at least, h2 by ALPN, and with a client CA, a client certificate
// it signed required.
func loadTLSFiles(f tlsFiles) (*tls.Config, error) {
	certPEM, errCert := os.ReadFile(f.cert)
	keyPEM, errKey := os.ReadFile(f.key)
	var errs []error
	if errCert != nil {
		errs = append(errs, &tlsFileError{"GRPC_TLS_CERT", errCert})
	} else if err := checkCertPEM(certPEM); err != nil {
		errs = append(errs, &tlsFileError{"GRPC_TLS_CERT", fmt.Errorf("%s: %w", f.cert, err)})
		errCert = err
	}
	if errKey != nil {
		errs = append(errs, &tlsFileError{"GRPC_TLS_KEY", errKey})
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if errCert == nil && errKey == nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			errs = append(errs, &tlsFileError{"GRPC_TLS_KEY", fmt.Errorf("%s with %s: %w", f.key, f.cert, err)})
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if f.clientCA != "" {
		caPEM, err := os.ReadFile(f.clientCA)
		switch {
		case err != nil:
			errs = append(errs, &tlsFileError{"GRPC_TLS_CLIENT_CA", err})
		default:
			pool := x509.NewCertPool()
			if err := checkCertPEM(caPEM); err != nil {
				errs = append(errs, &tlsFileError{"GRPC_TLS_CLIENT_CA", fmt.Errorf("%s: %w", f.clientCA, err)})
			} else if !pool.AppendCertsFromPEM(caPEM) {
				errs = append(errs, &tlsFileError{"GRPC_TLS_CLIENT_CA", fmt.Errorf("%s: no certificate in it", f.clientCA)})
			}
			cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

// checkCertPEM reports whether b holds PEM certificates, each of which
// parses, and nothing else.
func checkCertPEM(b []byte) error {
	n := 0
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return fmt.Errorf("a PEM block of type %q where certificates are wanted", blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("no PEM certificate in it")
	}
	if strings.TrimSpace(string(b)) != "" {
		return errors.New("text after the last PEM certificate that is not PEM")
	}
	return nil
}

// describeGRPCTLS adds the gRPC listener's TLS to -check's output.
func (s *settings) describeGRPCTLS(w func(k, v string)) {
	if s.GRPCListen == "" {
		return
	}
	switch {
	case s.grpcTLS == nil:
		w("grpc tls", "off: h2c, cleartext (AUTHLIMIT_GRPC_TLS_CERT unset)")
	case s.grpcTLS.ClientCAs == nil:
		w("grpc tls", fmt.Sprintf("TLS 1.2+, h2; certificate %s (%s), reloaded when it changes", s.GRPCTLSCert, certSummary(s.grpcTLS)))
	default:
		w("grpc tls", fmt.Sprintf("mutual TLS 1.2+, h2; certificate %s (%s); client certificates signed by %s required; reloaded when they change", s.GRPCTLSCert, certSummary(s.grpcTLS), s.GRPCTLSClientCA))
	}
}

// certSummary names the configuration's certificate and its expiry.
func certSummary(cfg *tls.Config) string {
	if len(cfg.Certificates) == 0 || cfg.Certificates[0].Leaf == nil {
		return "?"
	}
	l := cfg.Certificates[0].Leaf
	return fmt.Sprintf("%s, serial %s, expires %s", l.Subject.CommonName, l.SerialNumber, l.NotAfter.UTC().Format(time.RFC3339))
}

// tlsPollInterval is how often the TLS files are looked at.
const tlsPollInterval = time.Second

// grpcTLS serves the gRPC listener's handshakes with the configuration of
// the files as they last loaded, and reloads them when they change.
type grpcTLS struct {
	files tlsFiles
	cur   atomic.Pointer[tls.Config]
	// stamp is the files' state at the last load (see tlsStamp): the
	// poll reloads when it differs, once per change, so that a bad file
	// is logged and counted once.
	stamp   string
	reloads *prometheus.CounterVec
	log     *slog.Logger
}

func newGRPCTLS(f tlsFiles, cfg *tls.Config, reg prometheus.Registerer, log *slog.Logger) *grpcTLS {
	g := &grpcTLS{files: f, log: log, stamp: tlsStamp(f), reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authlimit_grpc_tls_reloads_total",
		Help: "Reloads of the gRPC listener's TLS files (AUTHLIMIT_GRPC_TLS_*) after they changed, by result: ok, or error (the previous certificate is kept; the log says why).",
	}, []string{"result"})}
	g.cur.Store(cfg)
	expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "authlimit_grpc_tls_certificate_expiry_seconds",
		Help: "When the gRPC listener's certificate in force expires, in seconds since the Unix epoch: alert well before time() reaches it.",
	}, func() float64 {
		c := g.cur.Load()
		if len(c.Certificates) == 0 || c.Certificates[0].Leaf == nil {
			return 0
		}
		return float64(c.Certificates[0].Leaf.NotAfter.Unix())
	})
	reg.MustRegister(g.reloads, expiry)
	return g
}

// config is the listener's configuration: each handshake takes the
// files' configuration in force when it begins, so that a reload changes
// no connection already made and drops no call.
func (g *grpcTLS) config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return g.cur.Load(), nil }}
}

// poll checks the files every interval until stop is closed.
func (g *grpcTLS) poll(stop <-chan struct{}, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			g.check()
		}
	}
}

// check reloads the files if they changed since the last load: a file
// replaced, written, or reached through a swapped symlink (a Kubernetes
// Secret's ..data). A load that fails keeps the configuration in force.
func (g *grpcTLS) check() {
	stamp := tlsStamp(g.files)
	if stamp == g.stamp {
		return
	}
	g.stamp = stamp
	cfg, err := loadTLSFiles(g.files)
	if err != nil {
		g.reloads.WithLabelValues("error").Inc()
		g.log.Error("grpc tls files changed and do not load; the previous certificate is kept", "err", err)
		return
	}
	g.cur.Store(cfg)
	g.reloads.WithLabelValues("ok").Inc()
	g.log.Info("grpc tls files reloaded", "certificate", certSummary(cfg))
}

// tlsStamp is the files' state: each one's path after symlinks, size,
// and modification time.
func tlsStamp(f tlsFiles) string {
	var b strings.Builder
	for _, p := range []string{f.cert, f.key, f.clientCA} {
		if p == "" {
			continue
		}
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v;", p, err)
			continue
		}
		fi, err := os.Stat(target)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v;", p, err)
			continue
		}
		fmt.Fprintf(&b, "%s %d %d;", target, fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String()
}
