//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/authlimit/authlimit/internal/redistest"
)

// chromium returns Debian's chromium, or fails the test saying how to
// install it (.ci/run does).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("AUTHLIMIT_E2E_CHROMIUM"), "chromium", "chromium-browser"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH (Debian: apt-get install chromium), or set AUTHLIMIT_E2E_CHROMIUM")
	return ""
}

// browser starts a headless chromium for the test, with a fresh profile,
// and returns a context to drive it.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first Run starts the browser: without a timeout of its own,
	// which would end the browser with it.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// within runs a with a deadline, failing the test with what.
func within[T any](t *testing.T, ctx context.Context, d time.Duration, what string, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// TestStatusPage: the status page of a running authlimit, in headless
// Chromium, asks for the token, then shows the rules with their rates,
// the top limited clients (a shadow rule's too, as such), the store's
// circuit and the configuration's hash; its reset button gives a client
// its quota back. The test writes a screenshot for the docs.
func TestStatusPage(t *testing.T) {
	ctx := browser(t)
	srv := redistest.New(t)
	adminAddr := freeAddr(t)
	a := startAuthlimit(t, "authlimit", map[string]string{
		"AUTHLIMIT_REDIS_URL":       srv.URL,
		"AUTHLIMIT_KEY_PREFIX":      fmt.Sprintf("e2epage%d", time.Now().UnixNano()),
		"AUTHLIMIT_RULES":           "name=per-ip limit=5/1h key=ip; name=trial limit=2/1h key=ip shadow=true",
		"AUTHLIMIT_ADMIN_LISTEN":    adminAddr,
		"AUTHLIMIT_ADMIN_TOKEN":     adminToken,
		"AUTHLIMIT_DENY_CACHE_SIZE": "0",
	})
	const heavy, light = "198.51.100.21", "198.51.100.22"
	for _, c := range []struct {
		ip string
		n  int
	}{{heavy, 12}, {light, 8}} {
		for i := 0; i < c.n; i++ {
			authAs(t, a.addr, c.ip)
		}
	}
	// Steady traffic while the page is open, so that its rates show:
	// a new client each time (admitted), and one denied client.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			// Errors show in the page's rates, which the test reads.
			_, _ = tryAuth(a.addr, fmt.Sprintf("203.0.113.%d", i%200+1))
			_, _ = tryAuth(a.addr, "192.0.2.99")
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })

	page := "http://" + adminAddr + "/"
	within(t, ctx, 30*time.Second, "open the page", chromedp.Steps(
		chromedp.Navigate(page),
		chromedp.WaitVisible(chromedp.ID("token")),
	))
	within(t, ctx, 30*time.Second, "enter the token", chromedp.Steps(
		chromedp.SendKeys(chromedp.ID("token"), adminToken),
		chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
	))
	within(t, ctx, 30*time.Second, "see the top limited clients", chromedp.WaitVisible(chromedp.CSS(`section.rule[data-rule="per-ip"] tr.entry`)))
	within(t, ctx, 10*time.Second, "see the token form go", chromedp.WaitNotVisible(chromedp.ID("login")))
	// The token is kept for the tab only: in sessionStorage, not in
	// localStorage, and a reload does not ask for it again.
	if got := within(t, ctx, 10*time.Second, "read the storage", chromedp.Evaluate[string](
		`sessionStorage.getItem("authlimit-admin-token") + "|" + localStorage.length`)); got != adminToken+"|0" {
		t.Errorf("sessionStorage token | localStorage length = %q", got)
	}
	within(t, ctx, 30*time.Second, "reload the page", chromedp.Steps(
		chromedp.Navigate(page),
		chromedp.WaitVisible(chromedp.CSS(`section.rule[data-rule="per-ip"] tr.entry`)),
	))

	// The rates: the page refreshes every 5 s and the rates take a point
	// every 5 s, so wait for the steady traffic to show.
	deadline := time.Now().Add(30 * time.Second)
	for {
		adm := within(t, ctx, 10*time.Second, "read the rates", chromedp.Text(chromedp.CSS(`section.rule[data-rule="per-ip"] .admitted-rate`)))
		den := within(t, ctx, 10*time.Second, "read the rates", chromedp.Text(chromedp.CSS(`section.rule[data-rule="per-ip"] .denied-rate`)))
		if adm != "0.00" && den != "0.00" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rates still admitted %s/s, denied %s/s after 30s", adm, den)
		}
		time.Sleep(500 * time.Millisecond)
	}

	text := within(t, ctx, 10*time.Second, "read the page", chromedp.Text(chromedp.CSS("body")))
	for _, want := range []string{"per-ip", "5 per 1h0m0s", "trial", "shadow: would have denied", "closed", "configuration rules ",
		heavy, light, "Reset", "Peek"} {
		if !strings.Contains(text, want) {
			t.Errorf("the page does not show %q:\n%s", want, text)
		}
	}
	rows := within(t, ctx, 10*time.Second, "read the top table", chromedp.Text(chromedp.CSS(`section.rule[data-rule="per-ip"] table.top tbody`)))
	if !rowShows(rows, heavy, "7") || !rowShows(rows, light, "3") {
		t.Errorf("per-ip's top table does not show %s denied 7 times and %s 3 times:\n%s", heavy, light, rows)
	}
	trial := within(t, ctx, 10*time.Second, "read the shadow rule", chromedp.Text(chromedp.CSS(`section.rule[data-rule="trial"] table.top tbody`)))
	if !rowShows(trial, heavy, "10") {
		t.Errorf("trial's top table does not show %s would have been denied 10 times:\n%s", heavy, trial)
	}
	shot := within(t, ctx, 20*time.Second, "take a screenshot", chromedp.FullScreenshot(100))
	writeScreenshot(t, shot)

	// Reset the heavy client from its row.
	if status := authAs(t, a.addr, heavy); status == 200 {
		t.Fatalf("%s admitted before the reset", heavy)
	}
	row := fmt.Sprintf(`//section[@data-rule="per-ip"]//tr[td[@class="client"][text()=%q]]`, heavy)
	within(t, ctx, 20*time.Second, "click reset", chromedp.Steps(
		chromedp.Click(row+`//button[@class="reset-button"]`),
		chromedp.WaitVisible(row+`//td[@class="peek"][starts-with(text(), "reset:")]`),
	))
	peek := within(t, ctx, 10*time.Second, "read the reset's answer", chromedp.Text(row+`//td[@class="peek"]`))
	if !strings.Contains(peek, "5 of 5 left") {
		t.Errorf("after reset the row says %q, want 5 of 5 left", peek)
	}
	if status := authAs(t, a.addr, heavy); status != 200 {
		t.Errorf("%s after the reset: status %d, want 200", heavy, status)
	}
}

// rowShows reports whether a line of a table's text shows client and
// count as cells.
func rowShows(table, client, count string) bool {
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "\t")
		if len(cells) > 3 && cells[1] == client && cells[2] == count {
			return true
		}
	}
	return false
}

// writeScreenshot writes the page's screenshot for the docs:
// docs/status-page.png on a whole run, beside the temporary files on a
// partial one (as FAULTS.md).
func writeScreenshot(t *testing.T, png []byte) {
	t.Helper()
	path := filepath.Join(bins.repo, "docs", "status-page.png")
	if partialRun() {
		path = filepath.Join(os.TempDir(), "authlimit-status-page.png")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot written to %s", path)
}
