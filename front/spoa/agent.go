package spoa

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
)

// AgentOptions configure an Agent.
type AgentOptions struct {
	// Engine decides. Required.
	Engine *decide.Engine
	// Stopping, once closed, answers at once the requests shaping rules
	// hold: they have spent their quota, so a shutdown admits them early
	// rather than drop them. Nil: never.
	Stopping <-chan struct{}
	// Log logs NOTIFY frames the agent cannot read (at most one line
	// every 10s). Default: discard.
	Log *slog.Logger
}

// Agent is authlimit's Handler: it reads each NOTIFY frame's authlimit
// message into the engine's input, as /auth reads the request
// haproxy/authlimit.lua sends for the same client request, asks the
// engine, and answers with the outcome as variables (see the package's
// documentation).
type Agent struct {
	engine   *decide.Engine
	stopping <-chan struct{}
	log      *slog.Logger
	badLog   logEvery
	scratch  sync.Pool // *scratch
}

// NewAgent validates opts and returns an Agent.
func NewAgent(opts AgentOptions) (*Agent, error) {
	if opts.Engine == nil {
		return nil, errors.New("spoa: no engine")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	// The engine's metrics count the agent's requests under the front
	// "spoa".
	front, err := opts.Engine.Front("spoa")
	if err != nil {
		return nil, err
	}
	a := &Agent{engine: opts.Engine, stopping: opts.Stopping, log: opts.Log}
	a.scratch.New = func() any { return &scratch{a: a, out: decide.Outcome{Front: front}} }
	return a, nil
}

var _ decide.RunThen = (*scratch)(nil)

// scratch is one NOTIFY frame's working memory, pooled, so that a
// decision allocates nothing.
type scratch struct {
	a     *Agent
	reply Reply
	req   request
	hdrs  headers
	in    decide.Input
	out   decide.Outcome
	xff   []byte // the client address as text
	acts  []byte // the ACK's actions
	kept  []byte // the frame's bytes the request refers to, for a decision on a goroutine of its own
}

// Notify implements Handler: the frame is decided as it comes, on the
// reader, and answered by whoever completes its decision (see
// decide.Engine.DecideAsync); a decision that would hold the reader (a
// Redis Cluster) runs on a goroutine of its own.
func (a *Agent) Notify(msgs []byte, r Reply) {
	sc := a.scratch.Get().(*scratch)
	sc.reply = r
	defer sc.recoverSend()
	a.read(sc, msgs)
	if a.engine.DecideAsync(&sc.in, &sc.out, sc) {
		return
	}
	sc.keep()
	go func() {
		defer sc.recoverSend()
		a.engine.Decide(context.Background(), &sc.in, &sc.out)
		sc.Decided(&sc.out)
	}()
}

// read reads the frame into sc.in; a frame it cannot read is refused (see
// decide.Input.Invalid), for the client HAProxy names, or the peer.
func (a *Agent) read(sc *scratch, msgs []byte) {
	r := &sc.req
	kind, detail := readRequest(msgs, r)
	client := r.src
	if !client.IsValid() {
		client = sc.reply.c.peer
	}
	if kind != "" {
		if n := a.badLog.event(time.Now()); n > 0 {
			a.log.Warn("spoa: a NOTIFY frame authlimit cannot read: check haproxy/spoe-authlimit.conf", "kind", kind, "detail", detail, "frames", n)
		}
		sc.in.Refuse(client, kind, detail)
		return
	}
	sc.xff = sc.xff[:0]
	if r.src.IsValid() {
		sc.xff = r.src.AppendTo(sc.xff)
	}
	sc.hdrs = headers{req: r, xff: sc.xff, proto: protoHTTP}
	if r.https {
		sc.hdrs.proto = protoHTTPS
	}
	host := r.host
	if !r.hasHost {
		host = nil
	}
	a.engine.Read(&sc.in, client, r.method, r.uri, host, &sc.hdrs)
	// The peer is trusted, or it could not have connected: its
	// tier header is believed, as a trusted proxy's is by /auth.
	sc.in.TrustedPeer = true
}

// keep copies the frame's bytes the request refers to into sc's own
// memory, for a decision after the reader has moved on.
func (sc *scratch) keep() {
	r := &sc.req
	b := sc.kept[:0]
	for _, p := range []*[]byte{&r.method, &r.uri, &r.host, &r.block} {
		from := len(b)
		b = append(b, *p...)
		*p = b[from:len(b):len(b)]
	}
	sc.kept = b
}

// Decided answers once the outcome is ready. A request a shaping rule
// holds is answered on a goroutine of its own once its delay has passed,
// or at once when shutdown begins.
func (sc *scratch) Decided(o *decide.Outcome) { sc.DecidedIn(nil, o) }

// DecidedIn is Decided within a run of outcomes, whose end the answer's
// write may be left to (see Reply.SendIn).
func (sc *scratch) DecidedIn(run *algo.Run, o *decide.Outcome) {
	if o.Delay > 0 {
		go func() {
			defer sc.recoverSend()
			t := time.NewTimer(o.Delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-sc.a.stopping:
			}
			sc.send(nil, o)
		}()
		return
	}
	defer sc.recoverSend()
	sc.send(run, o)
}

// send answers with the outcome, within run if it is not nil, and pools
// sc.
func (sc *scratch) send(run *algo.Run, o *decide.Outcome) {
	r := sc.reply
	sc.acts = appendActions(sc.acts[:0], o, r.Room())
	sc.reply = Reply{}
	r.SendIn(run, sc.acts)
	sc.a.release(sc)
}

// recoverSend answers with a failure if what decides or answers panics
// before the answer is sent.
func (sc *scratch) recoverSend() {
	p := recover()
	if p == nil {
		return
	}
	sc.a.log.Error("spoa: a decision panicked", "panic", fmt.Sprint(p))
	if r := sc.reply; r.c != nil {
		sc.reply = Reply{}
		r.Send(failed)
	}
}

// failed is the answer to a decision that failed: 500.
var failed = appendSetVarInt(appendSetVar(nil, "verdict", decide.Failed.String()), "status", 500)

// release pools sc without the frame's bytes, which it would otherwise keep
// alive until its next use.
func (a *Agent) release(sc *scratch) {
	sc.req = request{}
	sc.hdrs = headers{}
	sc.in.Request.Header = nil
	a.scratch.Put(sc)
}

// appendActions appends the outcome as set-var actions of transaction
// variables, within room bytes: verdict always; status and reason when the
// request is not admitted; then the rate-limit headers the outcome has
// (ratelimit_policy, x_ratelimit_limit, x_ratelimit_remaining,
// x_ratelimit_reset, ratelimit, retry_after); then, when the request is
// not admitted, body (without its final newline). What room cannot hold
// is left out, the body first.
func appendActions(b []byte, o *decide.Outcome, room int) []byte {
	b = appendSetVar(b, "verdict", o.Verdict.String())
	admitted := o.Verdict.Admitted()
	if !admitted {
		b = appendSetVarInt(b, "status", uint32(o.Status))
		b = fit(b, appendSetVar(b, "reason", o.Kind), room)
	}
	for _, h := range o.Headers {
		b = fit(b, appendSetVar(b, varName(h.Name), h.Value), room)
	}
	if !admitted {
		// Without its final newline, which HAProxy's log-format strings
		// (lf-string) would write as %0A.
		b = fit(b, appendSetVar(b, "body", bytes.TrimSuffix(o.Body, newline)), room)
	}
	return b
}

var newline = []byte{'\n'}

// fit is with if it holds within room, else b as it was (with is b with
// one more action appended).
func fit(b, with []byte, room int) []byte {
	if len(with) > room {
		return b
	}
	return with
}

// varName is the variable a response header's value goes to: its name in
// lower case, '-' as '_'.
func varName(name []byte) string {
	switch string(name) {
	case "RateLimit-Policy":
		return "ratelimit_policy"
	case "X-RateLimit-Limit":
		return "x_ratelimit_limit"
	case "X-RateLimit-Remaining":
		return "x_ratelimit_remaining"
	case "X-RateLimit-Reset":
		return "x_ratelimit_reset"
	case "RateLimit":
		return "ratelimit"
	case "Retry-After":
		return "retry_after"
	}
	return strings.ReplaceAll(strings.ToLower(string(name)), "-", "_")
}
