package algo

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// slotCall is one script call on keys of one Redis Cluster slot.
type slotCall struct {
	parts []*part // the requests it decides (decide.lua); nil for refunds
	blob  []byte
	keys  []string
	slot  uint16
	shard int // the primary that served the slot when the batch left

	to        string // the primary a redirection named, for the next attempt
	asking    bool   // the redirection was ASK: send ASKING first
	redirects int
	cmd       *redis.Cmd // the last attempt's reply
	err       error      // set when settled: nil if cmd holds the script's reply
}

// maxRedirects bounds the MOVED and ASK redirections one call follows.
const maxRedirects = 8

// evalSlots runs a script once per call, each on the primary serving its
// slot, in one pipeline per primary. It follows MOVED and ASK redirections,
// and sends again, after a pause, the calls Redis refused before running
// them (TRYAGAIN while a migration splits a slot's keys, CLUSTERDOWN,
// LOADING, MASTERDOWN, READONLY) while ctx's deadline allows; split, if not
// nil, first breaks such a call into smaller ones (one per request), so that
// one request's keys moving does not hold up another's.
//
// A call is never sent again once it may have run. That is why the calls go
// through each primary's own client, which never retries (MaxRetries -1),
// rather than through the cluster client's pipeline: that one sends a
// node's whole pipeline again when its first call is refused, running the
// others twice, and counting their requests twice.
//
// done is called once for every call that settles: with sc.err nil and the
// reply in sc.cmd, or with sc.err saying why not. A call split in two
// settles as its parts.
func (r *Redis) evalSlots(ctx context.Context, sha, src string, calls []*slotCall, split func(*slotCall) []*slotCall, done func(*slotCall)) {
	pause := time.Millisecond
	for len(calls) > 0 {
		var again []*slotCall
		pausing := false
		for _, b := range r.route(ctx, calls, done) {
			r.pipeline(ctx, b.client, sha, src, b.calls)
			for _, sc := range b.calls {
				err := sc.cmd.Err()
				moved, ask, addr := redirection(err)
				switch {
				case err == nil:
					sc.err = nil
					done(sc)
				case (moved || ask) && sc.redirects < maxRedirects:
					// Go where Redis says, at once: the client's own view
					// of the slots is reloaded in the background, at most
					// every 200ms. A second redirection in a row waits for
					// the migration to move on.
					sc.redirects++
					sc.to, sc.asking = addr, ask
					if moved {
						r.cluster.ReloadState(ctx)
					}
					pausing = pausing || sc.redirects > 1
					again = append(again, sc)
				case notExecuted(err):
					sc.to, sc.asking = "", false
					if split != nil {
						again = append(again, split(sc)...)
					} else {
						again = append(again, sc)
					}
					pausing = true
				default:
					sc.err = err
					done(sc)
				}
			}
		}
		calls = again
		if len(calls) == 0 || !pausing {
			continue
		}
		if d, ok := ctx.Deadline(); ok && time.Until(d) < 2*pause {
			for _, sc := range calls {
				sc.err = fmt.Errorf("%w: refused until the deadline: %w", ErrUnreachable, sc.cmd.Err())
				done(sc)
			}
			return
		}
		time.Sleep(pause)
		pause *= 2
	}
}

// nodeBatch is the calls that go to one primary.
type nodeBatch struct {
	client *redis.Client
	calls  []*slotCall
}

// route groups calls by the primary they go to: the one a redirection
// named, or the one the client believes serves the slot. A call with
// nowhere to go settles at once.
func (r *Redis) route(ctx context.Context, calls []*slotCall, done func(*slotCall)) []nodeBatch {
	var out []nodeBatch
	for _, sc := range calls {
		var c *redis.Client
		var err error
		if sc.to != "" {
			c, err = r.nodeByAddr(ctx, sc.to)
		} else {
			c, err = r.cluster.MasterForKey(ctx, r.slotKey(sc.slot))
		}
		if err != nil {
			sc.err = fmt.Errorf("%w: %w", ErrUnreachable, err)
			done(sc)
			continue
		}
		i := 0
		for i < len(out) && out[i].client != c {
			i++
		}
		if i == len(out) {
			out = append(out, nodeBatch{client: c})
		}
		out[i].calls = append(out[i].calls, sc)
	}
	return out
}

// pipeline sends the calls to one primary in one pipeline, each by the
// script's digest and, if the node lost its script cache, again by source;
// an asked call goes after ASKING. The replies are in the calls' cmd.
func (r *Redis) pipeline(ctx context.Context, c *redis.Client, sha, src string, calls []*slotCall) {
	pipe := c.Pipeline()
	for _, sc := range calls {
		if sc.asking {
			_ = pipe.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
		}
		sc.cmd = pipe.EvalSha(ctx, sha, sc.keys, sc.blob)
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	var lost []*slotCall
	for _, sc := range calls {
		if isNoScript(sc.cmd.Err()) {
			lost = append(lost, sc)
		}
	}
	if len(lost) == 0 {
		return
	}
	pipe = c.Pipeline()
	for _, sc := range lost {
		if sc.asking {
			_ = pipe.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
		}
		sc.cmd = pipe.Eval(ctx, src, sc.keys, sc.blob)
	}
	_, _ = pipe.Exec(ctx)
}

// redirection reads a MOVED or ASK error: "MOVED <slot> <addr>" or
// "ASK <slot> <addr>".
func redirection(err error) (moved, ask bool, addr string) {
	if err == nil {
		return false, false, ""
	}
	switch {
	case redis.HasErrorPrefix(err, "MOVED "):
		moved = true
	case redis.HasErrorPrefix(err, "ASK "):
		ask = true
	default:
		return false, false, ""
	}
	msg := err.Error()
	for i := len(msg) - 1; i >= 0; i-- {
		if msg[i] == ' ' {
			return moved, ask, msg[i+1:]
		}
	}
	return false, false, ""
}

// nodeByAddr returns the client of the cluster node at addr. Redirections
// are rare (a slot moving, a failover), so the node is looked up each time
// rather than kept: the cluster client replaces the clients of nodes that
// leave.
func (r *Redis) nodeByAddr(ctx context.Context, addr string) (*redis.Client, error) {
	var mu sync.Mutex
	var found *redis.Client
	err := r.cluster.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		r.cluster.ReloadState(ctx)
		return nil, fmt.Errorf("redirected to %s, a node the client does not know yet", addr)
	}
	return found, nil
}

// slotKey returns a short key that hashes to the slot, so that the client's
// routing can be asked about a slot without building a key.
func (r *Redis) slotKey(s uint16) string {
	r.nodeMu.RLock()
	keys := r.slotKeys
	r.nodeMu.RUnlock()
	if keys == nil {
		r.nodeMu.Lock()
		if r.slotKeys == nil {
			r.slotKeys = newSlotKeys()
		}
		keys = r.slotKeys
		r.nodeMu.Unlock()
	}
	return keys[s]
}
