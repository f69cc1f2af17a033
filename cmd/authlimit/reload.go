package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/rules"
	"github.com/authlimit/authlimit/ruleset"
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

// reloader reloads AUTHLIMIT_RULES_FILE and AUTHLIMIT_RLS_CONFIG when they
// change, on SIGHUP and on the admin API's reload: it checks a new
// configuration whole, builds the next rule set and puts it in force. It
// is the one place the rule set in force is swapped.
type reloader struct {
	rulesPath string // AUTHLIMIT_RULES_FILE; empty: the rules come from AUTHLIMIT_RULES
	rlsPath   string // AUTHLIMIT_RLS_CONFIG; empty: no rate-limit service
	sets      *ruleset.Holder
	log       *slog.Logger
	clock     func() time.Time

	mu     sync.Mutex           // one reload at a time
	hashes map[string]string    // of each configuration in force
	loaded map[string]time.Time // when each configuration in force was loaded
	// refused is, per configuration, what identifies the content of the
	// last one refused: a refusal is reported (logged and counted) once
	// per distinct content, however many events or signals read it again.
	refused map[string]string

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
// configurations in force: the rule set sets holds, read from s.
func newReloader(s *settings, sets *ruleset.Holder, reg prometheus.Registerer, log *slog.Logger, clock func() time.Time) (*reloader, error) {
	r := &reloader{
		rulesPath: s.RulesFile,
		rlsPath:   s.RLSConfig,
		sets:      sets,
		log:       log,
		clock:     clock,
		hashes:    map[string]string{configRules: s.rulesHash},
		loaded:    map[string]time.Time{},
		refused:   map[string]string{},
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authlimit_config_reloads_total",
			Help: "Reloads by configuration (rules: AUTHLIMIT_RULES_FILE; rls: AUTHLIMIT_RLS_CONFIG) and result: success (the new configuration is in force), error (refused: the previous one stays; counted once per distinct content).",
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
	if r.rlsPath != "" {
		r.hashes[configRLS] = s.rlsHash
	}
	for _, c := range []prometheus.Collector{r.reloads, r.lastSuccess, r.info} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register config metrics: %w", err)
		}
	}
	now := clock()
	for config, hash := range r.hashes {
		r.inForce(config, "", hash, now)
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
	r.hashes[config] = hash
	delete(r.refused, config)
}

// state returns the hashes of the configurations in force (the rate-limit
// configuration's empty without one) and when the latest of them was
// loaded.
func (r *reloader) state() (rulesHash, rlsHash string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.loaded {
		if t.After(at) {
			at = t
		}
	}
	return r.hashes[configRules], r.hashes[configRLS], at
}

// reload reloads every configuration that can be: see reloadRules and
// reloadRLS.
func (r *reloader) reload(trigger string) []reloadResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []reloadResult{r.reloadRules(trigger)}
	if r.rlsPath != "" {
		out = append(out, r.reloadRLS(trigger))
	}
	return out
}

// reloadRules reads the rules file and, if it holds other rules than those
// in force, checks them whole and puts them in force. A file with any
// mistake leaves the rules in force and reports every mistake, as a start
// would; so does a set the rule set refuses.
func (r *reloader) reloadRules(trigger string) reloadResult {
	res := reloadResult{Config: configRules, Source: r.rulesPath, Hash: r.hashes[configRules]}
	if r.rulesPath == "" {
		// With AUTHLIMIT_RLS_CONFIG, whose changes reload too, that
		// is no news.
		level := slog.LevelInfo
		if r.rlsPath != "" {
			level = slog.LevelDebug
		}
		r.log.Log(context.Background(), level, "nothing to reload: the rules come from AUTHLIMIT_RULES, read at start", "trigger", trigger)
		res.Source, res.Result = envPrefix+"RULES", "static"
		return res
	}
	b, err := readRulesStable(r.rulesPath)
	content := contentOf(b, err)
	var rs []*rules.Rule
	if err == nil {
		rs, err = parseRulesFile(r.rulesPath, b)
	}
	var set *ruleset.Set
	if err == nil {
		set, err = r.sets.WithRules(rs, r.clock())
	}
	if err != nil {
		return r.refuse(res, envPrefix+"RULES_FILE", content, trigger, "rules reload refused; the previous rules stay in force", err)
	}
	hash := rulesHash(rs)
	if hash == res.Hash {
		r.log.Debug("rules file changed, its rules did not", "file", r.rulesPath, "trigger", trigger, "hash", hash)
		res.Result = "unchanged"
		delete(r.refused, configRules)
		return res
	}
	now := r.clock()
	r.sets.Store(set, now)
	r.reloads.WithLabelValues(configRules, "success").Inc()
	r.inForce(configRules, res.Hash, hash, now)
	r.log.Info("rules reloaded", "trigger", trigger, "file", r.rulesPath, "rules", len(rs), "hash", hash, "previous_hash", res.Hash)
	res.Result, res.Hash = "success", hash
	return res
}

// reloadRLS reads AUTHLIMIT_RLS_CONFIG and, if its files differ from those
// in force, checks the configuration whole and puts it in force. Any
// mistake leaves the one in force and reports every mistake, as a start
// would.
func (r *reloader) reloadRLS(trigger string) reloadResult {
	res := reloadResult{Config: configRLS, Source: r.rlsPath, Hash: r.hashes[configRLS]}
	cfg, hash, err := loadRLSStable(r.rlsPath)
	if err == nil && hash == res.Hash {
		r.log.Debug("rate-limit configuration changed, its content did not", "path", r.rlsPath, "trigger", trigger, "hash", hash)
		res.Result = "unchanged"
		delete(r.refused, configRLS)
		return res
	}
	var set *ruleset.Set
	if err == nil {
		set, err = r.sets.WithRLS(cfg, r.clock())
	}
	if err != nil {
		content := hash
		if content == "" {
			content = contentOf(nil, err)
		}
		return r.refuse(res, envPrefix+"RLS_CONFIG", content, trigger, "rate-limit configuration reload refused; the previous configuration stays in force", err)
	}
	now := r.clock()
	r.sets.Store(set, now)
	r.reloads.WithLabelValues(configRLS, "success").Inc()
	r.inForce(configRLS, res.Hash, hash, now)
	r.log.Info("rate-limit configuration reloaded", "trigger", trigger, "path", r.rlsPath, "limits", len(cfg.Limits()), "hash", hash, "previous_hash", res.Hash)
	res.Result, res.Hash = "success", hash
	return res
}

// refuse reports a configuration refused for err, each of whose mistakes
// names the variable: in res, always; in the logs and the metrics, once
// per distinct content, which identifies what was read.
func (r *reloader) refuse(res reloadResult, variable, content, trigger, msg string, err error) reloadResult {
	res.Result = "error"
	for _, e := range unjoin(err) {
		res.Errors = append(res.Errors, (&ConfigError{Var: variable, Err: e}).Error())
	}
	if r.refused[res.Config] == content {
		r.log.Debug("reload refused again, for the mistakes already reported", "config", res.Config, "trigger", trigger, "hash", res.Hash)
		return res
	}
	r.refused[res.Config] = content
	r.reloads.WithLabelValues(res.Config, "error").Inc()
	for _, e := range res.Errors {
		r.log.Error(msg, "trigger", trigger, "err", e, "hash", res.Hash)
	}
	return res
}

// contentOf identifies what a read of a configuration found: the hash of
// its bytes, or its error (a file missing, unreadable, too large).
func contentOf(b []byte, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// readRulesStable reads the rules file until two reads agree, so that a
// file being written is not taken half written: a writer that pauses
// longer than reloadDebounce between two writes can still be read between
// them, and the next event reads it again.
func readRulesStable(path string) ([]byte, error) {
	b, err := readRulesFile(path)
	for i := 0; err == nil && i < 5; i++ {
		time.Sleep(10 * time.Millisecond)
		var again []byte
		if again, err = readRulesFile(path); err == nil && bytes.Equal(again, b) {
			break
		}
		b = again
	}
	return b, err
}
