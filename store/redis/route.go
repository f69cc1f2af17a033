package redis

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
)

// slotCall is one script call on keys of one Redis Cluster slot.
type slotCall struct {
	parts []*part // the requests it decides (decide.lua); nil for refunds
	blob  []byte
	keys  []keyArg
	slot  uint16
	shard int // the primary that served the slot when the batch left

	to        string // the primary a redirection named, for the next attempt
	asking    bool   // the redirection was ASK: send ASKING first
	redirects int
	args      []any        // the command: the script, its keys and blob
	reply     bytes.Buffer // the last attempt's reply, as Redis wrote it
	last      error        // the last attempt's error, an error reply included
	err       error        // set when settled: nil if reply holds the script's reply
}

// MarshalBinary is the call's blob as a command argument: passing sc, a
// pointer, boxes nothing.
func (sc *slotCall) MarshalBinary() ([]byte, error) { return sc.blob, nil }

// keyArg is a script key as a command argument: a pointer to one boxes
// nothing, where a string or a []byte would allocate.
type keyArg []byte

func (k *keyArg) MarshalBinary() ([]byte, error) { return *k, nil }

// replyError is an error reply of Redis, read from a raw reply: it is a
// goredis.Error, so goredis.HasErrorPrefix reads it (MOVED, ASK, NOSCRIPT).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

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
// reply in sc.reply, or with sc.err saying why not. A call split in two
// settles as its parts.
func (r *Store) evalSlots(ctx context.Context, sha, src any, calls []*slotCall, split func(*slotCall) []*slotCall, done func(*slotCall)) {
	pause := time.Millisecond
	for len(calls) > 0 {
		var again []*slotCall
		pausing := false
		var buf [4]nodeBatch
		for _, b := range r.route(ctx, buf[:0], calls, done) {
			r.pipeline(ctx, b.client, sha, src, b.calls)
			for _, sc := range b.calls {
				err := sc.last
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
				sc.err = fmt.Errorf("%w: refused until the deadline: %w", algo.ErrUnreachable, sc.last)
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
	client *goredis.Client
	calls  []*slotCall
}

// route appends to out the calls grouped by the primary they go to: the
// one a redirection named, or the one the client believes serves the slot.
// A call with nowhere to go settles at once. Calls that all go to one
// primary, as a batch's usually do, stay in their slice.
func (r *Store) route(ctx context.Context, out []nodeBatch, calls []*slotCall, done func(*slotCall)) []nodeBatch {
	if c := r.onePrimary(ctx, calls); c != nil {
		return append(out, nodeBatch{client: c, calls: calls})
	}
	for _, sc := range calls {
		var c *goredis.Client
		var err error
		if sc.to != "" {
			c, err = r.nodeByAddr(ctx, sc.to)
		} else {
			c, err = r.cluster.MasterForKey(ctx, r.slotKey(sc.slot))
		}
		if err != nil {
			sc.err = fmt.Errorf("%w: %w", algo.ErrUnreachable, err)
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

// onePrimary returns the primary every call goes to, if there is one and
// no call was redirected.
func (r *Store) onePrimary(ctx context.Context, calls []*slotCall) *goredis.Client {
	var one *goredis.Client
	for _, sc := range calls {
		if sc.to != "" {
			return nil
		}
		c, err := r.cluster.MasterForKey(ctx, r.slotKey(sc.slot))
		if err != nil || one != nil && c != one {
			return nil
		}
		one = c
	}
	return one
}

// pipeline sends the calls to one primary in one pipeline, each by the
// script's digest and, if the node lost its script cache, again by source;
// an asked call goes after ASKING. The replies are in the calls' reply.
func (r *Store) pipeline(ctx context.Context, c *goredis.Client, sha, src any, calls []*slotCall) {
	send(ctx, c, "evalsha", sha, calls)
	var lost []*slotCall
	for _, sc := range calls {
		if isNoScript(sc.last) {
			lost = append(lost, sc)
		}
	}
	if len(lost) > 0 {
		send(ctx, c, "eval", src, lost)
	}
}

// send runs the script (verb "evalsha" with its digest, or "eval" with its
// source, each boxed once by the caller) once per call on one primary:
// alone, or in one pipeline. Each reply goes raw into its call's buffer,
// so nothing of it is allocated.
func send(ctx context.Context, c *goredis.Client, verb, script any, calls []*slotCall) {
	if len(calls) == 1 && !calls[0].asking {
		sc := calls[0]
		cmd := sc.command(ctx, verb, script)
		_ = c.Process(ctx, cmd)
		sc.read(cmd)
		return
	}
	pipe := c.Pipeline()
	cmds := make([]*goredis.RawWriteToCmd, len(calls))
	for i, sc := range calls {
		if sc.asking {
			_ = pipe.Process(ctx, goredis.NewStatusCmd(ctx, "asking"))
		}
		cmds[i] = sc.command(ctx, verb, script)
		_ = pipe.Process(ctx, cmds[i])
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	for i, sc := range calls {
		sc.read(cmds[i])
	}
}

// command is the call's script command, its reply to go to sc.reply.
func (sc *slotCall) command(ctx context.Context, verb, script any) *goredis.RawWriteToCmd {
	sc.args = append(sc.args[:0], verb, script, len(sc.keys))
	for i := range sc.keys {
		sc.args = append(sc.args, &sc.keys[i])
	}
	sc.args = append(sc.args, sc)
	sc.reply.Reset()
	return goredis.NewRawWriteToCmd(ctx, &sc.reply, sc.args...)
}

// read sets sc.last from the command's outcome: its error, or the error
// Redis replied with.
func (sc *slotCall) read(cmd *goredis.RawWriteToCmd) {
	sc.last = cmd.Err()
	if b := sc.reply.Bytes(); sc.last == nil && len(b) > 0 && b[0] == '-' {
		sc.last = replyError(bytes.TrimRight(b[1:], "\r\n"))
	}
}

// redirection reads a MOVED or ASK error: "MOVED <slot> <addr>" or
// "ASK <slot> <addr>".
func redirection(err error) (moved, ask bool, addr string) {
	if err == nil {
		return false, false, ""
	}
	switch {
	case goredis.HasErrorPrefix(err, "MOVED "):
		moved = true
	case goredis.HasErrorPrefix(err, "ASK "):
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

// nodeTTL is how long nodeByAddr keeps the cluster client's node clients.
// The cluster client closes the client of a node that has left its layout
// a minute after it left, so a client kept this long is never closed.
const nodeTTL = 10 * time.Second

// nodeByAddr returns the client of the cluster node at addr, for a call
// that Redis redirected there. The cluster client lists its nodes only
// after reloading the cluster's layout, at once, from one node; so the
// list is kept for nodeTTL and looked up again only for an address it
// lacks. Otherwise every redirected call (a migrating slot's, for the
// whole migration) would cost a CLUSTER SLOTS round trip first, and in the
// tens of milliseconds after a failover, while most nodes still report the
// old layout, such reloads hand the client back the layout it had before.
func (r *Store) nodeByAddr(ctx context.Context, addr string) (*goredis.Client, error) {
	r.nodeMu.RLock()
	c := r.nodeClients[addr]
	if time.Since(r.nodeClientsAt) >= nodeTTL {
		c = nil
	}
	r.nodeMu.RUnlock()
	if c != nil {
		return c, nil
	}
	var mu sync.Mutex
	clients := map[string]*goredis.Client{}
	err := r.cluster.ForEachShard(ctx, func(_ context.Context, c *goredis.Client) error {
		mu.Lock()
		clients[c.Options().Addr] = c
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.nodeMu.Lock()
	r.nodeClients, r.nodeClientsAt = clients, time.Now()
	r.nodeMu.Unlock()
	if c := clients[addr]; c != nil {
		return c, nil
	}
	r.cluster.ReloadState(ctx)
	return nil, fmt.Errorf("redirected to %s, a node the client does not know yet", addr)
}

// slotKey returns a short key that hashes to the slot, so that the client's
// routing can be asked about a slot without building a key.
func (r *Store) slotKey(s uint16) string {
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

// slot is Redis Cluster's hash slot of a hash tag: CRC16 (XMODEM) mod 16384.
func slot(tag []byte) uint16 {
	var crc uint16
	for _, c := range tag {
		crc ^= uint16(c) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
