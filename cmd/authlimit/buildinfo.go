package main

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildInfo is authlimit_build_info: always 1, labelled with the version
// (as -version prints it), the source revision the binary was built from
// (the Go toolchain records it when building in a git checkout: "unknown"
// otherwise, with "-dirty" when the checkout had changes) and the Go
// version, so that a dashboard can tell which build each replica runs.
func buildInfo(version string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "authlimit_build_info",
		Help: "Always 1, labelled with the version, the source revision and the Go version authlimit was built with.",
		ConstLabels: prometheus.Labels{
			"version":   version,
			"revision":  revision(),
			"goversion": runtime.Version(),
		},
	}, func() float64 { return 1 })
}

// revision is the VCS revision recorded in the binary.
func revision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && rev != "unknown" {
		rev += "-dirty"
	}
	return rev
}
