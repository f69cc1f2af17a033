package denials

import (
	"slices"
	"time"
)

// rates is one rule's last RatePoints samples. Owned by the sampler, read
// under the rule's lock.
type rates struct {
	lastAdmitted, lastDenied uint64
	points                   [RatePoints]ratePoint
	head, n                  int
}

type ratePoint struct {
	at               time.Time
	admitted, denied uint64 // in the step before at
}

// Rates are one rule's admitted and denied requests a second, over the
// last minutes.
type Rates struct {
	// Rule names the rule; Shadow says its denials were a shadow rule's.
	Rule   string `json:"rule"`
	Shadow bool   `json:"shadow,omitempty"`
	// Step is the time between two points, in seconds.
	Step float64 `json:"step"`
	// At are the points' times; Admitted and Denied the rates (per
	// second) in the step before each, oldest first.
	At       []time.Time `json:"at"`
	Admitted []float64   `json:"admitted"`
	Denied   []float64   `json:"denied"`
}

// sample adds a point to every rule's rates.
func (r *Recorder) sample() {
	now := r.clock()
	for _, rt := range r.rulesNow() {
		a, d := rt.admitted.Load(), rt.denied.Load()
		rt.mu.Lock()
		p := &rt.rates
		slot := (p.head + p.n) % RatePoints
		if p.n == RatePoints {
			p.head = (p.head + 1) % RatePoints
		} else {
			p.n++
		}
		p.points[slot] = ratePoint{at: now, admitted: a - p.lastAdmitted, denied: d - p.lastDenied}
		p.lastAdmitted, p.lastDenied = a, d
		rt.mu.Unlock()
	}
}

// Rates returns the rates of every rule seen, by name.
func (r *Recorder) Rates() []Rates {
	var out []Rates
	for name, rt := range r.rulesNow() {
		rt.mu.Lock()
		x := Rates{Rule: name, Shadow: rt.shadow, Step: RateStep.Seconds()}
		p := &rt.rates
		for i := 0; i < p.n; i++ {
			pt := p.points[(p.head+i)%RatePoints]
			x.At = append(x.At, pt.at)
			x.Admitted = append(x.Admitted, float64(pt.admitted)/RateStep.Seconds())
			x.Denied = append(x.Denied, float64(pt.denied)/RateStep.Seconds())
		}
		rt.mu.Unlock()
		out = append(out, x)
	}
	slices.SortFunc(out, func(a, b Rates) int {
		switch {
		case a.Rule < b.Rule:
			return -1
		case a.Rule > b.Rule:
			return 1
		}
		return 0
	})
	return out
}
