package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// configMap writes files as a Kubernetes ConfigMap volume holds them: in a
// "..<version>" directory that ..data points to, each file a symlink
// through ..data. Each call is one update: a new version directory and an
// atomic swap of ..data.
type configMap struct {
	dir     string
	version int
}

func (c *configMap) write(t *testing.T, files map[string]string) {
	t.Helper()
	c.version++
	v := fmt.Sprintf("..2026_11_25_%d", c.version)
	if err := os.Mkdir(filepath.Join(c.dir, v), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(c.dir, v, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(c.dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(v, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

func rlsYAML(rpu int, unit string) string {
	return fmt.Sprintf("domain: shop\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: %s\n      requests_per_unit: %d\n", unit, rpu)
}

// rlsJSON asks POST /json for the api key and returns the status.
func (a *testApp) rlsJSON(t *testing.T, key string) int {
	t.Helper()
	return a.do(t, request{method: "POST", path: "/json", body: `{"domain":"shop","descriptors":[{"entries":[{"key":"api_key","value":"` + key + `"}]}]}`}).status
}

// TestRLSConfigReloadsLive: AUTHLIMIT_RLS_CONFIG, a ConfigMap directory,
// reloads when its ..data is swapped: a new limit holds within 2 s and the
// counts carry over; a bad configuration, or a unit changed in place,
// leaves the one in force, logs every mistake naming the variable and is
// counted; the admin API's reload says what happened.
func TestRLSConfigReloadsLive(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, env map[string]string) {
		cm := &configMap{dir: t.TempDir()}
		cm.write(t, map[string]string{"ratelimit.yaml": rlsYAML(2, "hour")})
		a := startApp(t, with(env, "AUTHLIMIT_RLS_CONFIG", cm.dir, "AUTHLIMIT_ADMIN_LISTEN", "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN", adminToken))
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		if err := a.app.reload.watch(ctx); err != nil {
			t.Fatal(err)
		}
		// Load all along: every answer is a decision, never an error.
		stop, loaded := make(chan struct{}), make(chan []int, 1)
		go func() {
			var bad []int
			for {
				select {
				case <-stop:
					loaded <- bad
					return
				default:
				}
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				req.SetRequestURI("http://authlimit/json")
				req.Header.SetMethod("POST")
				req.SetBodyString(`{"domain":"shop","descriptors":[{"entries":[{"key":"api_key","value":"load"}]}]}`)
				if err := a.client.Do(req, resp); err != nil {
					bad = append(bad, -1)
				} else if s := resp.StatusCode(); s != 200 && s != 429 {
					bad = append(bad, s)
				}
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
			}
		}()
		t.Cleanup(func() {
			close(stop)
			if bad := <-loaded; len(bad) > 0 {
				t.Errorf("under load across the reloads, %d answers were neither 200 nor 429 (-1: no answer): %v", len(bad), bad)
			}
		})
		for i := 0; i < 2; i++ {
			if s := a.rlsJSON(t, "k1"); s != 200 {
				t.Fatalf("request %d: %d, want 200", i, s)
			}
		}
		if s := a.rlsJSON(t, "k1"); s != 429 {
			t.Fatalf("over the limit of 2: %d", s)
		}

		cm.write(t, map[string]string{"ratelimit.yaml": rlsYAML(3, "hour")})
		deadline := time.Now().Add(2 * time.Second)
		for metric(t, a, `authlimit_config_reloads_total{config="rls",result="success"}`) < 1 {
			if time.Now().After(deadline) {
				t.Fatalf("the new configuration is not in force 2 s after the swap; logs:\n%s", a.logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The counts carry over: 2 spent of the new 3.
		if s := a.rlsJSON(t, "k1"); s != 200 {
			t.Errorf("under the new limit of 3 after 2: %d, want 200", s)
		}
		if s := a.rlsJSON(t, "k1"); s != 429 {
			t.Errorf("over the new limit of 3: %d, want 429: the counts did not carry over", s)
		}

		for i, bad := range []struct{ yaml, want string }{
			{"domain: shop\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: x}\n  - key: other\n    rate_limt: {}\n", "requests_per_unit"},
			{rlsYAML(3, "minute"), "rate_limit.unit"},
		} {
			refused := metric(t, a, `authlimit_config_reloads_total{config="rls",result="error"}`)
			cm.write(t, map[string]string{"ratelimit.yaml": bad.yaml})
			deadline := time.Now().Add(2 * time.Second)
			for metric(t, a, `authlimit_config_reloads_total{config="rls",result="error"}`) <= refused {
				if time.Now().After(deadline) {
					t.Fatalf("bad configuration %d is not refused 2 s after the swap; logs:\n%s", i, a.logs.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if logs := a.logs.String(); !strings.Contains(logs, "AUTHLIMIT_RLS_CONFIG") || !strings.Contains(logs, bad.want) {
				t.Errorf("bad configuration %d: the logs do not name the variable and %s:\n%s", i, bad.want, logs)
			}
			if s := a.rlsJSON(t, "k1"); s != 429 {
				t.Errorf("after bad configuration %d: %d, want 429 under the limit in force", i, s)
			}
			if s := a.rlsJSON(t, "k2"); s != 200 {
				t.Errorf("another key after bad configuration %d: %d, want 200", i, s)
			}
			status, body := a.adminDo(t, "POST", "/v1/reload", adminToken)
			if status != 422 || !strings.Contains(body, `"config": "rls"`) || !strings.Contains(body, bad.want) {
				t.Errorf("POST /v1/reload of bad configuration %d: %d %s", i, status, body)
			}
		}
		// The first bad file had two mistakes: both were logged.
		if logs := a.logs.String(); !strings.Contains(logs, "rate_limt") {
			t.Errorf("the second mistake is not logged:\n%s", logs)
		}
		cm.write(t, map[string]string{"ratelimit.yaml": rlsYAML(3, "hour")})
		status, body := a.adminDo(t, "POST", "/v1/reload", adminToken)
		if status != 200 || !strings.Contains(body, `"result": "unchanged"`) && !strings.Contains(body, `"result": "success"`) {
			t.Errorf("POST /v1/reload of the good configuration again: %d %s", status, body)
		}
	})
}

// TestRulesReloadKeepsRLSPolicies: the guard knows the policies of the
// rules and of AUTHLIMIT_RLS_CONFIG together, whichever reloads: after a
// rules reload, a rate-limit service denial is still remembered by the
// deny cache (which remembers only the policies the guard knows), and
// after an RLS reload, a rule's denial is.
func TestRulesReloadKeepsRLSPolicies(t *testing.T) {
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.conf")
	rlsFile := filepath.Join(dir, "ratelimit.yaml")
	write := func(path, body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(rulesFile, "name=r limit=1/1h\n")
	write(rlsFile, rlsYAML(1, "hour"))
	a := startApp(t, map[string]string{"AUTHLIMIT_RULES_FILE": rulesFile, "AUTHLIMIT_RLS_CONFIG": rlsFile})
	hits := func() float64 { return metric(t, a, "authlimit_deny_cache_hits_total") }
	// rlsDeniedTwice spends a fresh key and reports whether its second
	// denial came from the deny cache.
	rlsDeniedTwice := func(key string) bool {
		t.Helper()
		if s := a.rlsJSON(t, key); s != 200 {
			t.Fatalf("first request for %s: %d", key, s)
		}
		before := hits()
		for i := 0; i < 2; i++ {
			if s := a.rlsJSON(t, key); s != 429 {
				t.Fatalf("request %d over the limit for %s: %d", i, key, s)
			}
		}
		return hits() > before
	}
	authDeniedTwice := func(ip string) bool {
		t.Helper()
		wantStatus(t, a.do(t, authFrom(ip)), 200, "first")
		before := hits()
		for i := 0; i < 2; i++ {
			wantStatus(t, a.do(t, authFrom(ip)), 429, "over the limit")
		}
		return hits() > before
	}
	if !rlsDeniedTwice("k1") || !authDeniedTwice("198.51.100.1") {
		t.Fatal("the deny cache does not remember denials at start")
	}
	write(rulesFile, "name=r limit=1/1h\nname=s limit=5/1h key=global\n")
	if res := a.app.reload.reload("test"); res[0].Result != "success" {
		t.Fatalf("rules reload: %+v", res)
	}
	if !rlsDeniedTwice("k2") {
		t.Error("after a rules reload the guard no longer knows the rate-limit service's policies")
	}
	write(rlsFile, rlsYAML(1, "hour")+"  - key: other\n    rate_limit:\n      unit: hour\n      requests_per_unit: 9\n")
	if res := a.app.reload.reload("test"); res[1].Result != "success" {
		t.Fatalf("rls reload: %+v", res)
	}
	if !authDeniedTwice("198.51.100.2") {
		t.Error("after an RLS reload the guard no longer knows the rules' policies")
	}
}

// TestRLSReloadsKeepCountsAndForgetOldLimits reloads AUTHLIMIT_RLS_CONFIG
// through the reloader many times, each time with another limit beside the
// api_key limit, which stays: authlimit_rls_requests_total continues
// across every reload (no counter reset), the api_key limit keeps its
// counts (a reload hands out no fresh quota), and the policies the rule set
// numbers for the guard stay the rules' and those of the configuration in
// force, each once, however many reloads there were.
func TestRLSReloadsKeepCountsAndForgetOldLimits(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, env map[string]string) {
		file := filepath.Join(t.TempDir(), "ratelimit.yaml")
		write := func(body string) {
			t.Helper()
			if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(rlsYAML(3, "hour"))
		a := startApp(t, with(env, "AUTHLIMIT_RLS_CONFIG", file))
		ok := func() float64 { return metric(t, a, `authlimit_rls_requests_total{result="ok"}`) }
		over := func() float64 { return metric(t, a, `authlimit_rls_requests_total{result="over_limit"}`) }
		for i := 0; i < 2; i++ {
			if s := a.rlsJSON(t, "k1"); s != 200 {
				t.Fatalf("request %d: %d, want 200", i, s)
			}
		}
		const reloads = 25
		for i := 0; i < reloads; i++ {
			write(rlsYAML(3, "hour") + fmt.Sprintf("  - key: other%d\n    rate_limit:\n      unit: hour\n      requests_per_unit: %d\n", i, 5+i))
			okBefore, overBefore := ok(), over()
			if res := a.app.reload.reload("test"); len(res) != 2 || res[1].Result != "success" {
				t.Fatalf("reload %d: %+v", i, res)
			}
			if got := ok(); got != okBefore {
				t.Fatalf("reload %d: authlimit_rls_requests_total{result=\"ok\"} went from %v to %v", i, okBefore, got)
			}
			if got := over(); got != overBefore {
				t.Fatalf("reload %d: authlimit_rls_requests_total{result=\"over_limit\"} went from %v to %v", i, overBefore, got)
			}
			// Another key, each time: its own count starts at one.
			if s := a.rlsJSON(t, fmt.Sprintf("fresh%d", i)); s != 200 {
				t.Fatalf("after reload %d, a fresh key: %d, want 200", i, s)
			}
			if got, want := ok(), okBefore+1; got != want {
				t.Fatalf("after reload %d, authlimit_rls_requests_total{result=\"ok\"} = %v, want %v: the counter does not continue", i, got, want)
			}
		}
		// k1 spent 2 of 3 before the reloads: one more, then denied.
		if s := a.rlsJSON(t, "k1"); s != 200 {
			t.Errorf("k1's third request after %d reloads: %d, want 200", reloads, s)
		}
		if s := a.rlsJSON(t, "k1"); s != 429 {
			t.Errorf("k1's fourth request after %d reloads: %d, want 429: a reload handed out fresh quota", reloads, s)
		}
		if got, want := ok(), float64(3+reloads); got != want {
			t.Errorf("authlimit_rls_requests_total{result=\"ok\"} = %v after all, want %v", got, want)
		}
		if got := over(); got != 1 {
			t.Errorf("authlimit_rls_requests_total{result=\"over_limit\"} = %v after all, want 1", got)
		}

		// The policies the guard's deny cache numbers: the rules' and the
		// configuration in force's, each once.
		set := a.app.sets.Load()
		var want []string
		for _, r := range set.Rules() {
			for _, p := range r.Policies() {
				want = append(want, p.Name())
			}
		}
		for _, p := range set.RLS().Policies() {
			want = append(want, p.Name())
		}
		var got []string
		for _, p := range set.Policies() {
			got = append(got, p.Name())
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("after %d reloads the rule set numbers %d policies %v, want %d: %v", reloads, len(got), got, len(want), want)
		}
	})
}
