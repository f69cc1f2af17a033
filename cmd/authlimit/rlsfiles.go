package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/authlimit/authlimit/envoyconf"
)

// loadRLSStable loads the configuration at path until its files read the
// same before and after, so that a file being written is not taken half
// written. The hash identifies the files' names and contents; it is set
// whenever they read the same twice, a configuration with mistakes
// included.
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
			return cfg, before, err
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
