package main

// Tests of the commandstats arithmetic.

import "testing"

func TestCommandUsec(t *testing.T) {
	before := map[string]cmdStat{"evalsha": {calls: 10, usec: 100}, "incr": {calls: 10, usec: 20}}
	tests := []struct {
		name  string
		after map[string]cmdStat
		want  uint64
	}{
		{"scripts: inner commands left out", map[string]cmdStat{"evalsha": {calls: 20, usec: 300}, "incr": {calls: 20, usec: 50}, "info": {calls: 1, usec: 9}}, 200},
		{"plain commands summed", map[string]cmdStat{"evalsha": {calls: 10, usec: 100}, "incr": {calls: 30, usec: 60}, "pexpire": {calls: 5, usec: 5}, "info": {calls: 1, usec: 9}}, 45},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := commandUsec(before, tt.after); got != tt.want {
				t.Errorf("commandUsec = %d, want %d", got, tt.want)
			}
		})
	}
}
