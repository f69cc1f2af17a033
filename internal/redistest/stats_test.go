package redistest

import (
	"context"
	"testing"
)

func TestScriptStats(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_get:calls=7,usec=3,usec_per_call=0.43,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_evalsha:calls=5,usec=51,usec_per_call=10.20,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval:calls=1,usec=20,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n"
	if calls, usec := scriptStats(info); calls != 6 || usec != 71 {
		t.Errorf("scriptStats = %d calls, %d µs; want 6, 71", calls, usec)
	}

	srv := New(t)
	c := srv.Client(t)
	calls0, _ := srv.ScriptStats(t)
	for range 3 {
		if err := c.Eval(context.Background(), "return 1", nil).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if calls, _ := srv.ScriptStats(t); calls-calls0 < 3 {
		t.Errorf("ScriptStats counted %d scripts, want at least 3", calls-calls0)
	}
}
