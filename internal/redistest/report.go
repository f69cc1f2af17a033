package redistest

import (
	"syscall"
	"testing"
	"time"
)

// ReportScripts reports, once b's loop is done, the scripts Redis ran per
// call and their CPU per call (microseconds, the commands they call
// included). On a nil Server (a benchmark on the memory store) it reports
// nothing.
func (s *Server) ReportScripts(b *testing.B) func() {
	b.Helper()
	if s == nil {
		return func() {}
	}
	calls0, usec0 := s.ScriptStats(b)
	return func() {
		calls, usec := s.ScriptStats(b)
		b.ReportMetric(float64(usec-usec0)/float64(b.N), "redis-µs/op")
		b.ReportMetric(float64(calls-calls0)/float64(b.N), "scripts/op")
	}
}

// ReportProcessCPU reports, once b's loop is done, the test process's CPU
// time per call: client and server (and a memory store) together.
func ReportProcessCPU(b *testing.B) func() {
	var start syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &start); err != nil {
		b.Fatal(err)
	}
	return func() {
		var end syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &end); err != nil {
			b.Fatal(err)
		}
		used := time.Duration(end.Utime.Nano()+end.Stime.Nano()-start.Utime.Nano()-start.Stime.Nano()) * time.Nanosecond
		b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-µs/op")
	}
}
