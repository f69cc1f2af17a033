package denials

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/internal/race"
	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset/rulesettest"
)

// headers is one request's headers.
type headers map[string][]byte

func (h headers) Lookup(name string) ([]byte, int) {
	v, ok := h[name]
	if !ok {
		return nil, 0
	}
	return v, 1
}

// engineWith returns an engine deciding rules on the memory store, telling
// r.
func engineWith(t testing.TB, r *Recorder, src string) *decide.Engine {
	t.Helper()
	rs, err := rules.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	m := algo.NewMemory(algo.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	h := rulesettest.Holder(t, rs)
	g, err := guard.New(guard.Options{Store: m, Rules: h})
	if err != nil {
		t.Fatal(err)
	}
	opts := decide.Options{Rules: h, Decider: g, IPv4Prefix: 32, IPv6Prefix: 64, DenyStatus: 429}
	if r != nil {
		opts.Observer = r
	}
	e, err := decide.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestEngineFeedsTheRecorder: the engine tells the recorder each rule's
// answer: a rule by address lists clients, a rule by header hides its
// keys in the log and lists no client, a shadow rule lists whom it would
// have denied; the admissions of a denied key are counted.
func TestEngineFeedsTheRecorder(t *testing.T) {
	c := &clock{t: time.Now()}
	r, buf := newTestRecorder(t, c, Options{LogRate: 100})
	e := engineWith(t, r, "name=per-ip key=ip limit=2/1h; name=per-key key=header:X-Key limit=3/1h; name=trial key=ip limit=1/1h shadow=true")
	front, err := e.Front("test")
	if err != nil {
		t.Fatal(err)
	}
	decideAs := func(ip, key string) decide.Verdict {
		var in decide.Input
		var o decide.Outcome
		o.Front = front
		e.Read(&in, netip.MustParseAddr(ip), []byte("GET"), []byte("/v1/things"), []byte("a.example"), headers{"X-Key": []byte(key)})
		e.Decide(context.Background(), &in, &o)
		return o.Verdict
	}
	for i := 0; i < 5; i++ {
		decideAs("203.0.113.1", "k1")
	}
	decideAs("203.0.113.2", "k1")
	ctx := context.Background()
	for _, tc := range []struct{ rule, want, client string }{
		// 203.0.113.1: 2 admitted, 3 denied by per-ip; nothing reaches
		// per-key beyond what per-ip admitted (all or nothing).
		{"per-ip", "203.0.113.1=3", "203.0.113.1"},
		// per-key: k1 spent 2 by .1 and 1 by .2: not denied yet.
		{"per-key", "", ""},
		// trial would have denied .1 four times.
		{"trial", "203.0.113.1=4", "203.0.113.1"},
	} {
		a := r.Top(ctx, tc.rule, 10)
		if got := entriesString(a.Current.Entries); got != tc.want {
			t.Errorf("%s: top %q, want %q", tc.rule, got, tc.want)
		}
		if tc.client != "" && a.Current.Entries[0].Client != tc.client {
			t.Errorf("%s: client %q, want %q", tc.rule, a.Current.Entries[0].Client, tc.client)
		}
		if a.Shadow != (tc.rule == "trial") {
			t.Errorf("%s: shadow %v", tc.rule, a.Shadow)
		}
	}
	// .2 sends k1 again: per-key denies it (k1 has spent 3), and the
	// key is a credential.
	decideAs("203.0.113.2", "k1")
	a := r.Top(ctx, "per-key", 10)
	if got := entriesString(a.Current.Entries); got != "k1=1" || a.Current.Entries[0].Client != "" {
		t.Errorf("per-key: top %q client %q, want k1=1 and no client", got, a.Current.Entries[0].Client)
	}
	r.Flush()
	var keys []string
	for _, l := range buf.lines(t) {
		if l["rule"] == "per-key" {
			keys = append(keys, l["key"].(string))
			if l["front"] != "test" || l["path"] != "/v1/things" {
				t.Errorf("per-key line %v: want front test, path /v1/things", l)
			}
		}
	}
	if len(keys) != 1 || keys[0] != KeyHash([]byte("k1")) {
		t.Errorf("per-key lines show keys %v, want the hash of k1 once", keys)
	}
}

// TestDecideWithRecorderAllocatesNothing: a decision, admitted or denied,
// observed by a recorder, allocates nothing once warm.
func TestDecideWithRecorderAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	c := &clock{t: time.Now()}
	r, _ := newTestRecorder(t, c, Options{LogRate: 10})
	e := engineWith(t, r, "name=a key=ip limit=1000000/1m; name=b key=ip+header:X-Key limit=1/1h algorithm=gcra")
	var in decide.Input
	var o decide.Outcome
	h := headers{"X-Key": []byte("k")}
	run := func(ip string) func() {
		return func() {
			e.Read(&in, netip.MustParseAddr(ip), []byte("POST"), []byte("/x"), []byte("a.example"), h)
			e.Decide(context.Background(), &in, &o)
		}
	}
	run("203.0.113.7")()
	run("203.0.113.7")()
	if o.Verdict != decide.Deny {
		t.Fatalf("verdict %v, want deny", o.Verdict)
	}
	if got := testing.AllocsPerRun(100, run("203.0.113.7")); got != 0 {
		t.Errorf("%v allocations per denied decision, want 0", got)
	}
	admitted := run("203.0.113.8")
	admitted()
	if o.Verdict != decide.Allow {
		t.Fatalf("verdict %v, want allow", o.Verdict)
	}
	// Rule a has a denied key: its admissions are looked up.
	r.Observe(&decide.Decision{Rule: "a", Tag: []byte("198.51.100.1"), Denied: true, Now: time.Now()})
	if got := testing.AllocsPerRun(100, func() { delete(h, "X-Key"); admitted() }); got != 0 {
		t.Errorf("%v allocations per admitted decision, want 0", got)
	}
}
