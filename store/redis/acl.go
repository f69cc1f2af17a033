package redis

import (
	"context"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// RefusedCommands returns the commands decide.lua prefers that Redis does
// not let the store's user run, in order: SETRANGE, which writes a
// window's new count over the old one, MGET, which reads the keys of a
// request of several rules at once, and in a Redis Cluster EXISTS, which
// checks a batch's keys before a primary's slots are decided in one call.
// Without them decisions stay exact: the script falls back to SET ...
// KEEPTTL, to a GET per key, and to a call per slot after the primary's
// call is refused. But each fallback costs Redis more, and every refusal
// is an entry in ACL LOG.
//
// Each command is tried where it changes nothing: on the key of Warm's
// probe decision, SETRANGE of nothing at offset 0, which writes nothing
// whether or not the key exists, MGET and EXISTS. Redis checks the user's
// rights before running a command, so a refusal (NOPERM) says the user
// lacks it. Any other error is returned as it is.
func (r *Store) RefusedCommands(ctx context.Context) ([]string, error) {
	key := string(r.probe.AppendStorageKey(nil, r.prefix, []byte("probe")))
	var refused []string
	type try struct {
		name string
		cmd  goredis.Cmder
	}
	tries := []try{
		{"SETRANGE", r.client.SetRange(ctx, key, 0, "")},
		{"MGET", r.client.MGet(ctx, key)},
	}
	if r.cluster != nil {
		tries = append(tries, try{"EXISTS", r.client.Exists(ctx, key)})
	}
	for _, c := range tries {
		switch err := c.cmd.Err(); {
		case err != nil && strings.HasPrefix(err.Error(), "NOPERM"):
			refused = append(refused, c.name)
		case err != nil:
			return refused, err
		}
	}
	return refused, nil
}
