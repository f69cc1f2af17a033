package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/guard"
	"github.com/authlimit/authlimit/rules"
)

// ruleSetter puts a checked rule set in force whole: requests already
// under way finish under the set they started with. It refuses a set it
// cannot take, leaving the previous one in force.
type ruleSetter interface {
	SetRules(rs []*rules.Rule) error
	// Rules returns the set in force.
	Rules() []*rules.Rule
}

// The engine registers a new rule set's policies with the guard before it
// swaps the set in: the guard checks them (their division for the local
// fail mode) and refuses them all on any problem.
var (
	_ ruleSetter             = (*decide.Engine)(nil)
	_ decide.PolicyRegistrar = (*guard.Guard)(nil)
)

// reloadDebounce is how long the configuration files must stay quiet after
// a change before they are read: a write in place comes as several events,
// and reading between them would see a part of a file.
const reloadDebounce = 100 * time.Millisecond

// The configurations a reloader reloads, as the config label of the
// reload metrics names them.
const (
	configRules = "rules" // AUTHLIMIT_RULES_FILE (or AUTHLIMIT_RULES, read once)
	configRLS   = "rls"   // AUTHLIMIT_RLS_CONFIG
)

// reloader reloads AUTHLIMIT_RULES_FILE and AUTHLIMIT_RLS_CONFIG: when
// they change, on SIGHUP and on the admin API's reload.
type reloader struct {
	path   string // AUTHLIMIT_RULES_FILE; empty: the rules come from AUTHLIMIT_RULES
	target ruleSetter
	// rls reloads AUTHLIMIT_RLS_CONFIG; nil without it.
	rls   *rlsReloader
	log   *slog.Logger
	clock func() time.Time
	// windows are the windows of the policies in force and of those whose
	// state may live on, the rules' and the rate-limit service's.
	windows *windowLog

	mu     sync.Mutex           // one reload at a time
	hash   string               // of the rules in force
	loaded map[string]time.Time // when each configuration in force was loaded

	reloads     *prometheus.CounterVec
	lastSuccess *prometheus.GaugeVec
	info        *prometheus.GaugeVec
}

// reloadResult is what one reload did to one configuration.
type reloadResult struct {
	// Config is configRules or configRLS.
	Config string `json:"config"`
	// Source is the file or directory read.
	Source string `json:"source"`
	// Result is success (the new configuration is in force), unchanged
	// (it means what the one in force does), error (refused: the one in
	// force stays) or static (read once at start: nothing to reload).
	Result string `json:"result"`
	// Hash identifies the configuration in force afterwards.
	Hash string `json:"hash"`
	// Errors are the mistakes of a refused configuration, each naming
	// the variable.
	Errors []string `json:"errors,omitempty"`
}

// newReloader registers the configuration's metrics and says the
// configurations in force.
func newReloader(s *settings, target ruleSetter, rls *rlsReloader, reg prometheus.Registerer, log *slog.Logger, clock func() time.Time) (*reloader, error) {
	r := &reloader{
		path:   s.RulesFile,
		target: target,
		rls:    rls,
		log:    log,
		clock:  clock,
		hash:   s.rulesHash,
		loaded: map[string]time.Time{},
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authlimit_config_reloads_total",
			Help: "Reloads by configuration (rules: AUTHLIMIT_RULES_FILE; rls: AUTHLIMIT_RLS_CONFIG) and result: success (the new configuration is in force), error (refused: the previous one stays).",
		}, []string{"config", "result"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "authlimit_config_last_reload_success_timestamp_seconds",
			Help: "When the configuration in force was loaded: at start, or by the last successful reload.",
		}, []string{"config"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "authlimit_config_info",
			Help: "1, labelled with the configuration and the hash of the one in force (as -check prints it).",
		}, []string{"config", "hash"}),
	}
	for _, c := range []prometheus.Collector{r.reloads, r.lastSuccess, r.info} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register config metrics: %w", err)
		}
	}
	now := clock()
	inForce := policiesOf(target.Rules())
	r.inForce(configRules, "", r.hash, now)
	if rls != nil {
		r.inForce(configRLS, "", rls.hash, now)
		inForce = append(inForce, rls.cfg.Policies()...)
	}
	r.windows = newWindowLog(inForce)
	if rls != nil {
		rls.windows, rls.clock = r.windows, clock
	}
	return r, nil
}

// inForce records that the configuration with hash is in force since
// now, replacing previous.
func (r *reloader) inForce(config, previous, hash string, now time.Time) {
	for _, result := range []string{"success", "error"} {
		r.reloads.WithLabelValues(config, result)
	}
	if previous != "" {
		r.info.DeleteLabelValues(config, previous)
	}
	r.info.WithLabelValues(config, hash).Set(1)
	r.lastSuccess.WithLabelValues(config).Set(float64(now.UnixNano()) / 1e9)
	r.loaded[config] = now
}

// loadedAt returns the hashes of the configurations in force and when the
// latest of them was loaded.
func (r *reloader) state() (rulesHash, rlsHash string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.loaded {
		if t.After(at) {
			at = t
		}
	}
	if r.rls != nil {
		rlsHash = r.rls.hash
	}
	return r.hash, rlsHash, at
}

// reload reloads every configuration that can be: see reloadRules and
// rlsReloader.reload.
func (r *reloader) reload(trigger string) []reloadResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []reloadResult{r.reloadRules(trigger)}
	if r.rls != nil {
		res := r.rls.reload(trigger)
		r.count(res)
		out = append(out, res)
	}
	return out
}

// count counts a reload's result in the metrics.
func (r *reloader) count(res reloadResult) {
	switch res.Result {
	case "error":
		r.reloads.WithLabelValues(res.Config, "error").Inc()
	case "success":
		r.reloads.WithLabelValues(res.Config, "success").Inc()
	}
}

// reloadRules reads the rules file and, if it holds other rules than those
// in force, checks them whole and puts them in force. A file with any
// mistake leaves the rules in force and logs every mistake, as a start
// would; so does a set the guard or the engine refuses.
func (r *reloader) reloadRules(trigger string) reloadResult {
	res := reloadResult{Config: configRules, Source: r.path, Hash: r.hash}
	if r.path == "" {
		// With AUTHLIMIT_RLS_CONFIG, whose changes reload too, that
		// is no news.
		level := slog.LevelInfo
		if r.rls != nil {
			level = slog.LevelDebug
		}
		r.log.Log(context.Background(), level, "nothing to reload: the rules come from AUTHLIMIT_RULES, read at start", "trigger", trigger)
		res.Source, res.Result = envPrefix+"RULES", "static"
		return res
	}
	rs, err := readRulesStable(r.path)
	if err == nil {
		err = checkSuccession(r.windows, rs, r.clock())
	}
	hash := ""
	var old []*rules.Rule
	if err == nil {
		if hash = rulesHash(rs); hash == r.hash {
			r.log.Debug("rules file changed, its rules did not", "file", r.path, "trigger", trigger, "hash", hash)
			res.Result = "unchanged"
			return res
		}
		old = r.target.Rules()
		err = r.target.SetRules(rs)
	}
	if err != nil {
		res.Result = "error"
		r.count(res)
		for _, e := range unjoin(err) {
			msg := (&ConfigError{Var: envPrefix + "RULES_FILE", Err: e}).Error()
			res.Errors = append(res.Errors, msg)
			r.log.Error("rules reload refused; the previous rules stay in force", "trigger", trigger, "err", msg, "hash", r.hash)
		}
		return res
	}
	r.windows.replace(policiesOf(old), policiesOf(rs), r.clock())
	res.Result, res.Hash = "success", hash
	r.count(res)
	r.inForce(configRules, r.hash, hash, r.clock())
	r.log.Info("rules reloaded", "trigger", trigger, "file", r.path, "rules", len(rs), "hash", hash, "previous_hash", r.hash)
	r.hash = hash
	return res
}

// readRulesStable reads the rules file until two reads agree, so that a
// file being written is not taken half written: a writer that pauses
// longer than reloadDebounce between two writes can still be read between
// them, and the next event reads it again.
func readRulesStable(path string) ([]*rules.Rule, error) {
	b, err := readRulesFile(path)
	for i := 0; err == nil && i < 5; i++ {
		time.Sleep(10 * time.Millisecond)
		var again []byte
		if again, err = readRulesFile(path); err == nil && bytes.Equal(again, b) {
			break
		}
		b = again
	}
	if err != nil {
		return nil, err
	}
	return parseRulesFile(path, b)
}

// checkSuccession refuses a new rule set that changes the window of a
// fixed_window or sliding_window_counter rule under the same name while
// its state of the old window may live (see windowLog): that state counts
// in windows of the old length, numbered from the epoch, and read with
// another length it would mean nothing (a window far in the future). A new
// name starts the rule afresh.
func checkSuccession(w *windowLog, next []*rules.Rule, now time.Time) error {
	var errs []error
	for i, r := range next {
		for j, p := range r.Policies() {
			old, until, ok := w.conflict(p, now)
			if !ok {
				continue
			}
			what := ""
			switch {
			case j == 0:
			case j <= len(r.Tiers):
				what = fmt.Sprintf("tier %q: ", r.Tiers[j-1].Name)
			default:
				what = "an override: "
			}
			s := p.Spec()
			errs = append(errs, fmt.Errorf("rule %d %q: %slimit: the window changes from %v to %v, which %s's counts cannot carry over%s; give the rule a new name to start it afresh", i+1, r.Name, what, old, s.Window, s.Algorithm, liveUntil(until)))
		}
	}
	return errors.Join(errs...)
}

// liveUntil says until when counts of an old window may live, when they
// are no longer in force.
func liveUntil(until time.Time) string {
	if until.IsZero() {
		return ""
	}
	return fmt.Sprintf(" (they were in force before, and may live until %s)", until.UTC().Format(time.RFC3339))
}

// policiesOf returns the policies of rs.
func policiesOf(rs []*rules.Rule) []*algo.Policy {
	var ps []*algo.Policy
	for _, r := range rs {
		ps = append(ps, r.Policies()...)
	}
	return ps
}

// watch reloads the configuration files when they change, until ctx ends.
// It watches each file's directory, not the file: an editor or a
// Kubernetes ConfigMap replaces the file (a rename, or a swap of the
// ..data symlink the file points through), and a watch on the file itself
// would stay on the old one. A file that is a symlink out of its directory
// has the directory of its target watched too. An AUTHLIMIT_RLS_CONFIG
// that is a directory is watched itself, which sees its ConfigMap's swaps.
func (r *reloader) watch(ctx context.Context) error {
	var dirs []string
	if r.path != "" {
		dirs = append(dirs, fileDirs(r.path)...)
	}
	if r.rls != nil {
		if fi, err := os.Stat(r.rls.path); err == nil && fi.IsDir() {
			dirs = append(dirs, r.rls.path)
		} else {
			dirs = append(dirs, fileDirs(r.rls.path)...)
		}
	}
	if len(dirs) == 0 {
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch the configuration: %w", err)
	}
	seen := map[string]bool{}
	for _, d := range dirs {
		if seen[d] {
			continue
		}
		seen[d] = true
		if err := w.Add(d); err != nil {
			_ = w.Close()
			return fmt.Errorf("watch %s: %w", d, err)
		}
	}
	go r.loop(ctx, w)
	// A change between the start's read and the watch is seen now.
	r.reload("watch started")
	return nil
}

// fileDirs returns the directories to watch for a file: its own and, when
// it is a symlink out of it, its target's.
func fileDirs(path string) []string {
	dirs := []string{filepath.Dir(path)}
	if target, err := filepath.EvalSymlinks(path); err == nil {
		// A ConfigMap's file points into a "..<timestamp>" directory
		// of its own directory, replaced at each update: the watch on
		// the directory sees that.
		td := filepath.Dir(target)
		base, _ := filepath.EvalSymlinks(dirs[0])
		inside := td == base || filepath.Dir(td) == base && strings.HasPrefix(filepath.Base(td), "..")
		if !inside {
			dirs = append(dirs, td)
		}
	}
	return dirs
}

func (r *reloader) loop(ctx context.Context, w *fsnotify.Watcher) {
	defer w.Close()
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			quiet.Stop()
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			r.log.Debug("configuration directory changed", "event", ev.String())
			quiet.Reset(reloadDebounce)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			// An overflow loses events: read the file to be sure.
			r.log.Warn("watching the configuration files", "err", err)
			quiet.Reset(reloadDebounce)
		case <-quiet.C:
			r.reload("file changed")
		}
	}
}

// rlsConfig returns the rate-limit configuration in force.
func (r *reloader) rlsConfig() *envoyconf.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rls.cfg
}
