// Package admin is authlimit's admin API, served on a listener of its own,
// apart from the decisions, to holders of a bearer token:
//
//	GET    /v1/quota   what /auth would decide for a request, consuming nothing
//	                   (?rule=NAME&tag=TAG: a key tag's standing under a rule)
//	DELETE /v1/quota   forget the rules' state for a request's client (?rule=NAME: one rule;
//	                   ?rule=NAME&tag=TAG: a key tag's under a rule)
//	GET    /v1/config  the effective configuration, its hash and load time
//	POST   /v1/reload  reload the configuration files now
//	GET    /v1/top     a rule's most denied keys, over every replica (?rule=NAME&n=N)
//	GET    /v1/status  the rules' rates, the store's circuits, the configuration's hash
//	GET    /           the status page, which asks for the token and keeps it for the tab
//
// /v1/quota reads the request the way /auth reads a subrequest: the same
// method, URI, host and URL headers, and the client in X-Forwarded-For or
// X-Real-IP, the caller standing in for a trusted proxy.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/guard"
)

// Config is the effective configuration as GET /v1/config shows it.
type Config struct {
	// Text is the configuration as -check prints it, credentials hidden.
	Text string `json:"config"`
	// Hashes identify the configurations in force, by name (rules, rls).
	Hashes map[string]string `json:"hashes"`
	// LoadedAt is when the latest of them was loaded.
	LoadedAt time.Time `json:"loaded_at"`
}

// ReloadResult is what a reload did to one configuration.
type ReloadResult struct {
	Config string   `json:"config"`
	Source string   `json:"source"`
	Result string   `json:"result"`
	Hash   string   `json:"hash"`
	Errors []string `json:"errors,omitempty"`
}

// Options configure a Handler. Every field is required but Logger and
// Timeout.
type Options struct {
	// Token is the bearer token a request must carry.
	Token string
	// Engine answers the quota endpoints.
	Engine *decide.Engine
	// Store is what Engine reads and resets: the guard /auth decides
	// with.
	Store decide.QuotaStore
	// Read reads a request into an Input as /auth reads a subrequest
	// (handler.Handler.ReadInput).
	Read func(ctx *fasthttp.RequestCtx, in *decide.Input)
	// Config returns the effective configuration.
	Config func() Config
	// Reload reloads the configuration files and says what happened.
	Reload func() []ReloadResult
	// Logger logs resets and refused requests. Default: discard.
	Logger *slog.Logger
	// Timeout bounds a request's store calls. Default one second.
	Timeout time.Duration
	// Top answers GET /v1/top and the rates of /v1/status; nil: none.
	Top Top
	// Circuits returns the store's circuits for /v1/status; nil: none.
	Circuits func() []guard.Circuit
}

// Handler serves the admin API.
type Handler struct {
	token [sha256.Size]byte
	opts  Options
	log   *slog.Logger
}

// New returns a Handler.
func New(opts Options) (*Handler, error) {
	if opts.Token == "" || opts.Engine == nil || opts.Store == nil || opts.Read == nil || opts.Config == nil || opts.Reload == nil {
		return nil, errors.New("admin: a token, an engine, a store, a reader, a config and a reload are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	return &Handler{token: sha256.Sum256([]byte(opts.Token)), opts: opts, log: opts.Logger}, nil
}

// authorized reports whether the request carries the token. Both sides
// are hashed first, so the comparison takes the same time whatever the
// token's length and however much of it a guess gets right.
func (h *Handler) authorized(ctx *fasthttp.RequestCtx) bool {
	got, ok := strings.CutPrefix(string(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)), "Bearer ")
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], h.token[:]) == 1 && ok
}

// Serve answers one admin request. Without the token it answers 401 and
// does nothing.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
	if servePage(ctx) {
		return
	}
	if !h.authorized(ctx) {
		h.log.Warn("admin request refused: no valid bearer token", "peer", peerOf(ctx), "method", string(ctx.Method()), "path", string(ctx.Path()))
		ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="authlimit admin"`)
		writeError(ctx, fasthttp.StatusUnauthorized, "a valid bearer token is required (Authorization: Bearer <AUTHLIMIT_ADMIN_TOKEN>)")
		return
	}
	method := string(ctx.Method())
	switch path := string(ctx.Path()); path {
	case "/v1/quota":
		switch method {
		case fasthttp.MethodGet, fasthttp.MethodDelete:
			switch reset := method == fasthttp.MethodDelete; {
			case ctx.QueryArgs().Has("tag"):
				h.tagQuota(ctx, reset)
			case reset:
				h.reset(ctx)
			default:
				h.quota(ctx)
			}
		default:
			notAllowed(ctx, "GET, DELETE")
		}
	case "/v1/config":
		if method != fasthttp.MethodGet {
			notAllowed(ctx, "GET")
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, h.opts.Config())
	case "/v1/reload":
		if method != fasthttp.MethodPost {
			notAllowed(ctx, "POST")
			return
		}
		h.reload(ctx)
	case "/v1/top", "/v1/status":
		if method != fasthttp.MethodGet {
			notAllowed(ctx, "GET")
			return
		}
		if path == "/v1/top" {
			h.top(ctx)
		} else {
			h.status(ctx)
		}
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not found: the admin API serves /v1/quota, /v1/config, /v1/reload, /v1/top and /v1/status")
	}
}

// quotaJSON is GET /v1/quota's answer.
type quotaJSON struct {
	Client   string     `json:"client"`
	Admitted bool       `json:"admitted"`
	Verdict  string     `json:"verdict"`
	Kind     string     `json:"kind,omitempty"`
	Detail   string     `json:"detail,omitempty"`
	Rules    []ruleJSON `json:"rules"`
}

// ruleJSON is one rule's standing.
type ruleJSON struct {
	Rule      string    `json:"rule"`
	Policy    string    `json:"policy"`
	Algorithm string    `json:"algorithm"`
	Key       []keyJSON `json:"key"`
	Tag       string    `json:"tag"`
	Limit     int64     `json:"limit"`
	Window    string    `json:"window"`
	Burst     int64     `json:"burst,omitempty"`
	Cost      int64     `json:"cost"`
	Shadow    bool      `json:"shadow,omitempty"`
	// Remaining, Reset, RetryAfter and Allowed are the rule's answer
	// with the counts that stand: Remaining before this request's cost.
	Remaining  *int64   `json:"remaining,omitempty"`
	Reset      *float64 `json:"reset,omitempty"`
	RetryAfter *float64 `json:"retry_after,omitempty"`
	Allowed    *bool    `json:"allowed,omitempty"`
}

// keyJSON is one key part and its value in the request.
type keyJSON struct {
	Part  string `json:"part"`
	Value string `json:"value"`
}

func rulesJSON(rs []decide.RuleQuota, withResult bool) []ruleJSON {
	out := make([]ruleJSON, 0, len(rs))
	for _, r := range rs {
		spec := r.Policy.Spec()
		j := ruleJSON{
			Rule: r.Rule.Name, Policy: r.Policy.Name(), Algorithm: spec.Algorithm.String(), Tag: r.Tag,
			Limit: spec.Limit, Window: spec.Window.String(), Cost: r.Cost, Shadow: r.Shadow,
		}
		for _, k := range r.Parts {
			j.Key = append(j.Key, keyJSON{k.Part, k.Value})
		}
		if spec.Algorithm.UsesBurst() {
			j.Burst = spec.Burst
		}
		if withResult {
			rem, reset, retry, ok := r.Remaining, r.ResetAfter.Seconds(), r.RetryAfter.Seconds(), r.Allowed
			j.Remaining, j.Reset, j.Allowed = &rem, &reset, &ok
			if !ok {
				j.RetryAfter = &retry
			}
		}
		out = append(out, j)
	}
	return out
}

func (h *Handler) quota(ctx *fasthttp.RequestCtx) {
	var in decide.Input
	h.opts.Read(ctx, &in)
	c, cancel := context.WithTimeout(context.Background(), h.opts.Timeout)
	defer cancel()
	q, err := h.opts.Engine.Quota(c, &in, h.opts.Store)
	if err != nil {
		h.log.Error("admin quota", "err", err)
		writeError(ctx, fasthttp.StatusServiceUnavailable, "the store could not answer: "+err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, quotaJSON{
		Client:   in.Client.String(),
		Admitted: q.Verdict.Admitted(),
		Verdict:  q.Verdict.String(),
		Kind:     q.Kind,
		Detail:   q.Detail,
		Rules:    rulesJSON(q.Rules, true),
	})
}

// resetJSON is DELETE /v1/quota's answer.
type resetJSON struct {
	Client  string     `json:"client"`
	Verdict string     `json:"verdict"`
	Kind    string     `json:"kind,omitempty"`
	Detail  string     `json:"detail,omitempty"`
	Reset   []ruleJSON `json:"reset"`
}

func (h *Handler) reset(ctx *fasthttp.RequestCtx) {
	var in decide.Input
	h.opts.Read(ctx, &in)
	rule := string(ctx.QueryArgs().Peek("rule"))
	c, cancel := context.WithTimeout(context.Background(), h.opts.Timeout)
	defer cancel()
	q, err := h.opts.Engine.Reset(c, &in, rule, h.opts.Store)
	switch {
	case errors.Is(err, decide.ErrNoRule):
		writeError(ctx, fasthttp.StatusNotFound, err.Error())
		return
	case err != nil:
		h.log.Error("admin reset failed", "peer", peerOf(ctx), "client", in.Client.String(), "rule", rule, "err", err)
		writeError(ctx, fasthttp.StatusServiceUnavailable, "the store could not reset: "+err.Error())
		return
	}
	names := make([]string, 0, len(q.Rules))
	for _, r := range q.Rules {
		names = append(names, r.Rule.Name+"{"+r.Tag+"}")
	}
	h.log.Warn("admin reset a client's quota", "by", "admin token holder", "peer", peerOf(ctx), "client", in.Client.String(), "rule", rule, "reset", names, "verdict", q.Verdict.String())
	writeJSON(ctx, fasthttp.StatusOK, resetJSON{Client: in.Client.String(), Verdict: q.Verdict.String(), Kind: q.Kind, Detail: q.Detail, Reset: rulesJSON(q.Rules, false)})
}

func (h *Handler) reload(ctx *fasthttp.RequestCtx) {
	res := h.opts.Reload()
	status := fasthttp.StatusOK
	for _, r := range res {
		if r.Result == "error" {
			status = fasthttp.StatusUnprocessableEntity
		}
	}
	h.log.Info("admin reload", "peer", peerOf(ctx), "results", len(res), "status", status)
	writeJSON(ctx, status, struct {
		Results []ReloadResult `json:"results"`
	}{res})
}

func notAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set(fasthttp.HeaderAllow, allow)
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed: use "+allow)
}

func writeError(ctx *fasthttp.RequestCtx, status int, msg string) {
	writeJSON(ctx, status, struct {
		Error string `json:"error"`
	}{msg})
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		status, b = fasthttp.StatusInternalServerError, []byte(`{"error":"encode the answer"}`)
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '\n'))
}

func peerOf(ctx *fasthttp.RequestCtx) string {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		return a.String()
	}
	return ctx.RemoteAddr().String()
}
