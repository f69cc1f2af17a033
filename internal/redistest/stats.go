package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

// ScriptStats returns how many scripts (EVAL, EVALSHA and their read-only
// forms) the server has run since it started or its statistics were last
// reset, and the microseconds it spent in them, the commands they called
// included: take the difference around what a benchmark measures. On a
// shared server, others' scripts count too.
func (s *Server) ScriptStats(t testing.TB) (calls, usec int64) {
	t.Helper()
	info, err := s.Client(t).Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("redistest: INFO commandstats: %v", err)
	}
	return scriptStats(info)
}

// scriptStats reads INFO commandstats lines such as
// "cmdstat_evalsha:calls=5,usec=51,usec_per_call=10.20,...".
func scriptStats(info string) (calls, usec int64) {
	for line := range strings.Lines(info) {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_eval") {
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			k, v, _ := strings.Cut(field, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			switch k {
			case "calls":
				calls += n
			case "usec":
				usec += n
			}
		}
	}
	return calls, usec
}
