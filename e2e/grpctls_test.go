//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/authlimit/authlimit/internal/tlstest"
)

// port is addr's port.
func port(addr string) string {
	_, p, _ := strings.Cut(addr, ":")
	return p
}

// TestGRPCTLSNghttp: nghttp, an HTTP/2 client of its own TLS stack
// (OpenSSL), calls the health service over TLS and mutual TLS, verifying
// authlimit's certificate against the test's CA; without a client
// certificate, mutual TLS refuses it.
func TestGRPCTLSNghttp(t *testing.T) {
	nghttp, err := exec.LookPath("nghttp")
	if err != nil {
		t.Fatal("nghttp (nghttp2-client) is not installed")
	}
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "authlimit e2e CA")
	srv, cli := ca.Server(t, 42), ca.Client(t, 43, "gateway")
	files := map[string][]byte{"ca.crt": ca.PEM, "tls.crt": srv.CertPEM, "tls.key": srv.KeyPEM, "client.crt": cli.CertPEM, "client.key": cli.KeyPEM,
		// A gRPC message of an empty HealthCheckRequest: uncompressed, 0 bytes.
		"check.bin": {0, 0, 0, 0, 0}}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	call := func(t *testing.T, addr string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(nghttp, append([]string{"-v", "-n", "-d", filepath.Join(dir, "check.bin"),
			"-H", "content-type: application/grpc", "-H", "te: trailers",
			"https://localhost:" + port(addr) + "/grpc.health.v1.Health/Check"}, args...)...)
		// OpenSSL's default trust store: the test's CA alone.
		cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+filepath.Join(dir, "ca.crt"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	served := func(t *testing.T, out string) {
		t.Helper()
		for _, want := range []string{"The negotiated protocol: h2", "grpc-status: 0", "recv DATA frame <length=7"} {
			if !strings.Contains(out, want) {
				t.Errorf("nghttp's output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(strings.ToLower(out), "certificate verification failed") {
			t.Errorf("nghttp did not verify authlimit's certificate with the CA:\n%s", out)
		}
	}
	t.Run("TLS", func(t *testing.T) {
		grpc := freeAddr(t)
		startAuthlimit(t, "authlimit", map[string]string{"AUTHLIMIT_GRPC_LISTEN": grpc,
			"AUTHLIMIT_GRPC_TLS_CERT": filepath.Join(dir, "tls.crt"), "AUTHLIMIT_GRPC_TLS_KEY": filepath.Join(dir, "tls.key")})
		out, err := call(t, grpc)
		if err != nil {
			t.Fatalf("nghttp: %v\n%s", err, out)
		}
		served(t, out)
	})
	t.Run("mutual TLS", func(t *testing.T) {
		grpc := freeAddr(t)
		startAuthlimit(t, "authlimit", map[string]string{"AUTHLIMIT_GRPC_LISTEN": grpc,
			"AUTHLIMIT_GRPC_TLS_CERT": filepath.Join(dir, "tls.crt"), "AUTHLIMIT_GRPC_TLS_KEY": filepath.Join(dir, "tls.key"),
			"AUTHLIMIT_GRPC_TLS_CLIENT_CA": filepath.Join(dir, "ca.crt")})
		out, err := call(t, grpc, "--cert", filepath.Join(dir, "client.crt"), "--key", filepath.Join(dir, "client.key"))
		if err != nil {
			t.Fatalf("nghttp with a client certificate: %v\n%s", err, out)
		}
		served(t, out)
		out, _ = call(t, grpc)
		if strings.Contains(out, "grpc-status") || !strings.Contains(out, "processed=0") {
			t.Fatalf("nghttp without a client certificate was served:\n%s", out)
		}
	})
}

// TestH2specTLS runs h2spec against the gRPC port over TLS: the frames
// go through crypto/tls rather than straight to the socket, and every
// case passes as in cleartext.
func TestH2specTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "authlimit e2e CA")
	srv := ca.Server(t, 44)
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for p, b := range map[string][]byte{cert: srv.CertPEM, key: srv.KeyPEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	grpc := freeAddr(t)
	startAuthlimit(t, "authlimit", map[string]string{"AUTHLIMIT_GRPC_LISTEN": grpc, "AUTHLIMIT_GRPC_TLS_CERT": cert, "AUTHLIMIT_GRPC_TLS_KEY": key})
	checkH2spec(t, grpc, "-t", "-k")
}
