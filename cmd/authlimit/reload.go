package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/decide"
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

// reloadDebounce is how long the rules file must stay quiet after a change
// before it is read: a write in place comes as several events, and reading
// between them would see a part of the file.
const reloadDebounce = 100 * time.Millisecond

// reloader reloads AUTHLIMIT_RULES_FILE: when it changes and on SIGHUP.
type reloader struct {
	path   string // AUTHLIMIT_RULES_FILE; empty: the rules come from AUTHLIMIT_RULES
	target ruleSetter
	log    *slog.Logger
	clock  func() time.Time

	mu   sync.Mutex // one reload at a time
	hash string     // of the rules in force

	reloads     *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	info        *prometheus.GaugeVec
}

// newReloader registers the configuration's metrics and says the rules in
// force.
func newReloader(s *settings, target ruleSetter, reg prometheus.Registerer, log *slog.Logger, clock func() time.Time) (*reloader, error) {
	r := &reloader{
		path:   s.RulesFile,
		target: target,
		log:    log,
		clock:  clock,
		hash:   s.rulesHash,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authlimit_config_reloads_total",
			Help: "Reloads of AUTHLIMIT_RULES_FILE by result: success (the new rules are in force), error (refused: the previous rules stay).",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "authlimit_config_last_reload_success_timestamp_seconds",
			Help: "When the rules in force were loaded: at start, or by the last successful reload.",
		}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "authlimit_config_info",
			Help: "1, labelled with the hash of the rules in force (as -check prints it).",
		}, []string{"hash"}),
	}
	for _, c := range []prometheus.Collector{r.reloads, r.lastSuccess, r.info} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register config metrics: %w", err)
		}
	}
	for _, result := range []string{"success", "error"} {
		r.reloads.WithLabelValues(result)
	}
	r.info.WithLabelValues(r.hash).Set(1)
	r.lastSuccess.Set(float64(clock().UnixNano()) / 1e9)
	return r, nil
}

// reload reads the rules file and, if it holds other rules than those in
// force, checks them whole and puts them in force. A file with any
// mistake leaves the rules in force and logs every mistake, as a start
// would; so does a set the guard or the engine refuses.
func (r *reloader) reload(trigger string) {
	if r.path == "" {
		r.log.Info("nothing to reload: the rules come from AUTHLIMIT_RULES, read at start", "trigger", trigger)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rs, err := readRulesStable(r.path)
	if err == nil {
		err = checkSuccession(r.target.Rules(), rs)
	}
	hash := ""
	if err == nil {
		if hash = rulesHash(rs); hash == r.hash {
			r.log.Debug("rules file changed, its rules did not", "file", r.path, "trigger", trigger, "hash", hash)
			return
		}
		err = r.target.SetRules(rs)
	}
	if err != nil {
		r.reloads.WithLabelValues("error").Inc()
		for _, e := range unjoin(err) {
			r.log.Error("rules reload refused; the previous rules stay in force", "trigger", trigger, "err", (&ConfigError{Var: envPrefix + "RULES_FILE", Err: e}).Error(), "hash", r.hash)
		}
		return
	}
	r.reloads.WithLabelValues("success").Inc()
	r.lastSuccess.Set(float64(r.clock().UnixNano()) / 1e9)
	r.info.Reset()
	r.info.WithLabelValues(hash).Set(1)
	r.log.Info("rules reloaded", "trigger", trigger, "file", r.path, "rules", len(rs), "hash", hash, "previous_hash", r.hash)
	r.hash = hash
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
// fixed_window or sliding_window_counter rule under the same name: their
// state counts in windows of the old length, numbered from the epoch, and
// read with another length it would mean nothing (a window far in the
// future). A new name starts the rule afresh.
func checkSuccession(old, next []*rules.Rule) error {
	type id struct {
		name string
		alg  algo.Algorithm
	}
	windows := map[id]time.Duration{}
	for _, r := range old {
		for _, p := range r.Policies() {
			s := p.Spec()
			windows[id{s.Name, s.Algorithm}] = s.Window
		}
	}
	var errs []error
	for i, r := range next {
		for j, p := range r.Policies() {
			s := p.Spec()
			if s.Algorithm != algo.FixedWindow && s.Algorithm != algo.SlidingWindowCounter {
				continue
			}
			w, ok := windows[id{s.Name, s.Algorithm}]
			if !ok || w == s.Window {
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
			errs = append(errs, fmt.Errorf("rule %d %q: %slimit: the window changes from %v to %v, which %s's counts cannot carry over; give the rule a new name to start it afresh", i+1, r.Name, what, w, s.Window, s.Algorithm))
		}
	}
	return errors.Join(errs...)
}

// watch reloads the rules file when it changes, until ctx ends. It watches
// the file's directory, not the file: an editor or a Kubernetes ConfigMap
// replaces the file (a rename, or a swap of the ..data symlink the file
// points through), and a watch on the file itself would stay on the old
// one. A file that is a symlink out of its directory has the directory of
// its target watched too.
func (r *reloader) watch(ctx context.Context) error {
	if r.path == "" {
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", r.path, err)
	}
	dirs := []string{filepath.Dir(r.path)}
	if target, err := filepath.EvalSymlinks(r.path); err == nil {
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
	for _, d := range dirs {
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
			r.log.Debug("rules directory changed", "event", ev.String())
			quiet.Reset(reloadDebounce)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			// An overflow loses events: read the file to be sure.
			r.log.Warn("watching the rules file", "file", r.path, "err", err)
			quiet.Reset(reloadDebounce)
		case <-quiet.C:
			r.reload("file changed")
		}
	}
}
