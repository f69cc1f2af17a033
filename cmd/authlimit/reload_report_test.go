package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// watching starts a's watch of its configuration files until the test
// ends.
func watching(t *testing.T, a *testApp) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := a.app.reload.watch(ctx); err != nil {
		t.Fatal(err)
	}
}

// settle waits for the watch to have acted on what was written before
// it: the debounce, a stable read, and some.
func settle() { time.Sleep(10 * reloadDebounce) }

// TestRLSReloadUpdatesConfigMetrics: a reload of AUTHLIMIT_RLS_CONFIG puts
// its hash in authlimit_config_info{config="rls"} (the previous one gone),
// its time in authlimit_config_last_reload_success_timestamp_seconds and
// in /v1/config's loaded_at, as a rules reload does, reload after reload.
func TestRLSReloadUpdatesConfigMetrics(t *testing.T) {
	file := writeFile(t, "ratelimit.yaml", rlsYAML(2, "hour"))
	a := startApp(t, map[string]string{"AUTHLIMIT_RLS_CONFIG": file, "AUTHLIMIT_ADMIN_LISTEN": "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN": adminToken})
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 1; i <= 3; i++ {
		now := start.Add(time.Duration(i) * time.Hour)
		a.app.reload.clock = func() time.Time { return now }
		if err := os.WriteFile(file, []byte(rlsYAML(2+i, "hour")), 0o644); err != nil {
			t.Fatal(err)
		}
		res := a.app.reload.reload("test")
		if len(res) != 2 || res[1].Result != "success" {
			t.Fatalf("reload %d: %+v", i, res)
		}
		hash := res[1].Hash
		body := a.do(t, request{path: "/metrics"}).body
		if !strings.Contains(body, fmt.Sprintf(`authlimit_config_info{config="rls",hash=%q} 1`, hash)) {
			t.Errorf("reload %d: authlimit_config_info does not carry the new hash %s:\n%s", i, hash, grep(body, "authlimit_config_info"))
		}
		if n := strings.Count(body, `authlimit_config_info{config="rls"`); n != 1 {
			t.Errorf("reload %d: %d authlimit_config_info series for rls, want 1:\n%s", i, n, grep(body, "authlimit_config_info"))
		}
		if got, want := metric(t, a, `authlimit_config_last_reload_success_timestamp_seconds{config="rls"}`), float64(now.Unix()); got != want {
			t.Errorf("reload %d: last reload success %v, want %v", i, got, want)
		}
		status, cfg := a.adminDo(t, "GET", "/v1/config", adminToken)
		var got struct {
			Hashes   map[string]string `json:"hashes"`
			LoadedAt time.Time         `json:"loaded_at"`
		}
		if err := json.Unmarshal([]byte(cfg), &got); status != 200 || err != nil {
			t.Fatalf("GET /v1/config: %d %v %s", status, err, cfg)
		}
		if !got.LoadedAt.Equal(now) || got.Hashes[configRLS] != hash {
			t.Errorf("reload %d: /v1/config loaded_at %v, hashes %v; want %v and rls %s", i, got.LoadedAt, got.Hashes, now, hash)
		}
	}
}

// TestOnlyTheWatchedFilesReload: writes to other files in the watched
// directories (authlimit's own log, an editor's swap file, another
// ConfigMap key's temporary) reload nothing; a write to the rules file
// does, and so does a ConfigMap's ..data swap.
func TestOnlyTheWatchedFilesReload(t *testing.T) {
	t.Parallel()
	for _, configMap := range []bool{false, true} {
		t.Run(map[bool]string{false: "file", true: "configmap"}[configMap], func(t *testing.T) {
			d := newRulesDir(t, "name=r limit=5/1m\n", configMap)
			a := startApp(t, map[string]string{"AUTHLIMIT_RULES_FILE": d.file})
			watching(t, a)
			settle()
			reloads := func() int { return strings.Count(a.logs.String(), `trigger="file changed"`) }
			before := reloads()
			for i := 0; i < 20; i++ {
				for _, name := range []string{"authlimit.log", ".rules.conf.swp", "rules.conf~", "other.yaml"} {
					if err := os.WriteFile(filepath.Join(d.dir, name), []byte(fmt.Sprintf("line %d\n", i)), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
			settle()
			if got := reloads() - before; got != 0 {
				t.Errorf("writes to other files in the directory reloaded %d times, want 0:\n%s", got, a.logs.String())
			}
			if configMap {
				d.swap(t, "name=r limit=6/1m\n")
			} else {
				d.write(t, "name=r limit=6/1m\n")
			}
			deadline := time.Now().Add(5 * time.Second)
			for metric(t, a, `authlimit_config_reloads_total{config="rules",result="success"}`) < 1 {
				if time.Now().After(deadline) {
					t.Fatalf("a change of the rules file did not reload:\n%s", a.logs.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestRefusalReportedOncePerContent: a refused configuration is logged and
// counted once, however many events and reloads read it again; another
// refused content is reported again; the admin API's reload still lists
// its mistakes each time.
func TestRefusalReportedOncePerContent(t *testing.T) {
	t.Parallel()
	d := newRulesDir(t, "name=r limit=5/1m\n", false)
	rlsFile := writeFile(t, "ratelimit.yaml", rlsYAML(2, "hour"))
	a := startApp(t, map[string]string{"AUTHLIMIT_RULES_FILE": d.file, "AUTHLIMIT_RLS_CONFIG": rlsFile,
		"AUTHLIMIT_ADMIN_LISTEN": "127.0.0.1:0", "AUTHLIMIT_ADMIN_TOKEN": adminToken})
	watching(t, a)
	settle()
	refused := func(config string) float64 {
		return metric(t, a, fmt.Sprintf(`authlimit_config_reloads_total{config=%q,result="error"}`, config))
	}
	logged := func(mistake string) int { return strings.Count(a.logs.String(), mistake) }

	bad := "name=r limit=5/1m\nname=s limit=oops\n"
	for i := 0; i < 5; i++ {
		d.write(t, bad)
		settle()
		a.app.reload.reload("SIGHUP")
	}
	if got := refused(configRules); got != 1 {
		t.Errorf("one bad rules file, written 5 times and reloaded 5 times more: counted %v refusals, want 1", got)
	}
	if got := logged("oops"); got != 1 {
		t.Errorf("its mistake logged %d times, want once:\n%s", got, a.logs.String())
	}
	status, body := a.adminDo(t, "POST", "/v1/reload", adminToken)
	if status != 422 || !strings.Contains(body, "oops") {
		t.Errorf("POST /v1/reload of the same bad file: %d %s, want 422 naming the mistake", status, body)
	}
	d.write(t, "name=r limit=5/1m\nname=s limit=wrong\n")
	settle()
	if got := refused(configRules); got != 2 {
		t.Errorf("another bad content: counted %v refusals, want 2", got)
	}
	if got := logged("wrong"); got != 1 {
		t.Errorf("another bad content logged %d times, want once", got)
	}
	// Good again, then the first bad content again: reported anew.
	d.write(t, "name=r limit=7/1m\n")
	settle()
	d.write(t, bad)
	settle()
	if got := refused(configRules); got != 3 {
		t.Errorf("the first bad content after a good one: counted %v refusals, want 3", got)
	}

	// The same for AUTHLIMIT_RLS_CONFIG.
	if err := os.WriteFile(rlsFile, []byte("domain: shop\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: nope}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		settle()
		a.app.reload.reload("SIGHUP")
	}
	if got := refused(configRLS); got != 1 {
		t.Errorf("one bad rate-limit configuration reloaded 4 times: counted %v refusals, want 1", got)
	}
	if got := logged("nope"); got != 1 {
		t.Errorf("its mistake logged %d times, want once", got)
	}
}
