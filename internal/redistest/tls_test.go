package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartTLS(t *testing.T) {
	t.Parallel()
	s := StartTLS(t)
	if !strings.HasPrefix(s.URL, "rediss://127.0.0.1:") {
		t.Errorf("URL = %q, want rediss://127.0.0.1:<port>", s.URL)
	}
	ping := func(t *testing.T, opts *redis.Options) error {
		t.Helper()
		opts.MaxRetries = -1
		c := redis.NewClient(opts)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}

	t.Run("Client", func(t *testing.T) {
		if err := s.Client(t).Ping(context.Background()).Err(); err != nil {
			t.Errorf("PING = %v", err)
		}
	})
	t.Run("good CA", func(t *testing.T) {
		if err := ping(t, s.Options(t, s.CAFile)); err != nil {
			t.Errorf("PING trusting CAFile = %v", err)
		}
	})
	t.Run("localhost", func(t *testing.T) {
		opts := s.Options(t, s.CAFile)
		opts.TLSConfig.ServerName = "localhost"
		if err := ping(t, opts); err != nil {
			t.Errorf("PING as localhost = %v", err)
		}
	})
	t.Run("wrong CA", func(t *testing.T) {
		err := ping(t, s.Options(t, s.WrongCAFile))
		var unknown x509.UnknownAuthorityError
		var verify *tls.CertificateVerificationError
		if !errors.As(err, &unknown) && !errors.As(err, &verify) {
			t.Errorf("PING trusting WrongCAFile = %v, want a certificate error", err)
		}
	})
	t.Run("wrong name", func(t *testing.T) {
		opts := s.Options(t, s.CAFile)
		opts.TLSConfig.ServerName = "redis.example"
		var hostname x509.HostnameError
		if err := ping(t, opts); !errors.As(err, &hostname) {
			t.Errorf("PING as redis.example = %v, want a hostname error", err)
		}
	})
	t.Run("plain TCP", func(t *testing.T) {
		opts := s.Options(t, s.CAFile)
		opts.TLSConfig = nil
		opts.DialTimeout, opts.ReadTimeout = time.Second, time.Second
		if err := ping(t, opts); err == nil {
			t.Errorf("PING without TLS succeeded")
		}
	})
	t.Run("TLSConfig", func(t *testing.T) {
		c, err := tls.Dial("tcp", s.Addr, TLSConfig(t, s.CAFile))
		if err != nil {
			t.Fatalf("tls.Dial: %v", err)
		}
		defer c.Close()
		rc := &respConn{conn: c, r: bufio.NewReader(c)}
		if v, err := rc.do("PING"); err != nil || v != "PONG" {
			t.Errorf("PING = %v, %v", v, err)
		}
		if _, err := tls.Dial("tcp", s.Addr, TLSConfig(t, s.WrongCAFile)); err == nil {
			t.Errorf("tls.Dial trusting the wrong CA succeeded")
		}
	})
}
