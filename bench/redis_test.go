package main

// Tests of the commandstats arithmetic.

import "testing"

func TestCommandUsec(t *testing.T) {
	before := map[string]cmdStat{"evalsha": {calls: 10, usec: 100}, "incr": {calls: 10, usec: 20}}
	tests := []struct {
		name  string
		after map[string]cmdStat
		want  uint64
		calls uint64 // of scripts
	}{
		{"scripts: inner commands left out", map[string]cmdStat{"evalsha": {calls: 20, usec: 300}, "incr": {calls: 20, usec: 50}, "info": {calls: 1, usec: 9}}, 200, 10},
		{"both script commands", map[string]cmdStat{"evalsha": {calls: 14, usec: 150}, "eval": {calls: 2, usec: 30}, "get": {calls: 20, usec: 50}}, 80, 6},
		{"plain commands summed", map[string]cmdStat{"evalsha": {calls: 10, usec: 100}, "incr": {calls: 30, usec: 60}, "pexpire": {calls: 5, usec: 5}, "info": {calls: 1, usec: 9}}, 45, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, calls := commandUsec(before, tt.after); got != tt.want || calls != tt.calls {
				t.Errorf("commandUsec = %d µs, %d script calls; want %d, %d", got, calls, tt.want, tt.calls)
			}
		})
	}
}
