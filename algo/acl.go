package algo

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RefusedCommands returns the commands decide.lua prefers that Redis does
// not let the store's user run, in order: SETRANGE, which writes a
// window's new count over the old one, and MGET, which reads the keys of a
// request of several rules at once. Without them decisions stay exact:
// the script falls back to SET ... KEEPTTL and to a GET per key. But each
// fallback costs Redis more, and every refusal is an entry in ACL LOG.
//
// Each command is tried where it changes nothing: on the key of Warm's
// probe decision, SETRANGE of nothing at offset 0, which writes nothing
// whether or not the key exists, and MGET. Redis checks the user's rights
// before running a command, so a refusal (NOPERM) says the user lacks it.
// Any other error is returned as it is.
func (r *Redis) RefusedCommands(ctx context.Context) ([]string, error) {
	key := string(r.probe.appendStorageKey(nil, r.prefix, []byte("probe")))
	var refused []string
	for _, c := range []struct {
		name string
		cmd  redis.Cmder
	}{
		{"SETRANGE", r.client.SetRange(ctx, key, 0, "")},
		{"MGET", r.client.MGet(ctx, key)},
	} {
		switch err := c.cmd.Err(); {
		case err != nil && strings.HasPrefix(err.Error(), "NOPERM"):
			refused = append(refused, c.name)
		case err != nil:
			return refused, err
		}
	}
	return refused, nil
}
