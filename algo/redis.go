package algo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/scripts"
)

// Redis is the Redis store: every decision is one call of scripts/decide.lua,
// one round trip whatever the number of rules, atomic because Redis runs a
// script without interleaving other commands.
//
// In Redis Cluster a script may only touch keys of one hash slot. All keys
// of one rule and key share a slot, and so do all rules that limit the same
// key (see StorageKey). A decision whose keys span several slots (a per-IP
// rule with a global rule, say) cannot be one script call there; Decide
// returns an error wrapping ErrCrossSlot for it unless the store was built
// with a slot splitter, which the cluster mode of the sidecar provides.
type Redis struct {
	client redis.Scripter
	prefix string
	script *redis.Script

	nonce string        // random per store, so members differ across replicas
	seq   atomic.Uint64 // and per call within one store

	// clock, when set, pins the script's time. Only tests set it;
	// production always lets the script read Redis TIME.
	clock func() time.Time
}

// NewRedis returns a store that keeps its state in client under keys that
// start with prefix and a colon.
func NewRedis(client redis.Scripter, prefix string) *Redis {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return &Redis{
		client: client,
		prefix: prefix,
		script: redis.NewScript(scripts.Decide),
		nonce:  hex.EncodeToString(b[:]),
	}
}

// Load loads the script into Redis (every primary, for a cluster client), so
// the first decision needs no fallback from EVALSHA to EVAL. Decide works
// without it: it falls back to EVAL when Redis answers NOSCRIPT.
func (r *Redis) Load(ctx context.Context) error {
	if err := r.script.Load(ctx, r.client).Err(); err != nil {
		return fmt.Errorf("load decide script: %w", err)
	}
	return nil
}

// Decide evaluates reqs as one request: every rule admits it and all consume
// their cost, or none consumes anything. It writes one Result per request
// into res, which must be at least as long as reqs, and reports whether every
// rule allowed. Each rule may appear once. An error means no decision was
// made: Redis failed or timed out (bound ctx with a deadline), or the
// requests were invalid (wrapping ErrInvalid); res is then undefined.
func (r *Redis) Decide(ctx context.Context, reqs []Request, res []Result) (bool, error) {
	if err := checkRequests(reqs, res); err != nil {
		return false, err
	}
	keys := make([]string, 0, len(reqs)+1)
	args := make([]any, 0, 2+7*len(reqs))
	pinned := ""
	if r.clock != nil {
		pinned = strconv.FormatInt(r.clock().UnixMicro(), 10)
	}
	args = append(args, pinned, r.nonce+strconv.FormatUint(r.seq.Add(1), 36))
	for _, q := range reqs {
		key := q.Rule.StorageKey(r.prefix, q.Key)
		keys = append(keys, key)
		if q.Rule.spec.Algorithm == SlidingWindowLog {
			keys = append(keys, key+":n")
		}
		s := q.Rule.spec
		args = append(args, int(s.Algorithm), s.Limit, q.Rule.window, s.Burst, q.Rule.delay, cost(q), q.Rule.capacity)
	}
	reply, err := r.script.Run(ctx, r.client, keys, args...).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("redis decide: %w", err)
	}
	if len(reply) != 1+6*len(reqs) {
		return false, fmt.Errorf("redis decide: reply has %d values, want %d", len(reply), 1+6*len(reqs))
	}
	for i, q := range reqs {
		v := reply[1+6*i:]
		res[i] = Result{
			Allowed:    v[0] == 1,
			Limit:      q.Rule.Capacity(),
			Remaining:  v[1],
			ResetAfter: micros(v[2]),
			RetryAfter: micros(v[3]),
			Delay:      micros(v[4]),
			Reason:     Reason(v[5]),
		}
	}
	return reply[0] == 1, nil
}
