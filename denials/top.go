package denials

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Exchange carries the replicas' summaries: each replica publishes its
// own, any replica fetches them all. Its keys expire on their own.
type Exchange interface {
	// Publish stores replica's summary blobs, one per window, in one call;
	// each is kept for at least its TTL.
	Publish(ctx context.Context, replica string, blobs []Blob) error
	// Fetch returns, for each window, every replica's blob by replica
	// name, in one call.
	Fetch(ctx context.Context, windows []WindowID) ([]map[string][]byte, error)
}

// WindowID names a window: its length and its index since the epoch.
type WindowID struct {
	Length time.Duration
	Index  int64
}

// Blob is one window's summaries as published.
type Blob struct {
	Window WindowID
	Data   []byte
	TTL    time.Duration
}

// MaxReplicas bounds the replicas' blobs Top reads for a window; more are
// ignored (a fleet that large sees a part of itself, and says so).
const MaxReplicas = 256

// Answer is who a rule limited in the current and the previous window.
type Answer struct {
	Rule string `json:"rule"`
	// Shadow: the rule is a shadow rule, its denials would-have-beens.
	Shadow bool `json:"shadow,omitempty"`
	// Window is the windows' length, in seconds.
	Window   float64   `json:"window_seconds"`
	Current  WindowTop `json:"current"`
	Previous WindowTop `json:"previous"`
	// Shared: the other replicas' summaries were merged in; ShareError
	// says why they could not be when that was tried and failed.
	Shared     bool   `json:"shared"`
	ShareError string `json:"share_error,omitempty"`
}

// WindowTop is one window's most denied keys under a rule.
type WindowTop struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Exact: every count is exact (every replica's keys fit its
	// summary). Otherwise each count is over by at most ErrorBound.
	Exact      bool   `json:"exact"`
	ErrorBound uint64 `json:"error_bound"`
	// Replicas is how many replicas' summaries are merged; Keys how many
	// distinct keys they hold.
	Replicas int     `json:"replicas"`
	Keys     int     `json:"keys"`
	Entries  []Entry `json:"entries"`
}

// Entry is one key's counts, most denied first.
type Entry struct {
	// Tag is the key tag (algo.AppendTag), as the stores key the state.
	Tag string `json:"tag"`
	// Client is the last client address denied, when the rule counts by
	// address.
	Client string `json:"client,omitempty"`
	// Policy is the policy that last denied it (a tier's, an
	// override's).
	Policy string `json:"policy,omitempty"`
	Denied uint64 `json:"denied"`
	// Admitted counts the key's admissions since its first denial in
	// the window.
	Admitted uint64 `json:"admitted"`
	// Error is how much of Denied may be other keys' (0 when exact).
	Error     uint64    `json:"error,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// wireSummary is one rule's summary in a blob.
type wireSummary struct {
	Shadow     bool        `json:"s,omitempty"`
	Displaced  uint64      `json:"x,omitempty"`
	ErrorBound uint64      `json:"b,omitempty"`
	Entries    []wireEntry `json:"e"`
}

type wireEntry struct {
	Tag      string     `json:"t"`
	Client   netip.Addr `json:"c,omitzero"`
	Policy   string     `json:"p,omitempty"`
	Denied   uint64     `json:"d"`
	Admitted uint64     `json:"a,omitempty"`
	Err      uint64     `json:"r,omitempty"`
	First    int64      `json:"f"`
	Last     int64      `json:"l"`
}

// snapshot copies s for the wire.
func (s *summary) snapshot(shadow bool) wireSummary {
	w := wireSummary{Shadow: shadow, Displaced: s.displaced, ErrorBound: s.errBound, Entries: make([]wireEntry, 0, s.n)}
	for i := 0; i < s.n; i++ {
		e := &s.entries[i]
		w.Entries = append(w.Entries, wireEntry{
			Tag: string(e.key()), Client: e.client, Policy: e.policy,
			Denied: e.denied, Admitted: e.admitted, Err: e.err, First: e.first, Last: e.last,
		})
	}
	return w
}

// local returns this replica's summaries of window w by rule, and whether
// any changed since the last publish (clearing the marks if clear).
func (r *Recorder) local(w int64, clear bool) (map[string]wireSummary, bool) {
	out := map[string]wireSummary{}
	dirty := false
	for name, rt := range r.rulesNow() {
		rt.mu.Lock()
		rt.at(r.window(r.clock()))
		var s *summary
		switch w {
		case rt.win:
			s, dirty = rt.cur, dirty || rt.curDirty
			if clear {
				rt.curDirty = false
			}
		case rt.win - 1:
			s, dirty = rt.prev, dirty || rt.prevDirty
			if clear {
				rt.prevDirty = false
			}
		}
		if s != nil && s.n > 0 {
			out[name] = s.snapshot(rt.shadow)
		}
		rt.mu.Unlock()
	}
	return out, dirty
}

// Publish sends this replica's summaries of the current window, and of the
// previous one if it changed since it was last sent, to the Exchange in
// one call. A replica with nothing new sends nothing.
func (r *Recorder) Publish(ctx context.Context) error {
	if r.opts.Exchange == nil {
		return nil
	}
	r.shareMu.Lock()
	defer r.shareMu.Unlock()
	now := r.clock()
	cur := r.window(now)
	var blobs []Blob
	var undo []func()
	for _, w := range []int64{cur, cur - 1} {
		sums, dirty := r.local(w, true)
		if !dirty {
			continue
		}
		data, err := json.Marshal(sums)
		if err != nil {
			return fmt.Errorf("denials: encode the summaries: %w", err)
		}
		// Kept until the window has been the previous one, and a
		// share interval more.
		end := time.Unix(0, (w+2)*int64(r.opts.Window))
		blobs = append(blobs, Blob{Window: WindowID{r.opts.Window, w}, Data: data, TTL: end.Sub(now) + 2*r.opts.ShareInterval})
		w := w
		undo = append(undo, func() { r.markDirty(w) })
	}
	if len(blobs) == 0 {
		return nil
	}
	if err := r.opts.Exchange.Publish(ctx, r.opts.Replica, blobs); err != nil {
		for _, u := range undo {
			u()
		}
		r.countShareError()
		return fmt.Errorf("denials: publish: %w", err)
	}
	return nil
}

// markDirty marks window w's summaries to be published again.
func (r *Recorder) markDirty(w int64) {
	for _, rt := range r.rulesNow() {
		rt.mu.Lock()
		switch w {
		case rt.win:
			rt.curDirty = rt.curDirty || rt.cur.n > 0
		case rt.win - 1:
			rt.prevDirty = rt.prevDirty || rt.prev.n > 0
		}
		rt.mu.Unlock()
	}
}

func (r *Recorder) countShareError() {
	if r.shareErrs != nil {
		r.shareErrs.Inc()
	}
}

// Top returns rule's n most denied keys in the current and the previous
// window, merged over every replica when there is an Exchange: this
// replica's summaries as they are now, the others' as last published. An
// Exchange that fails leaves this replica's own, and ShareError says why.
func (r *Recorder) Top(ctx context.Context, rule string, n int) Answer {
	now := r.clock()
	cur := r.window(now)
	ids := []WindowID{{r.opts.Window, cur}, {r.opts.Window, cur - 1}}
	a := Answer{Rule: rule, Window: r.opts.Window.Seconds()}
	var remote []map[string][]byte
	if r.opts.Exchange != nil {
		var err error
		remote, err = r.opts.Exchange.Fetch(ctx, ids)
		if err != nil {
			r.countShareError()
			a.ShareError = err.Error()
			remote = nil
		} else {
			a.Shared = true
		}
	}
	for i, id := range ids {
		own, _ := r.local(id.Index, false)
		sums := []wireSummary{}
		if s, ok := own[rule]; ok {
			sums = append(sums, s)
		}
		replicas := 1
		if i < len(remote) {
			seen := 0
			for name, data := range remote[i] {
				if name == r.opts.Replica {
					continue
				}
				if seen++; seen > MaxReplicas {
					break
				}
				replicas++
				var m map[string]wireSummary
				if json.Unmarshal(data, &m) != nil {
					continue
				}
				if s, ok := m[rule]; ok {
					sums = append(sums, s)
				}
			}
		}
		t := r.merge(sums, n)
		t.Replicas = replicas
		t.Start = time.Unix(0, id.Index*int64(r.opts.Window)).UTC()
		t.End = t.Start.Add(r.opts.Window)
		for _, s := range sums {
			a.Shadow = a.Shadow || s.Shadow
		}
		if i == 0 {
			a.Current = t
		} else {
			a.Previous = t
		}
	}
	return a
}

// merge adds up summaries of one rule and window, key by key, and returns
// the n most denied. The counts of a key are summed; a key one summary
// displaced may be missing from it, with at most that summary's error
// bound: the bounds add up.
func (r *Recorder) merge(sums []wireSummary, n int) WindowTop {
	t := WindowTop{Exact: true, Entries: []Entry{}}
	byTag := map[string]*wireEntry{}
	for _, s := range sums {
		if s.Displaced > 0 {
			t.Exact = false
		}
		t.ErrorBound += s.ErrorBound
		for i, e := range s.Entries {
			if i >= r.opts.Size || len(e.Tag) > MaxTag {
				break
			}
			m := byTag[e.Tag]
			if m == nil {
				c := e
				byTag[e.Tag] = &c
				continue
			}
			m.Denied += e.Denied
			m.Admitted += e.Admitted
			m.Err += e.Err
			m.First = min(m.First, e.First)
			if e.Last > m.Last {
				m.Last = e.Last
				if e.Client.IsValid() {
					m.Client = e.Client
				}
				m.Policy = e.Policy
			}
		}
	}
	t.Keys = len(byTag)
	all := make([]*wireEntry, 0, len(byTag))
	for _, e := range byTag {
		all = append(all, e)
	}
	slices.SortFunc(all, func(a, b *wireEntry) int {
		if c := cmp.Compare(b.Denied, a.Denied); c != 0 {
			return c
		}
		return cmp.Compare(a.Tag, b.Tag)
	})
	if len(all) > n {
		all = all[:n]
	}
	for _, e := range all {
		x := Entry{
			Tag: e.Tag, Policy: e.Policy, Denied: e.Denied, Admitted: e.Admitted, Error: e.Err,
			FirstSeen: time.Unix(0, e.First).UTC(), LastSeen: time.Unix(0, e.Last).UTC(),
		}
		if e.Client.IsValid() {
			x.Client = e.Client.String()
		}
		t.Entries = append(t.Entries, x)
	}
	return t
}

// Known reports whether the recorder has seen rule.
func (r *Recorder) Known(rule string) bool {
	_, ok := r.rulesNow()[rule]
	return ok
}
