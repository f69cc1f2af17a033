package algo

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/scripts"
)

// call is one Decide on its way through a batch. The caller encodes its
// requests into parts (one per cluster slot, else one) before queueing it,
// so a worker never reads memory the caller may reuse; the worker writes the
// results into the call. Calls are pooled: whoever touches a call last puts
// it back (see abandon).
type call struct {
	parts    []part
	n        int // requests
	res      [MaxRules]Result
	admitted bool
	err      error
	deadline time.Time

	state atomic.Int32 // callQueued, callSent, callDone or callAbandoned
	done  chan struct{}
	timer *time.Timer
}

// The states of a call.
const (
	callQueued int32 = iota
	callSent
	callDone
	callAbandoned
)

// part is the requests of one call that share a cluster slot, encoded as
// decide.lua reads a request: [B] count, then per rule [H] policy id,
// [B] shadow, [d] cost, [H] key length and the key.
type part struct {
	c     *call
	buf   []byte
	idx   []uint8  // which of the call's requests, in order
	ids   []uint16 // their policy ids
	costs []int64  // their costs
	keys  []string // their storage keys, for a cluster's KEYS
	slot  uint16

	admitted bool
	tokens   [MaxRules]float64 // refund tokens (cluster)
}

// abandon gives the call up after its deadline. It reports false if the
// worker finished it first: then its results are the caller's after all.
func (c *call) abandon() bool {
	return c.state.CompareAndSwap(callQueued, callAbandoned) || c.state.CompareAndSwap(callSent, callAbandoned)
}

// encode resets c and encodes reqs into its parts.
func (r *Redis) encode(ctx context.Context, c *call, reqs []Request) error {
	c.state.Store(callQueued)
	c.n, c.err, c.admitted = len(reqs), nil, false
	c.parts = c.parts[:0]
	for i := range reqs {
		q := &reqs[i]
		id, err := r.id(q.Policy)
		if err != nil {
			return err
		}
		p := r.partFor(c, q.Key)
		p.idx = append(p.idx, uint8(i))
		p.ids = append(p.ids, id)
		p.costs = append(p.costs, q.EffectiveCost())
		p.buf[0]++
		p.buf = binary.LittleEndian.AppendUint16(p.buf, id)
		shadow := byte(0)
		if q.Shadow {
			shadow = 1
		}
		p.buf = append(p.buf, shadow)
		p.buf = binary.LittleEndian.AppendUint64(p.buf, math.Float64bits(float64(q.EffectiveCost())))
		at := len(p.buf)
		p.buf = append(p.buf, 0, 0)
		p.buf = q.Policy.appendStorageKey(p.buf, r.prefix, q.Key)
		binary.LittleEndian.PutUint16(p.buf[at:], uint16(len(p.buf)-at-2))
		if r.cluster != nil {
			p.keys = append(p.keys, string(p.buf[at+2:]))
		}
	}
	return nil
}

// partFor returns the part of c for the key's slot, adding it if needed.
// Without a cluster every request is in one part.
func (r *Redis) partFor(c *call, key []byte) *part {
	var s uint16
	if r.cluster != nil {
		s = slot(key)
		for i := range c.parts {
			if c.parts[i].slot == s {
				return &c.parts[i]
			}
		}
	} else if len(c.parts) == 1 {
		return &c.parts[0]
	}
	if len(c.parts) < cap(c.parts) {
		c.parts = c.parts[:len(c.parts)+1]
	} else {
		c.parts = append(c.parts, part{})
	}
	p := &c.parts[len(c.parts)-1]
	p.c = c
	p.buf = append(p.buf[:0], 0)
	p.idx, p.ids, p.costs, p.keys, p.slot, p.admitted = p.idx[:0], p.ids[:0], p.costs[:0], p.keys[:0], s, false
	return p
}

// complete hands c's outcome to its caller, or, if the caller has given up,
// puts c back in the pool.
func (r *Redis) complete(c *call, err error) {
	c.err = err
	if c.state.CompareAndSwap(callSent, callDone) || c.state.CompareAndSwap(callQueued, callDone) {
		c.done <- struct{}{}
		return
	}
	r.calls.Put(c)
}

// worker is one worker's reusable memory.
type worker struct {
	batch []*call
	parts []*part
	blob  []byte
	seen  []uint32 // per policy id: the batch that last listed it
	gen   uint32
}

// work takes whatever is queued, up to MaxBatch requests, and decides it in
// one script call per slot; it never waits for more to come.
func (r *Redis) work() {
	defer r.wg.Done()
	var w worker
	for {
		var c *call
		select {
		case c = <-r.queue:
		case <-r.stop:
			return
		}
		w.batch = append(w.batch[:0], c)
	gather:
		for len(w.batch) < r.batch {
			select {
			case c = <-r.queue:
				w.batch = append(w.batch, c)
			default:
				break gather
			}
		}
		r.run(&w)
	}
}

// run sends one batch and completes its calls.
func (r *Redis) run(w *worker) {
	live := w.batch[:0]
	var deadline time.Time
	for _, c := range w.batch {
		if !c.state.CompareAndSwap(callQueued, callSent) {
			r.calls.Put(c) // abandoned while queued
			continue
		}
		live = append(live, c)
		if c.deadline.After(deadline) {
			deadline = c.deadline
		}
	}
	if len(live) == 0 {
		return
	}
	// One deadline for the batch: the latest of its calls'. A call whose
	// own budget passes first is abandoned by its caller; the batch goes
	// on for the others.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if r.cluster != nil {
		r.runCluster(ctx, w, live)
		return
	}
	w.parts = w.parts[:0]
	for _, c := range live {
		w.parts = append(w.parts, &c.parts[0])
	}
	w.blob = r.appendBatch(w.blob[:0], w, 0)
	cmd := r.eval(ctx, r.client, w.blob, nil)
	err := cmd.Err()
	if err == nil {
		err = r.parseReply(cmd, w.parts, false)
	}
	err = classify(err)
	for _, c := range live {
		if err == nil {
			c.admitted = c.parts[0].admitted
		}
		r.complete(c, err)
	}
}

// ErrUnreachable is wrapped by the error of a decision that was never
// sent: Redis refused the connection, or no connection was free in time.
// Nothing was decided or consumed.
var ErrUnreachable = errors.New("redis unreachable")

// classify wraps a decision's error, marking those that mean nothing was
// sent.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, redis.ErrPoolTimeout) {
		return fmt.Errorf("redis decide: %w: %w", ErrUnreachable, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, context.DeadlineExceeded) {
		// The batch's deadline passed on the wire: the same budget as
		// the caller's.
		return fmt.Errorf("redis decide: %w: %w", context.DeadlineExceeded, err)
	}
	return fmt.Errorf("redis decide: %w", err)
}

// eval runs decide.lua with blob, by its digest, falling back to its source
// if Redis lost its script cache (a restart or a failover).
func (r *Redis) eval(ctx context.Context, c redis.Cmdable, blob []byte, keys []string) *redis.Cmd {
	cmd := c.EvalSha(ctx, r.decideSHA, keys, blob)
	if isNoScript(cmd.Err()) {
		cmd = c.Eval(ctx, scripts.Decide, keys, blob)
	}
	return cmd
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// appendBatch appends the decide.lua argument for w.parts.
func (r *Redis) appendBatch(dst []byte, w *worker, flags byte) []byte {
	pinned := -1.0
	if r.clock != nil {
		pinned = float64(sinceEpoch(r.clock()))
	}
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(pinned))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(w.parts)))
	npolAt := len(dst)
	dst = append(dst, 0, 0, flags)
	w.gen++
	npol := 0
	for _, p := range w.parts {
		for _, id := range p.ids {
			for int(id) >= len(w.seen) {
				w.seen = append(w.seen, 0)
			}
			if w.seen[id] == w.gen {
				continue
			}
			w.seen[id] = w.gen
			npol++
			dst = r.policy(id).appendParams(dst, id)
		}
	}
	binary.LittleEndian.PutUint16(dst[npolAt:], uint16(npol))
	for _, p := range w.parts {
		dst = append(dst, p.buf...)
	}
	return dst
}

// appendParams appends the policy's entry of a script's policy table.
func (p *Policy) appendParams(dst []byte, id uint16) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, id)
	dst = append(dst, byte(p.spec.Algorithm))
	for _, v := range [...]int64{p.spec.Limit, p.window, p.spec.Burst, p.delay, p.maxCost} {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(v)))
	}
	return dst
}

// parseReply reads decide.lua's reply into the parts' calls' results.
func (r *Redis) parseReply(cmd *redis.Cmd, parts []*part, tokens bool) error {
	v, err := cmd.Text()
	if err != nil {
		return err
	}
	per := 2 + 4*8
	if tokens {
		per += 8
	}
	for _, p := range parts {
		if len(v) < 1+per*len(p.idx) {
			return errors.New("reply is short")
		}
		p.admitted = v[0] == 1
		v = v[1:]
		for j, id := range p.ids {
			c := &r.policy(id).spec
			res := Result{
				Allowed:    v[0] == 1,
				Reason:     Reason(v[1]),
				Limit:      c.Burst,
				Remaining:  int64(le64(v[2:])),
				ResetAfter: micros(int64(le64(v[10:]))),
				RetryAfter: micros(int64(le64(v[18:]))),
				Delay:      micros(int64(le64(v[26:]))),
			}
			if !c.Algorithm.UsesBurst() {
				res.Limit = c.Limit
			}
			if res.Reason > ReasonCostTooHigh {
				return fmt.Errorf("reply has unknown reason %d", res.Reason)
			}
			if tokens {
				p.tokens[j] = le64(v[34:])
			}
			p.c.res[p.idx[j]] = res
			v = v[per:]
		}
	}
	if len(v) != 0 {
		return fmt.Errorf("reply has %d bytes too many", len(v))
	}
	return nil
}

// le64 reads a little-endian float64 from the first 8 bytes of s.
func le64(s string) float64 {
	_ = s[7]
	u := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
	return math.Float64frombits(u)
}
