package decide

import (
	"net/netip"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/rules"
)

// Observer is told every rule's answer to every request the engine
// decides with the store (not the requests refused, allow-listed or
// unmatched before it, nor those a fail mode answered). It is called on the
// request path, once per rule: it must be quick, must not block, must not
// allocate where the engine does not, and must not keep the Decision or
// its slices after it returns.
type Observer interface {
	Observe(d *Decision)
}

// Decision is one rule's answer to one request, for an Observer. Its
// slices are valid only during Observe.
type Decision struct {
	// Rule names the rule; for DecideLimits, the limit's metrics label
	// (bounded: every limit Envoy sends shares one).
	Rule string
	// Policy names the policy that applied: the rule's own, a tier's or
	// an override's (algo.Policy.Name).
	Policy string
	// Tag is the key tag the rule counted the request under.
	Tag []byte
	// Denied: the rule denied the request (a shadow rule: would have).
	Denied bool
	// Shadow: the rule was decided as a shadow rule.
	Shadow bool
	// RetryAfter is how long the client should wait, when denied.
	RetryAfter time.Duration
	// Client is the request's client address when the rule counts by it
	// (its key has the ip part); the zero Addr otherwise.
	Client netip.Addr
	// Credential: the key may hold a credential (it has a header part,
	// or a front picked it), so that a log shows it only hashed.
	Credential bool
	// Method and Path are the request's, as the rules see them; empty
	// for DecideLimits.
	Method, Path []byte
	// Front names Outcome.Front, the front that asked ("unknown"
	// without one).
	Front string
	// Now is when the request was decided.
	Now time.Time
}

// seen keeps what the observer is told of in's request. o keeps the
// slices, which alias in's buffer: in stays untouched while it decides.
func (o *Outcome) seen(in *Input) {
	o.client, o.method, o.path = in.Client, in.Request.Method, in.Request.Path
}

// observe tells the observer each decided rule's answer.
func (e *Engine) observe(o *Outcome, res []algo.Result, now time.Time) {
	d := &o.obs
	for i := range res {
		r := &res[i]
		if r.NotDecided {
			continue
		}
		rule := o.ruleOf[i]
		*d = Decision{
			Rule:       o.limits[i].label,
			Policy:     o.reqs[i].Policy.Name(),
			Tag:        o.reqs[i].Key,
			Denied:     !r.Allowed,
			Shadow:     o.reqs[i].Shadow,
			RetryAfter: r.RetryAfter,
			Credential: true,
			Method:     o.method,
			Path:       o.path,
			Front:      o.Front.Name(),
			Now:        now,
		}
		if rule != nil {
			d.Credential = false
			for _, p := range rule.Key {
				switch p.Kind {
				case rules.PartIP:
					d.Client = o.client
				case rules.PartHeader:
					d.Credential = true
				}
			}
		}
		e.observer.Observe(d)
	}
	*d = Decision{}
}
