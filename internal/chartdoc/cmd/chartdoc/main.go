// Command chartdoc rewrites the values table of a Helm chart's README.md
// from its values.yaml (see package chartdoc):
//
//	chartdoc deploy/helm/authlimit
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/authlimit/authlimit/internal/chartdoc"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chartdoc:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: chartdoc CHART_DIR")
	}
	readmePath := filepath.Join(args[0], "README.md")
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		return err
	}
	values, err := os.ReadFile(filepath.Join(args[0], "values.yaml"))
	if err != nil {
		return err
	}
	out, err := chartdoc.Generate(readme, values)
	if err != nil {
		return err
	}
	if bytes.Equal(out, readme) {
		return nil
	}
	return os.WriteFile(readmePath, out, 0o644)
}
