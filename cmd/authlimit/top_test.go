package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestTopSettings: each bad value of the top limited clients' and the
// denial log's variables is named with what it should be; good ones show
// in -check.
func TestTopSettings(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"AUTHLIMIT_TOP_SIZE": "0"}, "AUTHLIMIT_TOP_SIZE: 0 is not 1 to 10000"},
		{map[string]string{"AUTHLIMIT_TOP_SIZE": "10001"}, "AUTHLIMIT_TOP_SIZE: 10001 is not 1 to 10000"},
		{map[string]string{"AUTHLIMIT_TOP_WINDOW": "30s"}, "AUTHLIMIT_TOP_WINDOW: 30s is not whole seconds from 1m to 24h"},
		{map[string]string{"AUTHLIMIT_TOP_WINDOW": "90500ms"}, "AUTHLIMIT_TOP_WINDOW: 1m30.5s is not whole seconds"},
		{map[string]string{"AUTHLIMIT_TOP_SHARE_INTERVAL": "2m"}, "AUTHLIMIT_TOP_SHARE_INTERVAL: 2m0s is not 1s to 1m"},
		{map[string]string{"AUTHLIMIT_DENIAL_LOG_RATE": "-1"}, "AUTHLIMIT_DENIAL_LOG_RATE: -1 is not 0 (no denial log) to 10000"},
		{map[string]string{"AUTHLIMIT_LOG_KEYS": "maybe"}, "AUTHLIMIT_LOG_KEYS"},
	} {
		if _, err := loadConfig(tc.env); !strings.Contains(fmt.Sprint(err), tc.want) {
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
	s, err := loadConfig(map[string]string{"AUTHLIMIT_TOP_SIZE": "1000", "AUTHLIMIT_DENIAL_LOG_RATE": "0", "AUTHLIMIT_TOP_WINDOW": "1h"})
	if err != nil {
		t.Fatal(err)
	}
	out := s.describe()
	for _, want := range []string{"top limited      1000 keys per rule and 1h0m0s window, this instance only (no Redis); at most 328384 bytes per rule", "denial log       off (AUTHLIMIT_DENIAL_LOG_RATE=0)"} {
		if !strings.Contains(out, want) {
			t.Errorf("-check does not say %q:\n%s", want, out)
		}
	}
}
