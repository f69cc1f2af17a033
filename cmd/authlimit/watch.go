package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watch reloads the configuration files when they change, until ctx ends.
// It watches each file's directory, not the file: an editor or a
// Kubernetes ConfigMap replaces the file (a rename, or a swap of the
// ..data symlink the file points through), and a watch on the file itself
// would stay on the old one. A file that is a symlink out of its directory
// has the directory of its target watched too. An AUTHLIMIT_RLS_CONFIG
// that is a directory is watched itself, which sees its ConfigMap's swaps.
// Only events on the configuration's own files (see watched) reload: a
// log or any other file written beside them does not.
func (r *reloader) watch(ctx context.Context) error {
	var w watched
	if r.rulesPath != "" {
		w.addFile(r.rulesPath)
	}
	if r.rlsPath != "" {
		if fi, err := os.Stat(r.rlsPath); err == nil && fi.IsDir() {
			w.addDir(r.rlsPath)
		} else {
			w.addFile(r.rlsPath)
		}
	}
	if len(w.dirs) == 0 {
		return nil
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch the configuration: %w", err)
	}
	seen := map[string]bool{}
	for _, d := range w.dirs {
		if seen[d] {
			continue
		}
		seen[d] = true
		if err := fw.Add(d); err != nil {
			_ = fw.Close()
			return fmt.Errorf("watch %s: %w", d, err)
		}
	}
	go r.loop(ctx, fw, &w)
	// A change between the start's read and the watch is seen now.
	r.reload("watch started")
	return nil
}

// watched is what the watch looks at: the directories it watches, and in
// them the names whose changes are the configuration's.
type watched struct {
	dirs  []string
	files map[string]bool // paths whose events reload
	yaml  map[string]bool // directories whose .yaml and .yml files' events reload
}

// addFile watches a configuration file: its directory, and when it is a
// symlink out of it, its target's. Events on the file, on its target, and
// on a ConfigMap's ..data symlink beside either (swapped at each update)
// reload.
func (w *watched) addFile(path string) {
	path = filepath.Clean(path)
	dir := filepath.Dir(path)
	w.dirs = append(w.dirs, dir)
	w.add(path, filepath.Join(dir, "..data"))
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return
	}
	// A ConfigMap's file points into a "..<timestamp>" directory of its
	// own directory, replaced at each update: the watch on the directory
	// sees the ..data swap.
	td := filepath.Dir(target)
	base, _ := filepath.EvalSymlinks(dir)
	inside := td == base || filepath.Dir(td) == base && strings.HasPrefix(filepath.Base(td), "..")
	if !inside {
		w.dirs = append(w.dirs, td)
		w.add(target, filepath.Join(td, "..data"))
	}
}

// addDir watches a directory of configuration files (.yaml and .yml) and
// its ConfigMap's ..data symlink.
func (w *watched) addDir(dir string) {
	dir = filepath.Clean(dir)
	w.dirs = append(w.dirs, dir)
	w.add(filepath.Join(dir, "..data"))
	if w.yaml == nil {
		w.yaml = map[string]bool{}
	}
	w.yaml[dir] = true
}

func (w *watched) add(paths ...string) {
	if w.files == nil {
		w.files = map[string]bool{}
	}
	for _, p := range paths {
		w.files[p] = true
	}
}

// concerns reports whether an event on name changes the configuration.
func (w *watched) concerns(name string) bool {
	name = filepath.Clean(name)
	if w.files[name] {
		return true
	}
	base := filepath.Base(name)
	ext := filepath.Ext(base)
	return w.yaml[filepath.Dir(name)] && !strings.HasPrefix(base, ".") && (ext == ".yaml" || ext == ".yml")
}

func (r *reloader) loop(ctx context.Context, fw *fsnotify.Watcher, w *watched) {
	defer fw.Close()
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			quiet.Stop()
			return
		case ev, ok := <-fw.Events:
			if !ok {
				return
			}
			if !w.concerns(ev.Name) {
				continue
			}
			r.log.Debug("configuration file changed", "event", ev.String())
			quiet.Reset(reloadDebounce)
		case err, ok := <-fw.Errors:
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
