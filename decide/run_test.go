package decide

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

// runDecider decides in memory, asynchronously within a run of its own
// (as the Redis store tells a batch's outcomes), which it sends.
type runDecider struct {
	mem  *algo.Memory
	runs chan *algo.Run
}

func (d runDecider) Decide(ctx context.Context, reqs []algo.Request, res []algo.Result) (bool, error) {
	return d.mem.Decide(ctx, reqs, res)
}

func (d runDecider) DecideAsync(reqs []algo.Request, res []algo.Result, done algo.Done) bool {
	go func() {
		run := new(algo.Run)
		d.runs <- run
		ok, err := d.mem.Decide(context.Background(), reqs, res)
		algo.Tell(done, run, ok, err)
		run.End()
	}()
	return true
}

// runThen is a Then that can be told within a run: it sends the run and
// the verdict.
type runThen struct {
	runs     chan *algo.Run
	verdicts chan Verdict
}

func (r runThen) Decided(o *Outcome) {
	r.runs <- nil
	r.verdicts <- o.Verdict
}

func (r runThen) DecidedIn(run *algo.Run, o *Outcome) {
	r.runs <- run
	r.verdicts <- o.Verdict
}

// TestDecideAsyncWithinRun: an outcome the Decider tells within a run
// reaches a RunThen within that run, worked out as any other; a plain
// Then is told as ever.
func TestDecideAsyncWithinRun(t *testing.T) {
	rs, err := rules.Parse("name=a key=ip limit=1/1h")
	if err != nil {
		t.Fatal(err)
	}
	p, err := algo.NewPolicy(algo.Spec{Name: "l", Algorithm: algo.FixedWindow, Limit: 1, Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	d := runDecider{mem: m, runs: make(chan *algo.Run, 2)}
	e, err := New(Options{Rules: rulesettest.Holder(t, rs, p), Decider: d, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(then Then) {
		t.Helper()
		var in Input
		e.Read(&in, netip.MustParseAddr("203.0.113.2"), []byte("GET"), []byte("/"), nil, mapHeaders{})
		if !e.DecideAsync(&in, &Outcome{}, then) {
			t.Fatal("DecideAsync reported false")
		}
	}
	th := runThen{runs: make(chan *algo.Run, 1), verdicts: make(chan Verdict, 1)}
	ask(th)
	if got, want := <-th.runs, <-d.runs; got == nil || got != want {
		t.Error("the Then was not told within the Decider's run")
	}
	if v := <-th.verdicts; v != Allow {
		t.Errorf("the first request: %v; want allow", v)
	}
	verdicts := make(chan Verdict, 1)
	ask(thenFunc(func(o *Outcome) { verdicts <- o.Verdict }))
	<-d.runs
	if v := <-verdicts; v != Deny {
		t.Errorf("the second request, to a plain Then: %v; want deny", v)
	}
}
