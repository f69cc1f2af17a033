package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/authlimit/authlimit/internal/membudget"
)

// minBufferedBytes is the smallest AUTHLIMIT_MAX_BUFFERED_BYTES: below
// it, a handful of requests fill it.
const minBufferedBytes = 1 << 20

// connBytes is what a connection's own buffers hold, for the releaser: a
// reader's buffer and a goroutine's stack, about.
const connBytes = 32 << 10

// memorySettings checks AUTHLIMIT_MAX_BUFFERED_BYTES: at least 1 MiB,
// and room for 4 requests of AUTHLIMIT_MAX_HEADER_BYTES.
func memorySettings(s *settings, _ map[string]string, p *problems) {
	c, problem := &s.config, p.add
	if least := max(minBufferedBytes, 4*int64(c.MaxHeaderBytes)); c.MaxBufferedBytes < least {
		problem("MAX_BUFFERED_BYTES", fmt.Errorf("%d is less than %d (1 MiB, and 4 requests of AUTHLIMIT_MAX_HEADER_BYTES)", c.MaxBufferedBytes, least))
	}
}

// describeMemory adds the memory bounds to -check's output.
func (s *settings) describeMemory(w func(k, v string)) {
	w("buffered bytes", fmt.Sprintf("at most %d (%.1f MiB) held for unfinished requests, every port together", s.MaxBufferedBytes, float64(s.MaxBufferedBytes)/(1<<20)))
}

// setRuntimeLimit gives the Go runtime the soft memory limit of the
// container's that GOMEMLIMIT does not set, and logs it.
func setRuntimeLimit(environ map[string]string, log *slog.Logger) {
	limit, why, err := membudget.SetRuntimeLimit(membudget.RootFS(), environ["GOMEMLIMIT"])
	if err != nil {
		log.Warn("could not read the container's memory limit; the Go runtime has none", "err", err)
		return
	}
	if limit > 0 && limit < 1<<62 {
		log.Info("go runtime memory limit", "bytes", limit, "from", why)
	}
}

// newBudget makes the memory budget of AUTHLIMIT_MAX_BUFFERED_BYTES, its
// metrics, and the releaser that returns memory to the system after a
// burst, which runs until stop is closed.
func newBudget(s *settings, reg prometheus.Registerer, openConns func() int64, stop <-chan struct{}) *membudget.Budget {
	b := membudget.New(s.MaxBufferedBytes)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "authlimit_buffered_bytes",
			Help: "Bytes held for requests not yet read whole or answered (header blocks, gRPC messages and streams), every port together; at most AUTHLIMIT_MAX_BUFFERED_BYTES.",
		}, func() float64 { return float64(b.Used()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "authlimit_buffer_evictions_total",
			Help: "Connections closed because they held the most of AUTHLIMIT_MAX_BUFFERED_BYTES when another's request needed room.",
		}, func() float64 { return float64(b.Evictions()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "authlimit_buffer_refusals_total",
			Help: "Requests refused (gRPC RESOURCE_EXHAUSTED, HTTP connection closed) because AUTHLIMIT_MAX_BUFFERED_BYTES was full and no connection held enough to make room.",
		}, func() float64 { return float64(b.Refusals()) }),
	)
	// Released at most every 2 s: a collection of a heap this size costs
	// some milliseconds.
	r := membudget.NewReleaser(16<<20, 2*time.Second,
		membudget.Gauge{Read: b.Used, Bytes: 1},
		membudget.Gauge{Read: openConns, Bytes: connBytes},
		membudget.Gauge{Read: b.EvictedBytes, Bytes: 1, Rising: true})
	go r.Run(stop, time.Second)
	return b
}
