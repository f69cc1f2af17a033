package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TLSServer is a redis-server that listens for TLS only, with a
// certificate for 127.0.0.1 and localhost signed by a CA made for the test.
type TLSServer struct {
	// Server's URL is rediss://127.0.0.1:<port>, and its Client trusts
	// CAFile.
	*Server
	// CAFile is the PEM certificate of the CA that signed the server's.
	CAFile string
	// WrongCAFile is the PEM certificate of an unrelated CA, which a
	// client must refuse to trust the server by.
	WrongCAFile string
	// CertFile and KeyFile are the server's certificate and key (PEM).
	CertFile, KeyFile string
}

// StartTLS makes a CA, a server certificate for IP 127.0.0.1 and DNS name
// localhost, and a second unrelated CA, all ECDSA P-256 and valid for a
// day, writes them to a temporary directory, and starts redis-server with
//
//	--port 0 --tls-port <port> --tls-cert-file … --tls-key-file … --tls-ca-cert-file … --tls-auth-clients no
//
// stopped when t ends. WithArgs and WithDebugCommand add arguments.
func StartTLS(t testing.TB, opts ...Option) *TLSServer {
	t.Helper()
	o := newOptions(opts)
	dir := t.TempDir()
	s := &TLSServer{
		CAFile:      filepath.Join(dir, "ca.pem"),
		WrongCAFile: filepath.Join(dir, "wrong-ca.pem"),
		CertFile:    filepath.Join(dir, "server.pem"),
		KeyFile:     filepath.Join(dir, "server-key.pem"),
	}
	if err := writeCertificates(s); err != nil {
		t.Fatalf("redistest: StartTLS: %v", err)
	}
	cfg := TLSConfig(t, s.CAFile)
	spec := procSpec{
		path: serverPath(t),
		dir:  t.TempDir(),
		extra: append([]string{
			"--tls-cert-file", s.CertFile,
			"--tls-key-file", s.KeyFile,
			"--tls-ca-cert-file", s.CAFile,
			"--tls-auth-clients", "no",
		}, o.args...),
		dial: func(addr string) (net.Conn, error) {
			return tls.DialWithDialer(&net.Dialer{Timeout: 200 * time.Millisecond}, "tcp", addr, cfg)
		},
	}
	p, err := startOwned(t, spec, 1, func(ports []int) []string {
		// "--port 0" after the standard "--port N" turns plain TCP off.
		return []string{"--port", "0", "--tls-port", strconv.Itoa(ports[0])}
	})
	if err != nil {
		t.Fatalf("redistest: StartTLS: %v", err)
	}
	s.Server = newServer(p)
	s.URL = "rediss://" + s.Addr
	s.tlsConfig = cfg
	return s
}

// Options returns client options for the server that trust only the CA in
// the PEM file caFile: s.CAFile to connect, s.WrongCAFile to see the
// handshake fail.
func (s *TLSServer) Options(t testing.TB, caFile string) *redis.Options {
	t.Helper()
	opts, err := redis.ParseURL(s.URL)
	if err != nil {
		t.Fatalf("redistest: parse %s: %v", s.URL, err)
	}
	opts.TLSConfig.RootCAs = TLSConfig(t, caFile).RootCAs
	return opts
}

// TLSConfig returns a client TLS configuration that trusts only the CA in
// the PEM file caFile. ServerName is left empty: tls.Dial and go-redis fill
// it in from the address dialed.
func TLSConfig(t testing.TB, caFile string) *tls.Config {
	t.Helper()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatalf("redistest: read CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("redistest: no PEM certificate in %s", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// writeCertificates makes the CAs and the server certificate and writes
// them to the files s names.
func writeCertificates(s *TLSServer) error {
	ca, caKey, err := newCA("authlimit test CA")
	if err != nil {
		return err
	}
	wrong, _, err := newCA("authlimit unrelated CA")
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate server key: %w", err)
	}
	tmpl, err := certTemplate("127.0.0.1")
	if err != nil {
		return err
	}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	tmpl.DNSNames = []string{"localhost"}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("sign server certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode server key: %w", err)
	}
	for _, f := range []struct {
		path, kind string
		der        []byte
	}{
		{s.CAFile, "CERTIFICATE", ca.Raw},
		{s.WrongCAFile, "CERTIFICATE", wrong.Raw},
		{s.CertFile, "CERTIFICATE", der},
		{s.KeyFile, "PRIVATE KEY", keyDER},
	} {
		b := pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der})
		if err := os.WriteFile(f.path, b, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", f.path, err)
		}
	}
	return nil
}

// newCA makes a self-signed CA certificate and its key.
func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl, err := certTemplate(name)
	if err != nil {
		return nil, nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign CA %q: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA %q: %w", name, err)
	}
	return cert, key, nil
}

// certTemplate returns a certificate valid from an hour ago for a day.
func certTemplate(name string) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
	}, nil
}
