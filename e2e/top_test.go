//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/redistest"
)

// adminToken is the admin token of the suite's authlimits.
const adminToken = "e2e-admin-token-0123456789"

// admin asks an authlimit's admin API.
func admin(t *testing.T, addr, method, path string, headers ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// authAs asks an authlimit's /auth as a trusted proxy would for client,
// and returns the status.
func authAs(t *testing.T, addr, client string) int {
	t.Helper()
	status, err := tryAuth(addr, client)
	if err != nil {
		t.Fatalf("/auth for %s: %v", client, err)
	}
	return status
}

// tryAuth is authAs for a goroutine of the test's own.
func tryAuth(addr, client string) (int, error) {
	req, err := http.NewRequest("GET", "http://"+addr+"/auth", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Forwarded-For", client)
	req.Header.Set("X-Forwarded-Method", "GET")
	req.Header.Set("X-Forwarded-Uri", "/api/orders")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

type topAnswer struct {
	Current struct {
		Exact    bool `json:"exact"`
		Replicas int  `json:"replicas"`
		Entries  []struct {
			Tag    string `json:"tag"`
			Client string `json:"client"`
			Denied int    `json:"denied"`
		} `json:"entries"`
	} `json:"current"`
}

// TestTopAcrossReplicas: two replicas share Redis; three clients are
// denied 35, 20 and 10 times between them. GET /v1/top on either replica
// lists exactly those counts, in that order, within 15 s.
func TestTopAcrossReplicas(t *testing.T) {
	srv := redistest.New(t)
	env := map[string]string{
		"AUTHLIMIT_REDIS_URL":       srv.URL,
		"AUTHLIMIT_KEY_PREFIX":      fmt.Sprintf("e2etop%d", time.Now().UnixNano()),
		"AUTHLIMIT_RULES":           "name=per-ip limit=1/1h key=ip",
		"AUTHLIMIT_ADMIN_TOKEN":     adminToken,
		"AUTHLIMIT_DENY_CACHE_SIZE": "0",
	}
	var reps []*authlimit
	var admins []string
	for i := 0; i < 2; i++ {
		a := freeAddr(t)
		env["AUTHLIMIT_ADMIN_LISTEN"] = a
		reps = append(reps, startAuthlimit(t, fmt.Sprintf("authlimit-%d", i), env))
		admins = append(admins, a)
	}
	want := []struct {
		client string
		denied int
	}{{"198.51.100.11", 35}, {"198.51.100.12", 20}, {"198.51.100.13", 10}}
	for _, w := range want {
		// One admitted request, then the denials, alternating replicas.
		for i := 0; i <= w.denied; i++ {
			status := authAs(t, reps[i%2].addr, w.client)
			if (i == 0) != (status == 200) {
				t.Fatalf("request %d of %s: status %d", i, w.client, status)
			}
		}
	}
	sent := time.Now()
	wantText := fmt.Sprintf("%s=%d %s=%d %s=%d", want[0].client, want[0].denied, want[1].client, want[1].denied, want[2].client, want[2].denied)
	for i, a := range admins {
		var got string
		for {
			status, body := admin(t, a, "GET", "/v1/top?rule=per-ip&n=10")
			if status != 200 {
				t.Fatalf("replica %d: GET /v1/top: %d %s", i, status, body)
			}
			var ans topAnswer
			if err := json.Unmarshal(body, &ans); err != nil {
				t.Fatalf("replica %d: %v: %s", i, err, body)
			}
			var parts []string
			for _, e := range ans.Current.Entries {
				parts = append(parts, fmt.Sprintf("%s=%d", e.Client, e.Denied))
			}
			got = strings.Join(parts, " ")
			if got == wantText && ans.Current.Exact && ans.Current.Replicas == 2 {
				break
			}
			if time.Since(sent) > 15*time.Second {
				t.Fatalf("replica %d after 15s: top %s (exact %v, replicas %d), want %s", i, got, ans.Current.Exact, ans.Current.Replicas, wantText)
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("replica %d lists %s, %.1fs after the last denial", i, got, time.Since(sent).Seconds())
	}
}

// TestDenialLogNamesTheRule: twenty denials of one client under one rule
// write one denial log line, naming the rule, the client and the request.
func TestDenialLogNamesTheRule(t *testing.T) {
	a := startAuthlimit(t, "authlimit", map[string]string{
		"AUTHLIMIT_RULES":      "name=orders limit=1/1h key=ip path=/api",
		"AUTHLIMIT_LOG_FORMAT": "json",
	})
	for i := 0; i <= 20; i++ {
		if status := authAs(t, a.addr, "203.0.113.7"); (i == 0) != (status == 200) {
			t.Fatalf("request %d: status %d", i, status)
		}
	}
	// Every line these requests make is written in one flush: poll
	// until the first shows, then a little longer for any other.
	var lines []map[string]any
	deadline := time.Now().Add(10 * time.Second)
	for len(lines) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		lines = denialLines(t, a.log)
	}
	for settle := time.Now().Add(time.Second); time.Now().Before(settle); {
		time.Sleep(100 * time.Millisecond)
		lines = denialLines(t, a.log)
	}
	if len(lines) != 1 {
		t.Fatalf("%d denial log lines, want 1:\n%s", len(lines), tail(a.log, 20))
	}
	for k, want := range map[string]any{"rule": "orders", "client": "203.0.113.7", "key": "203.0.113.7", "method": "GET", "path": "/api/orders", "front": "http"} {
		if lines[0][k] != want {
			t.Errorf("%s = %v, want %v", k, lines[0][k], want)
		}
	}
}

// denialLines returns the denial log lines in an authlimit's log.
func denialLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "rate limit denied" {
			out = append(out, m)
		}
	}
	return out
}
