package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// allowedScript calls every command the limited user may call from Lua.
// KEYS[1] is a string key, KEYS[2] a sorted set; it returns the GET (after
// the SETRANGE), the final ZCARD and the EXISTS count.
const allowedScript = `
redis.call('TIME')
redis.call('SET', KEYS[1], 'x', 'PX', 60000)
redis.call('SETRANGE', KEYS[1], '0', 'y')
local v = redis.call('GET', KEYS[1])
redis.call('MGET', KEYS[1], KEYS[2])
redis.call('ZADD', KEYS[2], 1, 'a', 2, 'b', 3, 'c')
redis.call('ZRANGE', KEYS[2], '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 2)
redis.call('ZRANGE', KEYS[2], 0, -1)
redis.call('ZRANK', KEYS[2], 'b')
redis.call('ZSCORE', KEYS[2], 'b')
redis.call('ZREM', KEYS[2], 'a')
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, 0)
local n = redis.call('ZCARD', KEYS[2])
redis.call('PEXPIRE', KEYS[2], 60000)
local e = redis.call('EXISTS', KEYS[1], KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
return {v, n, e}
`

func TestLimitedUserRulesLine(t *testing.T) {
	// The line LimitedUserRules documents, which the README quotes.
	const want = "reset on >PASSWORD ~PREFIX:* resetchannels -@all +ping +select +client|setname +eval +evalsha +script|load +get +mget +set +setrange +del +exists +pexpire +zadd +zcard +zrange +zrank +zrem +zremrangebyrank +zscore +time"
	if got := strings.Join(LimitedUserRules("PASSWORD", "PREFIX"), " "); got != want {
		t.Errorf("LimitedUserRules =\n%s\nwant (as documented)\n%s", got, want)
	}
}

func TestACLUser(t *testing.T) {
	t.Parallel()
	// Redis checks enable-debug-command before the ACL, so without it
	// DEBUG would be refused for the wrong reason.
	srv := NewLocal(t, WithDebugCommand())
	prefix := srv.Prefix(t)
	u := NewACLUser(t, srv, prefix)
	if !strings.HasPrefix(u.URL, "redis://"+u.Name+":"+u.Password+"@127.0.0.1:") {
		t.Errorf("URL = %q", u.URL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	script := redis.NewScript(allowedScript)
	keys := []string{prefix + ":s", prefix + ":z"}

	clients := []struct {
		name      string
		configure func(*redis.Options)
	}{
		{"RESP3 with a name", func(o *redis.Options) { o.ClientName = "authlimit" }},
		{"RESP2", func(o *redis.Options) { o.Protocol = 2 }},
		{"RESP2 with a name", func(o *redis.Options) { o.Protocol, o.ClientName = 2, "authlimit" }},
		{"DB 1", func(o *redis.Options) { o.DB = 1 }},
	}
	for _, tc := range clients {
		t.Run("allowed/"+tc.name, func(t *testing.T) {
			opts, err := redis.ParseURL(u.URL)
			if err != nil {
				t.Fatal(err)
			}
			tc.configure(opts)
			c := redis.NewClient(opts)
			defer c.Close()
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatalf("PING = %v", err)
			}
			if err := c.ScriptFlush(ctx).Err(); !IsNoPerm(err) {
				t.Fatalf("SCRIPT FLUSH = %v, want NOPERM", err)
			}
			// Run: EVALSHA, then EVAL when the script is not cached.
			got, err := script.Run(ctx, c, keys).Slice()
			if err != nil {
				t.Fatalf("Script.Run = %v", err)
			}
			if want := "[y 1 2]"; fmt.Sprint(got) != want {
				t.Errorf("Script.Run = %v, want %s", got, want)
			}
			if err := script.Load(ctx, c).Err(); err != nil {
				t.Fatalf("SCRIPT LOAD = %v", err)
			}
			if err := script.EvalSha(ctx, c, keys).Err(); err != nil {
				t.Fatalf("EVALSHA = %v", err)
			}
		})
	}

	c := u.Client(t)
	other := "elsewhere:k"
	refused := []struct {
		name string
		cmd  func() error
	}{
		{"FLUSHALL", func() error { return c.FlushAll(ctx).Err() }},
		{"KEYS", func() error { return c.Keys(ctx, "*").Err() }},
		{"CONFIG GET", func() error { return c.ConfigGet(ctx, "maxmemory").Err() }},
		{"CONFIG SET", func() error { return c.ConfigSet(ctx, "maxmemory", "1").Err() }},
		{"INFO", func() error { return c.Info(ctx).Err() }},
		{"DEBUG", func() error { return c.Do(ctx, "DEBUG", "SLEEP", 0).Err() }},
		{"ACL WHOAMI", func() error { return c.Do(ctx, "ACL", "WHOAMI").Err() }},
		{"CLIENT LIST", func() error { return c.ClientList(ctx).Err() }},
		{"PUBLISH", func() error { return c.Publish(ctx, prefix+":ch", "x").Err() }},
		{"SCRIPT EXISTS", func() error { return c.ScriptExists(ctx, "x").Err() }},
		{"EVAL_RO", func() error { return c.Do(ctx, "EVAL_RO", "return 1", 0).Err() }},
		{"HGET under the prefix", func() error { return c.HGet(ctx, prefix+":h", "f").Err() }},
		{"GET outside the prefix", func() error { return c.Get(ctx, other).Err() }},
		{"SET outside the prefix", func() error { return c.Set(ctx, other, 1, 0).Err() }},
		{"script with KEYS outside the prefix", func() error {
			return c.Eval(ctx, "return redis.call('GET', KEYS[1])", []string{other}).Err()
		}},
		{"script touching a key outside the prefix", func() error {
			return c.Eval(ctx, "return redis.call('SET', ARGV[1], 1)", nil, other).Err()
		}},
		{"script calling FLUSHALL", func() error {
			return c.Eval(ctx, "return redis.call('FLUSHALL')", nil).Err()
		}},
		{"script calling HSET", func() error {
			return c.Eval(ctx, "return redis.call('HSET', KEYS[1], 'f', 1)", []string{prefix + ":h"}).Err()
		}},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			err := tc.cmd()
			if !IsNoPerm(err) {
				t.Errorf("%s = %v, want an ACL refusal", tc.name, err)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
	if n, err := srv.Client(t).Exists(ctx, other).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS %s as default = %d, %v; want 0: the refused writes must not land", other, n, err)
	}

	t.Run("every rule is needed", func(t *testing.T) {
		full := LimitedUserRules("", prefix)
		if err := aclScenario(ctx, NewACLUser(t, srv, prefix).URL, keys); err != nil {
			t.Fatalf("with every rule: %v", err)
		}
		for i, r := range full {
			if !strings.HasPrefix(r, "+") {
				continue
			}
			without := append(append([]string(nil), full[:i]...), full[i+1:]...)
			u := newACLUser(t, srv, prefix, without)
			err := aclScenario(ctx, u.URL, keys)
			if err == nil {
				t.Errorf("without %s the scenario still passes: the rule is not needed", r)
				continue
			}
			t.Logf("without %s: %v", r, err)
		}
	})

	t.Run("extra commands", func(t *testing.T) {
		u2 := NewACLUser(t, srv, prefix, "HSET")
		err := u2.Client(t).Eval(ctx, "return redis.call('HSET', KEYS[1], 'f', 1)", []string{prefix + ":h"}).Err()
		if err != nil {
			t.Errorf("HSET in a script with +hset = %v", err)
		}
	})
}

// aclScenario does all authlimit does as the user at url: connect with a
// client name to DB 1 over RESP3, PING, EVAL the script that calls every
// allowed command, SCRIPT LOAD and EVALSHA it.
func aclScenario(ctx context.Context, url string, keys []string) error {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	opts.ClientName, opts.DB, opts.MaxRetries = "authlimit", 1, -1
	c := redis.NewClient(opts)
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("PING: %w", err)
	}
	script := redis.NewScript(allowedScript)
	if err := script.Eval(ctx, c, keys).Err(); err != nil {
		return fmt.Errorf("EVAL: %w", err)
	}
	if err := script.Load(ctx, c).Err(); err != nil {
		return fmt.Errorf("SCRIPT LOAD: %w", err)
	}
	if err := script.EvalSha(ctx, c, keys).Err(); err != nil {
		return fmt.Errorf("EVALSHA: %w", err)
	}
	return nil
}
