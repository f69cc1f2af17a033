package algo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/scripts"
)

// Redis is the Redis store: a decision is one call of scripts/decide.lua, one
// round trip whatever the number of rules, atomic because Redis runs a script
// without interleaving other commands.
//
// Redis Cluster runs a script only on keys of one hash slot. All keys of one
// rule and key share a slot, and so do all rules that limit the same key
// (see StorageKey): 1/min + 5/h + 10/day on one phone number is one call in a
// cluster too. A decision whose keys span slots (a per-IP rule with a global
// rule, say) is split by slot: one call per slot, all in parallel. If one
// slot denies while another admitted, scripts/refund.lua takes the admitted
// slots' consumption back, so the decision still consumes nothing; in the
// moment between the two, another request may see the briefly consumed
// quota. Only a cluster client (*redis.ClusterClient) is split.
type Redis struct {
	client  redis.Scripter
	cluster bool
	prefix  string
	decide  *redis.Script
	refund  *redis.Script

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
	_, cluster := client.(*redis.ClusterClient)
	return &Redis{
		client:  client,
		cluster: cluster,
		prefix:  prefix,
		decide:  redis.NewScript(scripts.Decide),
		refund:  redis.NewScript(scripts.Refund),
		nonce:   hex.EncodeToString(b[:]),
	}
}

// Load loads the scripts into Redis (every primary, for a cluster client), so
// the first decision needs no fallback from EVALSHA to EVAL. Decide works
// without it: it falls back to EVAL when Redis answers NOSCRIPT.
func (r *Redis) Load(ctx context.Context) error {
	for _, s := range []*redis.Script{r.decide, r.refund} {
		if err := s.Load(ctx, r.client).Err(); err != nil {
			return fmt.Errorf("load script: %w", err)
		}
	}
	return nil
}

// Decide evaluates reqs as one request: every rule that is not a shadow
// admits it and then every allowing rule consumes its cost, or nothing is
// consumed anywhere. It writes one Result per request into res, which must be
// at least as long as reqs, and reports whether the request is admitted. Each
// rule may appear once. An error means no decision was made: Redis failed or
// timed out (bound ctx with a deadline), or the requests were invalid
// (wrapping ErrInvalid); res is then undefined.
func (r *Redis) Decide(ctx context.Context, reqs []Request, res []Result) (bool, error) {
	if err := checkRequests(reqs, res); err != nil {
		return false, err
	}
	if r.cluster {
		if groups := bySlot(reqs); len(groups) > 1 {
			return r.decideSplit(ctx, reqs, res, groups)
		}
	}
	c := r.newCall(reqs)
	ok, _, err := r.run(ctx, c, reqs, res)
	return ok, err
}

// call is one script call's arguments.
type call struct {
	keys []string
	args []any // args[0] is the pinned time, args[1] the nonce
}

func (r *Redis) newCall(reqs []Request) call {
	c := call{
		keys: make([]string, 0, len(reqs)+1),
		args: make([]any, 0, 2+8*len(reqs)),
	}
	pinned := ""
	if r.clock != nil {
		pinned = strconv.FormatInt(r.clock().UnixMicro(), 10)
	}
	c.args = append(c.args, pinned, r.nonce+strconv.FormatUint(r.seq.Add(1), 36))
	for _, q := range reqs {
		key := q.Rule.StorageKey(r.prefix, q.Key)
		c.keys = append(c.keys, key)
		if q.Rule.spec.Algorithm == SlidingWindowLog {
			c.keys = append(c.keys, key+":n")
		}
		s := q.Rule.spec
		shadow := 0
		if q.Shadow {
			shadow = 1
		}
		c.args = append(c.args, int(s.Algorithm), s.Limit, q.Rule.window, s.Burst, q.Rule.delay, q.EffectiveCost(), q.Rule.capacity, shadow)
	}
	return c
}

// run calls decide.lua and parses its reply into res. It returns whether the
// request was admitted and the script's time.
func (r *Redis) run(ctx context.Context, c call, reqs []Request, res []Result) (bool, int64, error) {
	reply, err := r.decide.Run(ctx, r.client, c.keys, c.args...).Int64Slice()
	if err != nil {
		return false, 0, fmt.Errorf("redis decide: %w", err)
	}
	if len(reply) != 2+6*len(reqs) {
		return false, 0, fmt.Errorf("redis decide: reply has %d values, want %d", len(reply), 2+6*len(reqs))
	}
	for i, q := range reqs {
		v := reply[2+6*i:]
		if v[5] < int64(ReasonNone) || v[5] > int64(ReasonCostTooHigh) {
			return false, 0, fmt.Errorf("redis decide: unknown reason %d", v[5])
		}
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
	return reply[0] == 1, reply[1], nil
}

// decideSplit decides a request whose keys span cluster slots: one call per
// slot in parallel, then refunds if some slot denied while others admitted.
func (r *Redis) decideSplit(ctx context.Context, reqs []Request, res []Result, groups [][]int) (bool, error) {
	type part struct {
		reqs     []Request
		res      []Result
		call     call
		admitted bool
		at       int64
		err      error
	}
	parts := make([]part, len(groups))
	var wg sync.WaitGroup
	for g, idx := range groups {
		p := &parts[g]
		for _, i := range idx {
			p.reqs = append(p.reqs, reqs[i])
		}
		p.res = make([]Result, len(idx))
		p.call = r.newCall(p.reqs)
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.admitted, p.at, p.err = r.run(ctx, p.call, p.reqs, p.res)
		}()
	}
	wg.Wait()

	admitted := true
	var errs []error
	for _, p := range parts {
		admitted = admitted && p.admitted && p.err == nil
		if p.err != nil {
			errs = append(errs, p.err)
		}
	}
	if !admitted {
		// Take back what the admitting slots consumed. This must
		// happen even if the caller's deadline passed.
		refundCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		for g := range parts {
			p := &parts[g]
			if p.err != nil || !p.admitted {
				continue
			}
			if err := r.refundPart(refundCtx, p.call, p.at, p.reqs, p.res); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return false, errors.Join(errs...)
	}
	for g, idx := range groups {
		for j, i := range idx {
			res[i] = parts[g].res[j]
		}
	}
	return admitted, nil
}

// refundPart refunds the rules of one admitted part that consumed, and turns
// their results back into the unconsumed view.
func (r *Redis) refundPart(ctx context.Context, c call, at int64, reqs []Request, res []Result) error {
	var keys []string
	args := []any{at, c.args[1]}
	k := 0
	for i, q := range reqs {
		n := 1
		if q.Rule.spec.Algorithm == SlidingWindowLog {
			n = 2
		}
		if res[i].Allowed {
			keys = append(keys, c.keys[k:k+n]...)
			args = append(args, c.args[2+8*i:2+8*i+8]...)
			res[i].Remaining = min(res[i].Remaining+q.EffectiveCost(), res[i].Limit)
			res[i].Delay = 0
		}
		k += n
	}
	if len(keys) == 0 {
		return nil
	}
	if err := r.refund.Run(ctx, r.client, keys, args...).Err(); err != nil {
		return fmt.Errorf("redis refund: %w", err)
	}
	return nil
}
