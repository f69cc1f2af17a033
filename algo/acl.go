package algo

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrSetrangeDenied is wrapped by CheckInPlaceWrites's error when the
// Redis user may not run SETRANGE.
var ErrSetrangeDenied = errors.New("the redis user may not run SETRANGE")

// CheckInPlaceWrites reports whether Redis lets the store's user run
// SETRANGE on its keys. decide.lua writes a window's new count over the old
// one with SETRANGE and, when Redis refuses it, with SET ... KEEPTTL: the
// decisions stay exact, but each costs Redis more, and every refusal is an
// entry in ACL LOG. The check sends a SETRANGE of nothing at offset 0 to
// the key of Warm's probe decision: Redis checks the user's rights before
// running it, and such a SETRANGE writes nothing, whether the key exists
// or not. A refusal wraps ErrSetrangeDenied; any other error is Redis's.
func (r *Redis) CheckInPlaceWrites(ctx context.Context) error {
	key := string(r.probe.appendStorageKey(nil, r.prefix, []byte("probe")))
	err := r.client.SetRange(ctx, key, 0, "").Err()
	if err != nil && strings.HasPrefix(err.Error(), "NOPERM") {
		return fmt.Errorf("%w: %w", ErrSetrangeDenied, err)
	}
	return err
}
