//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/faultlog"
	"github.com/authlimit/authlimit/internal/redistest"
)

// startupRule is the rule of the start-up tests.
const startupRule = "name=per-ip key=ip limit=5/1d algorithm=sliding_window_log"

// TestFaultStartupRefused: a Redis that answers but refuses authlimit (a
// wrong password, no password, a certificate from a CA authlimit does not
// trust, an ACL user whose keys are not authlimit's) stops authlimit at
// start with exit status 2 and a message that names the store and says
// what is wrong, with no credential anywhere in its output: waiting would
// not cure it.
func TestFaultStartupRefused(t *testing.T) {
	const password = "Gr4nted-Passw0rd-7c1e"
	// redistest checks a server it starts with a PING, so the password is
	// set once it runs.
	locked := redistest.NewLocal(t)
	if err := locked.Client(t).ConfigSet(context.Background(), "requirepass", password).Err(); err != nil {
		t.Fatal(err)
	}
	tlsSrv := redistest.StartTLS(t)
	open := redistest.NewLocal(t)
	user := redistest.NewACLUser(t, open, "authlimit-acl")
	cases := []struct {
		name, fault string
		env         map[string]string
		secrets     []string // must not appear in the output
		says        []string // the output must say one of these (any case)
	}{
		{
			name:    "wrong password",
			fault:   "Redis refuses the password at start",
			env:     map[string]string{"AUTHLIMIT_REDIS_URL": "redis://default:Wr0ng-Secret-e41b@" + locked.Addr},
			secrets: []string{"Wr0ng-Secret-e41b", password},
			says:    []string{"WRONGPASS"},
		},
		{
			name:    "no password",
			fault:   "Redis wants a password authlimit does not give",
			env:     map[string]string{"AUTHLIMIT_REDIS_URL": "redis://" + locked.Addr},
			secrets: []string{password},
			says:    []string{"NOAUTH"},
		},
		{
			name:  "untrusted certificate",
			fault: "TLS: Redis's certificate is not signed by AUTHLIMIT_REDIS_CA_FILE",
			env: map[string]string{
				"AUTHLIMIT_REDIS_URL":     "rediss://default:Tls-Secret-93ad@" + tlsSrv.Addr,
				"AUTHLIMIT_REDIS_CA_FILE": tlsSrv.WrongCAFile,
			},
			secrets: []string{"Tls-Secret-93ad"},
			says:    []string{"certificate"},
		},
		{
			name:  "ACL user for another key prefix",
			fault: "ACL user limited to other keys than AUTHLIMIT_KEY_PREFIX",
			env: map[string]string{
				"AUTHLIMIT_REDIS_URL":  user.URL,
				"AUTHLIMIT_KEY_PREFIX": "authlimit",
			},
			secrets: []string{user.Password},
			says:    []string{"NOPERM", "permission", "can't access"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runToExit(t, "authlimit-"+strings.ReplaceAll(c.name, " ", "-"), c.env, 5*time.Second)
			observed := fmt.Sprintf("exit status %d after %s: %q", r.code, ms(r.took), firstLine(lastLines(r.out, 1)))
			if r.code == -1 {
				observed = fmt.Sprintf("still running after %s, /readyz %s; warnings: %s", ms(r.took), r.readyz, warnings(r.out))
			}
			faults.Record(t, faultlog.Row{
				Fault:    c.fault,
				Expected: "exit status 2 at once; a message naming the store and the cause; no credentials in the output",
				Observed: observed,
			})
			if r.code != 2 {
				t.Errorf("exit status %d (-1: still running after %v, /readyz %s), want 2; output:\n%s", r.code, r.took, r.readyz, lastLines(r.out, 20))
			}
			if !strings.Contains(strings.ToLower(r.out), "redis") || !strings.Contains(r.out, "127.0.0.1") {
				t.Errorf("the output does not name the store (redis, its address):\n%s", lastLines(r.out, 20))
			}
			said := false
			for _, w := range c.says {
				said = said || strings.Contains(strings.ToLower(r.out), strings.ToLower(w))
			}
			if !said {
				t.Errorf("the output says none of %q, which would tell the operator what is wrong:\n%s", c.says, lastLines(r.out, 20))
			}
			for _, sec := range c.secrets {
				if strings.Contains(r.out, sec) {
					t.Errorf("the output shows the credential %q:\n%s", sec, r.out)
				}
			}
		})
	}
}

// warnings returns the messages authlimit logged at WARN or ERROR level,
// each once, joined.
func warnings(out string) string {
	seen := map[string]bool{}
	var msgs []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=ERROR") {
			continue
		}
		_, msg, _ := strings.Cut(line, "msg=")
		if !seen[msg] {
			seen[msg] = true
			msgs = append(msgs, msg)
		}
	}
	if len(msgs) == 0 {
		return "none"
	}
	return strings.Join(msgs, "; ")
}

// TestFaultStartupUnreachable: a Redis that cannot be reached at start
// leaves authlimit serving with its fail mode and /readyz telling the truth
// (fail mode local: 200 "degraded"; closed: 503 "not ready"), with no
// credential in its output; once a Redis answers at the address,
// authlimit is ready within the recovery target (2 s) without traffic.
func TestFaultStartupUnreachable(t *testing.T) {
	// The server has no password: Redis accepts any password for its
	// default user then, so the URL can carry one, to check it is never
	// shown.
	const password = "Unre4chable-Secret-52f0"
	srv := redistest.NewLocal(t)
	srv.Stop(t)
	url := "redis://default:" + password + "@" + srv.Addr
	started := time.Now()
	local := startLimiter(t, "authlimit-local", map[string]string{"AUTHLIMIT_REDIS_URL": url, "AUTHLIMIT_RULES": startupRule, "AUTHLIMIT_FAIL_MODE": "local"})
	closed := startLimiter(t, "authlimit-closed", map[string]string{"AUTHLIMIT_REDIS_URL": url, "AUTHLIMIT_RULES": startupRule, "AUTHLIMIT_FAIL_MODE": "closed"})
	serving := time.Since(started)

	localStatus, localBody := local.readiness()
	closedStatus, closedBody := closed.readiness()
	localAnswers := local.askN("198.51.100.1", "/", 7)
	closedAnswers := closed.askN("198.51.100.1", "/", 2)

	srv.Restart(t)
	answering := time.Now()
	localReady := local.waitReadiness(t, "ready", 10*time.Second).Sub(answering)
	closedReady := closed.waitReadiness(t, "ready", 10*time.Second).Sub(answering)
	after := local.ask("198.51.100.2", "/")

	faults.Record(t, faultlog.Row{
		Fault:    "Redis unreachable at start",
		Expected: "serve at once with the fail mode; /readyz tells the truth; ready within 2 s once Redis answers; no credentials in the output",
		Observed: fmt.Sprintf("both serving %s after start; /readyz: local %d %q, closed %d %q; decisions: local %s, closed %s; ready %s (local) and %s (closed) after Redis answered",
			ms(serving), localStatus, localBody, closedStatus, closedBody, tally(localAnswers), tally(closedAnswers), ms(localReady), ms(closedReady)),
		Recovery: max(localReady, closedReady),
	})

	if localStatus != 200 || !strings.HasPrefix(localBody, "degraded") {
		t.Errorf("fail mode local, Redis unreachable: /readyz %d %q, want 200 degraded: …", localStatus, localBody)
	}
	if closedStatus != 503 || !strings.HasPrefix(closedBody, "not ready") {
		t.Errorf("fail mode closed, Redis unreachable: /readyz %d %q, want 503 not ready: …", closedStatus, closedBody)
	}
	for i, a := range localAnswers {
		want := 200
		if i >= 5 {
			want = 429
		}
		if a.status != want || !a.counted {
			t.Errorf("fail mode local, request %d: %v, want %d decided by the local store (limit 5)", i+1, a, want)
		}
	}
	for _, a := range closedAnswers {
		if !a.unavailable() {
			t.Errorf("fail mode closed: %v, want 503 unavailable", a)
		}
	}
	checkAnswers(t, "unreachable at start", append(localAnswers, closedAnswers...))
	for _, d := range []time.Duration{localReady, closedReady} {
		if d > 2*time.Second {
			t.Errorf("ready %v after Redis answered, want within 2s", d)
		}
	}
	if !after.admitted() || !after.counted {
		t.Errorf("after Redis came: %v, want 200 with rate-limit headers", after)
	}
	for _, l := range []*limiter{local, closed} {
		out := l.logText(t)
		if strings.Contains(out, password) {
			t.Errorf("%s shows the password in its output:\n%s", l.name, out)
		}
		if !strings.Contains(out, "redis not ready at start") {
			t.Errorf("%s does not say at start that Redis is not ready:\n%s", l.name, lastLines(out, 10))
		}
	}
}

// TestFaultStartupTLSMismatch: redis:// (plain) against a Redis that speaks
// only TLS. Redis closes the connection at the first plain byte, so
// authlimit sees it as a Redis that does not answer: it serves with the
// fail mode and /readyz says so. Its message must still tell the operator
// what is wrong (TLS, rediss://), and never show the password.
func TestFaultStartupTLSMismatch(t *testing.T) {
	tlsSrv := redistest.StartTLS(t)
	const password = "Pl4in-Secret-0b7d"
	l := startLimiter(t, "authlimit-plain", map[string]string{
		"AUTHLIMIT_REDIS_URL": "redis://default:" + password + "@" + tlsSrv.Addr,
		"AUTHLIMIT_RULES":     startupRule,
	})
	status, body := l.readiness()
	as := l.askN("198.51.100.3", "/", 6)
	out := l.logText(t)
	warning := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "redis not ready at start") {
			warning = line
		}
	}
	_, warning, _ = strings.Cut(warning, "msg=")
	faults.Record(t, faultlog.Row{
		Fault:    "TLS mismatch: redis:// against a TLS-only Redis",
		Expected: "serve with the fail mode, /readyz not \"ready\", a message that points at TLS (rediss://), no credentials in the output",
		Observed: fmt.Sprintf("running; /readyz %d %q; decisions %s; log: %s", status, body, tally(as), warning),
	})
	if l.exited() {
		t.Fatalf("authlimit exited:\n%s", out)
	}
	if strings.HasPrefix(body, "ready") {
		t.Errorf("/readyz %d %q: ready, though no decision can come from Redis", status, body)
	}
	if strings.Contains(out, password) {
		t.Errorf("the output shows the password:\n%s", out)
	}
	if warning == "" {
		t.Errorf("no start-up warning about Redis:\n%s", lastLines(out, 10))
	} else if lw := strings.ToLower(warning); !strings.Contains(lw, "tls") && !strings.Contains(lw, "rediss") {
		t.Errorf("the start-up warning does not say that Redis may want TLS (rediss://), so the operator cannot tell a TLS mismatch from a Redis that is down: %s", warning)
	}
	checkAnswers(t, "plain against TLS", as)
}

// exitRun is how a run of authlimit that should stop at start went.
type exitRun struct {
	// code is the exit status, -1 if it still ran when given up on.
	code int
	// out is its whole output.
	out string
	// took is how long it ran.
	took time.Duration
	// readyz is /readyz's answer when it still ran.
	readyz string
}

// runToExit starts authlimit with env and waits up to timeout for it to
// exit. A process still running then is asked for /readyz and stopped.
func runToExit(t *testing.T, name string, env map[string]string, timeout time.Duration) exitRun {
	t.Helper()
	addr := freeAddr(t)
	vars := []string{"PATH=" + os.Getenv("PATH"), "AUTHLIMIT_LISTEN=" + addr, "AUTHLIMIT_LOG_LEVEL=debug", "AUTHLIMIT_LOG_FORMAT=text", "AUTHLIMIT_RULES=" + startupRule}
	for k, v := range env {
		vars = append(vars, k+"="+v)
	}
	started := time.Now()
	p := start(t, name, bins.authlimit, nil, vars, t.TempDir())
	r := exitRun{code: -1}
	select {
	case <-p.done:
		r.code = p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		l := &limiter{authlimit: &authlimit{proc: p, addr: addr}, http: &http.Client{Timeout: 5 * time.Second}}
		status, body := l.readiness()
		r.readyz = fmt.Sprintf("%d %q", status, body)
		p.stop()
	}
	r.took = time.Since(started)
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	r.out = string(b)
	return r
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
