package admin

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/denials"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
)

// Top answers who is being limited: a denials.Recorder.
type Top interface {
	// Top returns rule's n most denied keys in the current and the
	// previous window, over every replica.
	Top(ctx context.Context, rule string, n int) denials.Answer
	// Known reports whether rule's decisions were observed.
	Known(rule string) bool
	// Rates returns each observed rule's rates over the last minutes.
	Rates() []denials.Rates
}

// maxTopN bounds GET /v1/top's n.
const maxTopN = 1000

// top answers GET /v1/top?rule=NAME&n=N.
func (h *Handler) top(ctx *fasthttp.RequestCtx) {
	if h.opts.Top == nil {
		writeError(ctx, fasthttp.StatusNotFound, "not found: the top limited clients are not kept")
		return
	}
	args := ctx.QueryArgs()
	rule := string(args.Peek("rule"))
	names := h.ruleNames()
	if rule == "" {
		writeError(ctx, fasthttp.StatusBadRequest, "rule= is required: one of "+strings.Join(names, ", "))
		return
	}
	if !slices.Contains(names, rule) && !h.opts.Top.Known(rule) {
		writeError(ctx, fasthttp.StatusNotFound, "no rule "+strconv.Quote(rule)+": the rules are "+strings.Join(names, ", "))
		return
	}
	n := 10
	if v := args.Peek("n"); v != nil {
		x, err := strconv.Atoi(string(v))
		if err != nil || x < 1 || x > maxTopN {
			writeError(ctx, fasthttp.StatusBadRequest, "n="+strconv.Quote(string(v))+" is not a whole number from 1 to "+strconv.Itoa(maxTopN))
			return
		}
		n = x
	}
	c, cancel := context.WithTimeout(context.Background(), h.opts.Timeout)
	defer cancel()
	writeJSON(ctx, fasthttp.StatusOK, h.opts.Top.Top(c, rule, n))
}

func (h *Handler) ruleNames() []string {
	var names []string
	for _, r := range h.opts.Engine.Rules() {
		names = append(names, r.Name)
	}
	return names
}

// statusJSON is GET /v1/status's answer: what the status page shows.
type statusJSON struct {
	Rules    []statusRule      `json:"rules"`
	Circuits []guard.Circuit   `json:"circuits"`
	Hashes   map[string]string `json:"hashes"`
	LoadedAt time.Time         `json:"loaded_at"`
	Now      time.Time         `json:"now"`
}

type statusRule struct {
	Rule   string `json:"rule"`
	Limit  string `json:"limit"`
	Shadow bool   `json:"shadow,omitempty"`
	// Rates are the admitted and denied requests a second; nil for a
	// rule not decided yet.
	Rates *denials.Rates `json:"rates,omitempty"`
}

// status answers GET /v1/status: every rule in force with its rates, then
// the rates of limits observed that are not rules (Envoy's), the circuits,
// and the configuration's hashes and load time.
func (h *Handler) status(ctx *fasthttp.RequestCtx) {
	var rates []denials.Rates
	if h.opts.Top != nil {
		rates = h.opts.Top.Rates()
	}
	byRule := map[string]*denials.Rates{}
	for i := range rates {
		byRule[rates[i].Rule] = &rates[i]
	}
	out := statusJSON{Rules: []statusRule{}, Circuits: []guard.Circuit{}, Now: time.Now().UTC()}
	seen := map[string]bool{}
	for _, r := range h.opts.Engine.Rules() {
		spec := r.Policy.Spec()
		limit := strconv.FormatInt(spec.Limit, 10) + " per " + spec.Window.String() + " (" + spec.Algorithm.String() + ")"
		out.Rules = append(out.Rules, statusRule{Rule: r.Name, Limit: limit, Shadow: r.Shadow || h.opts.Engine.Shadow(), Rates: byRule[r.Name]})
		seen[r.Name] = true
	}
	for i := range rates {
		if !seen[rates[i].Rule] {
			out.Rules = append(out.Rules, statusRule{Rule: rates[i].Rule, Shadow: rates[i].Shadow, Rates: &rates[i]})
		}
	}
	if h.opts.Circuits != nil {
		out.Circuits = append(out.Circuits, h.opts.Circuits()...)
	}
	cfg := h.opts.Config()
	out.Hashes, out.LoadedAt = cfg.Hashes, cfg.LoadedAt
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// tagQuota answers GET and DELETE /v1/quota?rule=NAME&tag=TAG: a key
// tag's standing under a rule, as the top limited clients list it, or its
// reset.
func (h *Handler) tagQuota(ctx *fasthttp.RequestCtx, reset bool) {
	rule, tag := string(ctx.QueryArgs().Peek("rule")), string(ctx.QueryArgs().Peek("tag"))
	if rule == "" {
		writeError(ctx, fasthttp.StatusBadRequest, "tag= needs rule=: one of "+strings.Join(h.ruleNames(), ", "))
		return
	}
	c, cancel := context.WithTimeout(context.Background(), h.opts.Timeout)
	defer cancel()
	var (
		q   []decide.RuleQuota
		err error
	)
	if reset {
		q, err = h.opts.Engine.ResetTag(c, rule, tag, h.opts.Store)
	} else {
		q, err = h.opts.Engine.TagQuota(c, rule, tag, h.opts.Store)
	}
	switch {
	case errors.Is(err, decide.ErrNoRule):
		writeError(ctx, fasthttp.StatusNotFound, "no rule "+strconv.Quote(rule)+": the rules are "+strings.Join(h.ruleNames(), ", "))
		return
	case errors.Is(err, decide.ErrBadTag):
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	case err != nil:
		h.log.Error("admin tag quota", "rule", rule, "reset", reset, "err", err)
		writeError(ctx, fasthttp.StatusServiceUnavailable, "the store could not answer: "+err.Error())
		return
	}
	if reset {
		shown := tag
		if len(q) > 0 && q[0].Rule != nil && countsByHeader(q[0].Rule) {
			shown = denials.KeyHash([]byte(tag)) // it may be a credential
		}
		h.log.Warn("admin reset a key's quota", "by", "admin token holder", "peer", peerOf(ctx), "rule", rule, "key", shown)
		writeJSON(ctx, fasthttp.StatusOK, struct {
			Tag   string     `json:"tag"`
			Reset []ruleJSON `json:"reset"`
		}{tag, rulesJSON(q, false)})
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, struct {
		Tag   string     `json:"tag"`
		Rules []ruleJSON `json:"rules"`
	}{tag, rulesJSON(q, true)})
}

// countsByHeader reports whether r's key has a header part, which may be a
// credential.
func countsByHeader(r *rules.Rule) bool {
	for _, p := range r.Key {
		if p.Kind == rules.PartHeader {
			return true
		}
	}
	return false
}
