package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/front/grpcwire"
	"github.com/authlimit/authlimit/front/rls"
	"github.com/authlimit/authlimit/guard"
)

// policyUnion is the guard as the engine's Decider: the guard must know
// the policies of the rules and of AUTHLIMIT_RLS_CONFIG together, and each
// reload gives only its own, so the union is what the guard is given.
type policyUnion struct {
	*guard.Guard
	mu         sync.Mutex
	rules, rls []*algo.Policy
}

// RegisterPolicies implements decide.PolicyRegistrar: ps are the rules'
// policies.
func (u *policyUnion) RegisterPolicies(ps []*algo.Policy) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.Guard.RegisterPolicies(slices.Concat(ps, u.rls)); err != nil {
		return err
	}
	u.rules = ps
	return nil
}

// setRLS puts the rate-limit service's policies ps in force beside the
// rules'.
func (u *policyUnion) setRLS(ps []*algo.Policy) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.Guard.RegisterPolicies(slices.Concat(u.rules, ps)); err != nil {
		return err
	}
	u.rls = ps
	return nil
}

// rlsSwitch serves ShouldRateLimit and POST /json with the rate-limit
// service of the configuration in force, swapped whole by a reload: a
// request answers under the service it started with.
type rlsSwitch struct {
	cur atomic.Pointer[rls.Service]
}

// ShouldRateLimit implements the rate-limit service.
func (s *rlsSwitch) ShouldRateLimit(ctx context.Context, r *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	return s.cur.Load().ShouldRateLimit(ctx, r)
}

// ShouldRateLimitWire implements the rate-limit service on a request's
// bytes (rls.Service.ShouldRateLimitWire).
func (s *rlsSwitch) ShouldRateLimitWire(ctx context.Context, req, out []byte) ([]byte, error) {
	return s.cur.Load().ShouldRateLimitWire(ctx, req, out)
}

// Register serves the service's ShouldRateLimit on g, from each request's
// bytes.
func (s *rlsSwitch) Register(g *grpcwire.Server) error {
	return grpcwire.UnaryRawAsync(g, rls.ShouldRateLimitMethod, s.ShouldRateLimitWire, s.ShouldRateLimitAsync)
}

// ShouldRateLimitAsync starts a request's decision on the service in
// force (rls.Service.ShouldRateLimitAsync), which answers it.
func (s *rlsSwitch) ShouldRateLimitAsync(ctx context.Context, req, out []byte, r *grpcwire.Reply) bool {
	return s.cur.Load().ShouldRateLimitAsync(ctx, req, out, r)
}

// ServeJSON answers POST /json.
func (s *rlsSwitch) ServeJSON(ctx *fasthttp.RequestCtx) { s.cur.Load().ServeJSON(ctx) }

// rlsReloader reloads AUTHLIMIT_RLS_CONFIG: it checks a new configuration
// whole, gives the guard its policies, and swaps the service.
type rlsReloader struct {
	path  string
	cfg   *envoyconf.Config
	hash  string
	front *rlsSwitch
	union *policyUnion
	build func(*envoyconf.Config) (*rls.Service, error)
	log   *slog.Logger
	// windows and clock are the reloader's (see reloader.windows).
	windows *windowLog
	clock   func() time.Time
}

// reload reads the configuration and, if it differs from the one in force,
// checks it whole and puts it in force. Any mistake leaves the one in
// force and logs every mistake, as a start would.
func (r *rlsReloader) reload(trigger string) reloadResult {
	res := reloadResult{Config: configRLS, Source: r.path, Hash: r.hash}
	cfg, hash, err := loadRLSStable(r.path)
	if err == nil && hash == r.hash {
		r.log.Debug("rate-limit configuration changed, its content did not", "path", r.path, "trigger", trigger, "hash", hash)
		res.Result = "unchanged"
		return res
	}
	if err == nil {
		err = checkRLSSuccession(r.windows, r.cfg, cfg, r.clock())
	}
	if err == nil {
		err = r.swap(cfg)
	}
	if err != nil {
		res.Result = "error"
		for _, e := range unjoin(err) {
			msg := (&ConfigError{Var: envPrefix + "RLS_CONFIG", Err: e}).Error()
			res.Errors = append(res.Errors, msg)
			r.log.Error("rate-limit configuration reload refused; the previous configuration stays in force", "trigger", trigger, "err", msg, "hash", r.hash)
		}
		return res
	}
	r.log.Info("rate-limit configuration reloaded", "trigger", trigger, "path", r.path, "limits", len(cfg.Limits()), "hash", hash, "previous_hash", r.hash)
	r.windows.replace(r.cfg.Policies(), cfg.Policies(), r.clock())
	res.Result, res.Hash = "success", hash
	r.cfg, r.hash = cfg, hash
	return res
}

// swap gives the guard cfg's policies and puts a service of cfg in force.
// The service it replaces is closed at once, releasing its limits from the
// engine, which then registers with the guard only the rules' policies and
// the new service's: the engine and the guard hold the limits in force,
// however many reloads there have been. Requests the old service is still
// answering finish correctly (see rls.Service.Close).
func (r *rlsReloader) swap(cfg *envoyconf.Config) error {
	if err := r.union.setRLS(cfg.Policies()); err != nil {
		return err
	}
	svc, err := r.build(cfg)
	if err != nil {
		_ = r.union.setRLS(r.cfg.Policies())
		return err
	}
	if old := r.front.cur.Swap(svc); old != nil {
		if err := old.Close(); err != nil {
			// The new service is in force; the guard only knows the
			// old limits' policies besides, which is harmless.
			r.log.Warn("rate-limit configuration reloaded; the previous one's limits could not be released", "err", err)
		}
	}
	return nil
}

// loadRLSStable loads the configuration at path until its files read the
// same before and after, so that a file being written is not taken half
// written. The hash identifies the files' names and contents.
func loadRLSStable(path string) (*envoyconf.Config, string, error) {
	var lastErr error
	for i := 0; i < 5; i++ {
		before, err := hashRLS(path)
		if err != nil {
			return nil, "", err
		}
		cfg, err := envoyconf.Load(path)
		after, herr := hashRLS(path)
		if herr == nil && after == before {
			if err != nil {
				return nil, "", err
			}
			return cfg, before, nil
		}
		lastErr = err
		time.Sleep(10 * time.Millisecond)
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("%s kept changing while it was read", path)
	}
	return nil, "", lastErr
}

// hashRLS hashes the files envoyconf.Load reads at path: the file, or the
// directory's .yaml and .yml files not starting with '.'.
func hashRLS(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	files := []string{path}
	if fi.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return "", err
		}
		files = files[:0]
		for _, e := range entries {
			name := e.Name()
			ext := filepath.Ext(name)
			if strings.HasPrefix(name, ".") || ext != ".yaml" && ext != ".yml" {
				continue
			}
			files = append(files, filepath.Join(path, name))
		}
	}
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.Base(f), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// checkRLSSuccession refuses a configuration that changes the unit of a
// fixed_window or sliding_window_counter limit in place while counts of
// the old unit may live (see windowLog): its policy keeps its name (the
// domain and the descriptor path), and its counts, kept in windows of the
// old unit, would mean nothing under the new one.
func checkRLSSuccession(w *windowLog, old, next *envoyconf.Config, now time.Time) error {
	units := map[policyID]*envoyconf.Limit{}
	for _, l := range old.Limits() {
		if l.Policy != nil {
			units[policyID{l.Policy.Name(), l.Policy.Spec().Algorithm}] = l
		}
	}
	var errs []error
	for _, l := range next.Limits() {
		if l.Policy == nil {
			continue
		}
		was, until, ok := w.conflict(l.Policy, now)
		if !ok {
			continue
		}
		s := l.Policy.Spec()
		from := was.String()
		if o, ok := units[policyID{s.Name, s.Algorithm}]; ok {
			from = o.Unit.String()
		}
		errs = append(errs, fmt.Errorf("%s: rate_limit.unit: changes from %s to %s, which %s's counts cannot carry over%s; remove the limit, reload, wait for its counts to expire (two of its old windows), then add it with the new unit", l.Key, from, l.Unit, s.Algorithm, liveUntil(until)))
	}
	return errors.Join(errs...)
}
