//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/authlimit/authlimit/internal/faultlog"
	"github.com/authlimit/authlimit/internal/redistest"
)

// TestFaultFallbackAccuracy measures how far the local fallback strays from
// the configured limit when Redis is down: R replicas (R = 1, 2, 3) behind
// a round-robin, each with fail mode local and AUTHLIMIT_LOCAL_DIVISOR=R,
// for each algorithm, with a limit of 10 a day. One client comes fresh
// during the outage; another used 4 of its 10 through Redis before it, so
// each replica's local store continues from the admissions it saw Redis
// make. With one replica the fallback gives exactly the limit; with more,
// each replica gives limit/R rounded down, so the total is never above the
// limit, and within R below it.
func TestFaultFallbackAccuracy(t *testing.T) {
	for _, replicas := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("%d replicas", replicas), func(t *testing.T) { fallbackAccuracy(t, replicas) })
	}
}

func fallbackAccuracy(t *testing.T, replicas int) {
	const (
		limit = 10
		pre   = 4 // admissions through Redis before the outage
		asks  = 3 * limit
	)
	srv := redistest.NewLocal(t)
	ls := make([]*limiter, replicas)
	for i := range ls {
		ls[i] = startLimiter(t, fmt.Sprintf("authlimit-%d", i), map[string]string{
			"AUTHLIMIT_REDIS_URL":     srv.URL,
			"AUTHLIMIT_RULES":         algorithmRules(limit),
			"AUTHLIMIT_FAIL_MODE":     "local",
			"AUTHLIMIT_LOCAL_DIVISOR": fmt.Sprint(replicas),
		})
	}
	for _, l := range ls {
		l.waitReadiness(t, "ready", 10*time.Second)
	}
	// roundRobin asks n times for ip, each time the next replica, carrying
	// the client's place in the rotation in *next.
	roundRobin := func(ip, path string, n int, next *int) []answer {
		out := make([]answer, n)
		for i := range out {
			out[i] = ls[*next%replicas].ask(ip, path)
			*next++
		}
		return out
	}
	type client struct {
		ip   string
		next int
		pre  []answer
		down []answer
	}
	fresh, used := map[string]*client{}, map[string]*client{}
	for i, alg := range algorithms {
		fresh[alg] = &client{ip: fmt.Sprintf("192.0.2.%d", 100+i)}
		used[alg] = &client{ip: fmt.Sprintf("192.0.2.%d", 10+i)}
		c := used[alg]
		c.pre = roundRobin(c.ip, "/"+alg, pre, &c.next)
		if got := countAnswers(c.pre, func(a answer) bool { return a.admitted() && a.counted }); got != pre {
			t.Fatalf("%s before the outage: %s, want %d admitted by Redis", alg, tally(c.pre), pre)
		}
	}

	srv.Stop(t)
	// Open every replica's circuit with a client of its own, so that the
	// measured clients meet the fallback from their first request.
	for _, l := range ls {
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, body := l.readiness()
			if strings.HasPrefix(body, "degraded") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: /readyz %q 10s after Redis stopped", l.name, body)
			}
			l.ask("192.0.2.250", "/gcra")
		}
	}
	var cells []string
	var all []answer
	worst := 0
	for _, alg := range algorithms {
		f, u := fresh[alg], used[alg]
		f.down = roundRobin(f.ip, "/"+alg, asks, &f.next)
		u.down = roundRobin(u.ip, "/"+alg, asks, &u.next)
		all = append(append(all, f.down...), u.down...)
		gotFresh := countAnswers(f.down, answer.admitted)
		gotUsed := pre + countAnswers(u.down, answer.admitted)
		cells = append(cells, fmt.Sprintf("%s %d, %d", alg, gotFresh, gotUsed))
		worst = max(worst, gotFresh-limit, limit-gotFresh, gotUsed-limit, limit-gotUsed)

		for _, a := range append(f.down, u.down...) {
			if !a.counted || a.status != 200 && a.status != 429 {
				t.Errorf("%s during the outage: %v, want a decision of the local store", alg, a)
				break
			}
		}
		for what, got := range map[string]int{"fresh": gotFresh, fmt.Sprintf("%d used through Redis", pre): gotUsed} {
			switch {
			case replicas == 1 && got != limit:
				t.Errorf("%s, one replica, client %s: %d admitted in all, want exactly the limit of %d", alg, what, got, limit)
			case got > limit || got < limit-replicas:
				t.Errorf("%s, %d replicas, client %s: %d admitted in all, want at most the limit of %d and within %d of it", alg, replicas, what, got, limit, replicas)
			}
		}
	}
	expected := fmt.Sprintf("all replicas together admit exactly the limit (%d a day)", limit)
	if replicas > 1 {
		expected = fmt.Sprintf("all replicas together admit at most the limit (%d a day), within %d below it: each its share, %d/%d rounded down", limit, replicas, limit, replicas)
	}
	faults.Record(t, faultlog.Row{
		Fault:        fmt.Sprintf("Local fallback accuracy: Redis down, %d replica(s) behind a round-robin, AUTHLIMIT_LOCAL_DIVISOR=%d", replicas, replicas),
		Expected:     expected,
		Observed:     fmt.Sprintf("admitted in all, per algorithm (fresh client, client that used %d through Redis first): %s; farthest from the limit: %d", pre, strings.Join(cells, "; "), worst),
		WorstLatency: slowest(all),
	})
}
