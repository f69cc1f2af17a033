package main

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
)

// TestStartReportsEveryPortInUse: the fronts and the admin API each listen
// on a port of their own; a start whose gRPC and admin ports are both
// taken reports both at once, not the first alone.
func TestStartReportsEveryPortInUse(t *testing.T) {
	var taken []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		taken = append(taken, l.Addr().String())
	}
	s, err := loadConfig(map[string]string{
		"AUTHLIMIT_GRPC_LISTEN":  taken[0],
		"AUTHLIMIT_ADMIN_LISTEN": taken[1],
		"AUTHLIMIT_ADMIN_TOKEN":  adminToken,
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := newApp(context.Background(), s, slog.New(slog.DiscardHandler))
	if err == nil {
		a.close()
		t.Fatal("newApp with both ports taken succeeded")
	}
	for _, want := range []string{"AUTHLIMIT_GRPC_LISTEN " + taken[0], "AUTHLIMIT_ADMIN_LISTEN " + taken[1]} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("newApp = %v; want it to name %s", err, want)
		}
	}
}
