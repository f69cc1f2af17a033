package redis

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/scripts"
)

// call is one Decide on its way through a batch. The caller encodes its
// requests into parts (one per cluster slot, else one) before queueing it,
// so a worker never reads memory the caller may reuse; the worker writes the
// results into the call. Calls are pooled: whoever touches a call last puts
// it back (see abandon).
type call struct {
	parts    []part
	id       float64 // unique in this store, below 2^52: names the request's log entries
	n        int     // requests
	res      [algo.MaxRules]algo.Result
	admitted bool
	err      error
	deadline time.Time
	lost     []refund // a denied call's refunds, for its caller to apply (cluster)

	state   atomic.Int32 // callQueued, callSent, callDone or callAbandoned
	pending atomic.Int32 // parts not yet answered (cluster)
	done    chan struct{}
	timer   *time.Timer

	// A DecideAsync's: who is told, where its results go, and the timer
	// of its budget.
	async  algo.Done
	out    []algo.Result
	expiry *time.Timer
	// refs counts who may still read a done asynchronous call: its
	// completer, and its timer's function unless stopped in time. The
	// last puts it back (see release).
	refs atomic.Int32
}

// release drops the completer's hold on a done asynchronous call, and the
// timer's too if stopped was true (it will not run); the last to let go
// puts the call back.
func (r *Store) release(c *call, stopped bool) {
	n := int32(1)
	if stopped {
		n = 2
	}
	if c.refs.Add(-n) == 0 {
		c.async, c.out = nil, nil
		r.calls.Put(c)
	}
}

// The states of a call.
const (
	callQueued int32 = iota
	callSent
	callDone
	callAbandoned
)

// part is the requests of one call that share a cluster slot, encoded as
// decide.lua reads a request: [B] count, [d] request id, then per rule [H]
// policy id, [B] shadow, [d] cost, [H] key length and the key. The policy
// ids are the store's; appendBatch writes over them, in its copy, their
// places in the batch's policy table.
type part struct {
	c     *call
	buf   []byte
	idx   []uint8  // which of the call's requests, in order
	ids   []uint16 // their policy ids
	idAt  []int    // where their policy ids are in buf
	costs []int64  // their costs
	keyAt []int    // where their storage keys are in buf, start and end (cluster)
	slot  uint16

	// Set by the batch; shard and err in a cluster only.
	shard    int
	err      error
	admitted bool
	tokens   [algo.MaxRules]float64 // refund tokens (cluster)
}

// abandon gives the call up after its deadline. It reports false if the
// worker finished it first: then its results are the caller's after all.
func (c *call) abandon() bool {
	return c.state.CompareAndSwap(callQueued, callAbandoned) || c.state.CompareAndSwap(callSent, callAbandoned)
}

// encode resets c and encodes reqs into its parts.
func (r *Store) encode(ctx context.Context, c *call, reqs []algo.Request) error {
	c.state.Store(callQueued)
	c.n, c.err, c.admitted, c.lost = len(reqs), nil, false, nil
	c.id = float64(r.seq.Add(1) % (1 << 52))
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
		p.idAt = append(p.idAt, len(p.buf))
		p.buf = binary.LittleEndian.AppendUint16(p.buf, id)
		shadow := byte(0)
		if q.Shadow {
			shadow = scripts.FlagShadow
		}
		p.buf = append(p.buf, shadow)
		p.buf = binary.LittleEndian.AppendUint64(p.buf, math.Float64bits(float64(q.EffectiveCost())))
		at := len(p.buf)
		p.buf = append(p.buf, 0, 0)
		p.buf = q.Policy.AppendStorageKey(p.buf, r.prefix, q.Key)
		binary.LittleEndian.PutUint16(p.buf[at:], uint16(len(p.buf)-at-2))
		if r.cluster != nil {
			p.keyAt = append(p.keyAt, at+2, len(p.buf))
		}
	}
	return nil
}

// key is the storage key of the part's j-th request (cluster).
func (p *part) key(j int) []byte { return p.buf[p.keyAt[2*j]:p.keyAt[2*j+1]] }

// appendKeys appends the part's storage keys as script keys (cluster).
func (p *part) appendKeys(dst []keyArg) []keyArg {
	for j := 0; j < len(p.keyAt); j += 2 {
		dst = append(dst, keyArg(p.buf[p.keyAt[j]:p.keyAt[j+1]]))
	}
	return dst
}

// partFor returns the part of c for the key's slot, adding it if needed.
// Without a cluster every request is in one part.
func (r *Store) partFor(c *call, key []byte) *part {
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
	var p *part
	c.parts, p = extend(c.parts)
	p.c = c
	p.buf = binary.LittleEndian.AppendUint64(append(p.buf[:0], 0), math.Float64bits(c.id))
	p.idx, p.ids, p.idAt, p.costs, p.keyAt, p.slot, p.admitted, p.err = p.idx[:0], p.ids[:0], p.idAt[:0], p.costs[:0], p.keyAt[:0], s, false, nil
	return p
}

// extend returns s one element longer, reusing its capacity and whatever
// the new element held there (its buffers), and a pointer to that element.
func extend[T any](s []T) ([]T, *T) {
	if len(s) < cap(s) {
		s = s[:len(s)+1]
	} else {
		var zero T
		s = append(s, zero)
	}
	return s, &s[len(s)-1]
}

// complete hands c's outcome to its caller and reports true, or, if the
// caller has given up, puts c back in the pool and reports false.
func (r *Store) complete(c *call, err error) bool {
	c.err = err
	if c.state.CompareAndSwap(callSent, callDone) || c.state.CompareAndSwap(callQueued, callDone) {
		if d := c.async; d != nil {
			// An asynchronous call: its Done is told here. If its
			// budget's timer has fired meanwhile, expire (which finds
			// the call done) puts it back.
			if err == nil {
				copy(c.out, c.res[:c.n])
			}
			admitted := c.admitted
			r.release(c, c.expiry.Stop())
			d.Decided(admitted, err)
			return true
		}
		c.done <- struct{}{}
		return true
	}
	r.calls.Put(c)
	return false
}

// worker is one connection's turn to carry a batch, and its reusable
// memory.
type worker struct {
	deadline deadlineCtx
	args     [4]any // evalsha, the digest, 0 keys, the batch
	batch    []*call
	parts    []*part
	blob     []byte
	reply    bytes.Buffer
	body     []byte   // decide.lua's reply, in reply
	seen     []uint32 // per policy id: the batch that last listed it
	place    []uint16 // per policy id: its place in that batch's table
	gen      uint32
	cluster  clusterWork
	conn     *respConn // its decide connection (see Store.direct)
	// The outcomes of the batch's asynchronous calls, told once the
	// connection is free again (see free).
	told []told
}

// told is an asynchronous call's outcome, for its Done.
type told struct {
	d        algo.Done
	admitted bool
	err      error
}

// free gives w's connection back, hands on what is queued, and then tells
// the batch's asynchronous calls their outcomes: telling one writes its
// answer to its client, which the next batch need not wait for.
func (r *Store) free(w *worker) {
	if len(w.told) == 0 {
		r.slots.put(w)
		r.handOn()
		return
	}
	t := r.tells.Get().(*tellRun)
	t.told = append(t.told[:0], w.told...)
	clear(w.told)
	w.told = w.told[:0]
	r.slots.put(w)
	r.handOn()
	// One run: a front may leave its answers' writes to its end, so that
	// the batch's answers to one connection leave in one write.
	for _, x := range t.told {
		algo.Tell(x.d, &t.run, x.admitted, x.err)
	}
	t.run.End()
	clear(t.told)
	r.tells.Put(t)
}

// tellRun is a batch's outcomes being told, pooled: see free.
type tellRun struct {
	told []told
	run  algo.Run
}

// MarshalBinary is the batch as a command argument (go-redis writes an
// encoding.BinaryMarshaler as a bulk string). Passing w, a pointer, to
// go-redis boxes nothing; passing w.blob would allocate on every call.
func (w *worker) MarshalBinary() ([]byte, error) { return w.blob, nil }

// lead sends a batch if a connection is free: whatever is queued, up to
// MaxBatch requests, the caller's own among them unless another batch took
// it. The batch's deadline is the caller's own (due), so that sending for
// others never holds a caller past its budget; the others' own deadlines
// still hold, by their callers' timers. What is queued when the batch is
// back goes to the relay.
func (r *Store) lead(due time.Time) {
	w := r.slots.take()
	if w == nil {
		return // every connection is out: their senders hand the queue on
	}
	r.gather(w)
	if len(w.batch) > 0 {
		r.run(w, due)
	}
	r.free(w)
}

// alone sends c, with whatever was queued meanwhile, on w's connection,
// by the caller's own goroutine, and frees the connection. c is done when
// it returns.
func (r *Store) alone(w *worker, c *call) {
	w.batch = append(w.batch[:0], c)
	r.gatherMore(w)
	r.run(w, c.deadline)
	r.free(w)
	<-c.done // run completed c: it is in no one else's hands
}

// handOn wakes the relay if calls are queued. Whoever frees a connection
// calls it after freeing it, and a caller queues before looking for a free
// connection, so no call is left queued with no one to send it.
func (r *Store) handOn() {
	if len(r.queue) > 0 {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// relay sends what callers left queued, while a connection is free.
func (r *Store) relay() {
	defer r.wg.Done()
	for {
		select {
		case <-r.kick:
		case <-r.stop:
			return
		}
		for len(r.queue) > 0 {
			w := r.slots.take()
			if w == nil {
				break // a sender has the connections; it hands on when done
			}
			r.gather(w)
			if len(w.batch) > 0 {
				r.run(w, time.Time{})
			}
			r.free(w)
		}
	}
}

// gather takes what is queued, up to MaxBatch calls, into w.batch; it
// never waits for more to come.
func (r *Store) gather(w *worker) {
	w.batch = w.batch[:0]
	r.gatherMore(w)
}

// gatherMore is gather after what w.batch already holds.
func (r *Store) gatherMore(w *worker) {
	for len(w.batch) < r.batch {
		select {
		case c := <-r.queue:
			w.batch = append(w.batch, c)
		default:
			return
		}
	}
}

// run sends one batch and completes its calls. Its deadline is due, or, if
// due is zero, the latest of its calls'.
func (r *Store) run(w *worker, due time.Time) {
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
	// One deadline for the batch. A call whose own budget passes first is
	// abandoned by its caller; the batch goes on for the others.
	if !due.IsZero() {
		deadline = due
	}
	if r.cluster != nil {
		// A context that is done at the deadline: a dial or a pool wait for
		// a primary that just died must end within the budget, or it holds
		// the worker, and the batches of the healthy primaries behind it.
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		r.runCluster(ctx, w, live)
		return
	}
	// One call on one connection: its deadline is all the context it
	// needs, and the worker's own costs no allocation and no timer.
	w.deadline.at = deadline
	ctx := &w.deadline
	w.parts = w.parts[:0]
	for _, c := range live {
		w.parts = append(w.parts, &c.parts[0])
	}
	w.blob = r.appendBatch(w.blob[:0], w, 0)
	var err error
	if r.direct != nil {
		err = r.evalWire(w, deadline)
	} else {
		err = r.evalRaw(ctx, w)
	}
	if err == nil {
		err = r.parseReply(w.body, w.parts, false)
	}
	err = classify(err)
	for _, c := range live {
		if err == nil {
			c.admitted = c.parts[0].admitted
		}
		if c.async != nil {
			r.completeLater(w, c, err)
			continue
		}
		r.complete(c, err)
	}
}

// completeLater completes an asynchronous call of w's batch as complete
// does, and keeps its outcome in w.told, for free to tell.
func (r *Store) completeLater(w *worker, c *call, err error) {
	c.err = err
	if !c.state.CompareAndSwap(callSent, callDone) {
		r.calls.Put(c) // abandoned: its timer told it
		return
	}
	if err == nil {
		copy(c.out, c.res[:c.n])
	}
	w.told = append(w.told, told{c.async, c.admitted, err})
	r.release(c, c.expiry.Stop())
}

// deadlineCtx is a context with a deadline and nothing else: no timer
// cancels it, so it can be reused. It suits a single call on a client
// that applies the deadline to the connection (ContextTimeoutEnabled).
type deadlineCtx struct{ at time.Time }

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.at, true }
func (c *deadlineCtx) Done() <-chan struct{}       { return nil }
func (c *deadlineCtx) Err() error                  { return nil }
func (c *deadlineCtx) Value(any) any               { return nil }

// classify wraps a decision's error, marking those that mean nothing was
// sent.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, algo.ErrUnreachable) {
		return fmt.Errorf("redis decide: %w", err)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, goredis.ErrPoolTimeout) || notExecuted(err) {
		return fmt.Errorf("redis decide: %w: %w", algo.ErrUnreachable, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, context.DeadlineExceeded) {
		// The batch's deadline passed on the wire: the same budget as
		// the caller's.
		return fmt.Errorf("redis decide: %w: %w", context.DeadlineExceeded, err)
	}
	return fmt.Errorf("redis decide: %w", err)
}

// evalRaw runs decide.lua with w.blob on a standalone or Sentinel client,
// by its digest, falling back to its source if Redis lost its script cache
// (a restart or a failover), and points w.body at the script's reply: the
// raw reply goes into a buffer the worker reuses, so a batch allocates
// little.
func (r *Store) evalRaw(ctx context.Context, w *worker) error {
	w.args = [4]any{"evalsha", r.decideSHAArg, 0, w}
	for try := 0; try < 2; try++ {
		if try == 1 {
			w.args[0], w.args[1] = "eval", r.decideSrcArg
		}
		w.reply.Reset()
		if err := r.client.Process(ctx, goredis.NewRawWriteToCmd(ctx, &w.reply, w.args[:]...)); err != nil {
			return err
		}
		b := w.reply.Bytes()
		if len(b) > 0 && b[0] == '-' {
			msg := string(bytes.TrimRight(b[1:], "\r\n"))
			if strings.HasPrefix(msg, "NOSCRIPT") {
				continue
			}
			return errors.New(msg)
		}
		if len(b) > 0 && b[0] == ':' {
			w.body = b // one admitted rule, as an integer: parseReply reads the line
			return nil
		}
		var err error
		w.body, err = bulk(b)
		return err
	}
	return errors.New("NOSCRIPT after loading the script")
}

// bulk returns the payload of a RESP bulk string, all of b.
func bulk(b []byte) ([]byte, error) {
	n, rest, err := respLine(b, '$')
	if err != nil {
		return nil, err
	}
	if n < 0 || int64(len(rest)) != n+2 || !bytes.HasSuffix(rest, crlf) {
		return nil, fmt.Errorf("reply is not one string of %d bytes: %.40q", n, b)
	}
	return rest[:n], nil
}

// respLine reads one RESP line of the given type holding an integer.
func respLine(b []byte, typ byte) (int64, []byte, error) {
	end := bytes.Index(b, crlf)
	if end < 2 || b[0] != typ {
		return 0, nil, fmt.Errorf("reply is not as decide.lua writes it: %.40q", b)
	}
	neg, digits := false, b[1:end]
	if digits[0] == '-' {
		neg, digits = true, digits[1:]
	}
	var v int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, nil, fmt.Errorf("reply has a bad integer %.40q", b[:end])
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, b[end+2:], nil
}

var crlf = []byte("\r\n")

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, goredis.ErrNoScript) || goredis.HasErrorPrefix(err, "NOSCRIPT"))
}

// appendBatch appends the decide.lua argument for w.parts: for a call of
// one request of one rule (not sliding_window_log) with no refund tokens,
// the shape of every call at low load, the one-rule layout, which costs
// Redis less to read; otherwise the batch. With r.general set, the batch as
// the previous release's script reads it: without its three zero bytes,
// and never the one-rule layout.
func (r *Store) appendBatch(dst []byte, w *worker, flags byte) []byte {
	pinned := -1.0
	if r.clock != nil {
		pinned = float64(algo.SinceEpoch(r.clock()))
	}
	if !r.general {
		if flags == 0 && len(w.parts) == 1 {
			if p := w.parts[0]; len(p.ids) == 1 {
				if pol := r.policy(p.ids[0]); pol.Params().Algorithm != algo.SlidingWindowLog {
					return appendLean(dst, p.buf, pinned, r.clock != nil, pol)
				}
			} else if r.flat(p) {
				return r.appendFlat(dst, p, pinned)
			}
		}
		dst = append(dst, scripts.BatchLayout, 0, 0)
	}
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(pinned))
	nreqAt := len(dst)
	dst = append(dst, 0, 0)
	npolAt := len(dst)
	dst = append(dst, 0, 0, flags)
	w.gen++
	npol := 0
	for _, p := range w.parts {
		for _, id := range p.ids {
			for int(id) >= len(w.seen) {
				w.seen = append(w.seen, 0)
				w.place = append(w.place, 0)
			}
			if w.seen[id] == w.gen {
				continue
			}
			w.seen[id], w.place[id] = w.gen, uint16(npol)
			npol++
			dst = appendDecideParams(dst, r.policy(id))
		}
	}
	binary.LittleEndian.PutUint16(dst[npolAt:], uint16(npol))
	nreq := 0
	for i := 0; i < len(w.parts); i = requestEnd(w.parts, i) {
		// One request: its parts side by side (a primary's call of several
		// slots), their rules after one count and id.
		end := requestEnd(w.parts, i)
		head := len(dst)
		dst = append(dst, w.parts[i].buf[:partHead]...)
		for _, p := range w.parts[i:end] {
			at := len(dst) - partHead
			dst = append(dst, p.buf[partHead:]...)
			for j, id := range p.ids {
				binary.LittleEndian.PutUint16(dst[at+p.idAt[j]:], w.place[id])
			}
			if p != w.parts[i] {
				dst[head] += p.buf[0]
			}
		}
		nreq++
	}
	binary.LittleEndian.PutUint16(dst[nreqAt:], uint16(nreq))
	return dst
}

// partHead is the length of a part's buf before its rules: the number of
// rules and the request's id.
const partHead = 1 + 8

// requestEnd returns the end of the parts of the request whose first part
// is parts[i]: a primary's call of several slots holds a request's parts
// there side by side, and decides them as one request; any other call holds
// one part of a request.
func requestEnd(parts []*part, i int) int {
	j := i + 1
	for j < len(parts) && parts[j].c == parts[i].c {
		j++
	}
	return j
}

// Where the rule of a part of one request is in its buf (see part).
const (
	oneShadowAt = 1 + 8 + 2
	oneCostAt   = oneShadowAt + 1
	oneKeyAt    = oneCostAt + 8 // the key's length, then the key
)

// appendLean appends decide.lua's argument in the one-rule layout for a
// part (buf) of one request of one rule of policy p: [B] algorithm, [H] key
// length and the key, [d] limit, [d] window, [d] max cost, [B] flags (1
// shadow, 2 a pinned time follows), [d] cost, for a bucket [d] burst and
// [d] delay, and with flag 2 [d] the time.
func appendLean(dst, buf []byte, now float64, pinned bool, pol *algo.Policy) []byte {
	p := pol.Params()
	dst = append(dst, byte(p.Algorithm))
	dst = append(dst, buf[oneKeyAt:]...)
	for _, v := range [...]int64{p.Limit, p.Window, p.MaxCost} {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(v)))
	}
	flags := buf[oneShadowAt]
	if pinned {
		flags |= scripts.FlagPinnedTime
	}
	dst = append(dst, flags)
	dst = append(dst, buf[oneCostAt:oneKeyAt]...)
	if p.Algorithm.UsesBurst() {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(p.Burst)))
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(p.Delay)))
	}
	if pinned {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(now))
	}
	return dst
}

// flat reports whether a part of one request is sent in the flat layout:
// several rules, none of them sliding_window_log.
func (r *Store) flat(p *part) bool {
	if len(p.ids) < 2 {
		return false
	}
	for _, id := range p.ids {
		if r.policy(id).Params().Algorithm == algo.SlidingWindowLog {
			return false
		}
	}
	return true
}

// appendFlat appends decide.lua's argument in the flat layout for a part of
// one request of several rules: [B] 7, [H] 0, [d] the time (or -1), [d] the
// number of rules, then per rule [B] algorithm, [B] shadow, [d] limit,
// [d] window, [d] burst, [d] delay, [d] max cost, [d] cost, then per rule
// [H] key length and the key.
func (r *Store) appendFlat(dst []byte, p *part, now float64) []byte {
	dst = append(dst, scripts.FlatLayout, 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(now))
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(len(p.ids))))
	for j, id := range p.ids {
		pp := r.policy(id).Params()
		dst = append(dst, byte(pp.Algorithm), p.buf[p.idAt[j]+2])
		dst = appendNumbers(dst, &pp)
		dst = append(dst, p.buf[p.idAt[j]+3:p.idAt[j]+11]...)
	}
	for j := range p.ids {
		end := len(p.buf)
		if j+1 < len(p.idAt) {
			end = p.idAt[j+1]
		}
		dst = append(dst, p.buf[p.idAt[j]+11:end]...)
	}
	return dst
}

// appendDecideParams appends the policy's entry of decide.lua's policy
// table.
func appendDecideParams(dst []byte, p *algo.Policy) []byte {
	pp := p.Params()
	dst = append(dst, byte(pp.Algorithm))
	return appendNumbers(dst, &pp)
}

// appendNumbers appends a policy's numbers as the scripts read them, each
// a little-endian double: limit, window, burst, delay, max cost.
func appendNumbers(dst []byte, p *algo.Params) []byte {
	for _, v := range [...]int64{p.Limit, p.Window, p.Burst, p.Delay, p.MaxCost} {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(v)))
	}
	return dst
}

// micros converts the scripts' microseconds to a Duration.
func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// whole reads a number of decide.lua's reply, towards zero, as Redis casts
// a Lua number to an integer.
func whole(b []byte) int64 { return int64(math.Float64frombits(binary.LittleEndian.Uint64(b))) }

// appendParams appends the policy's entry of refund.lua's policy table.
func appendParams(dst []byte, p *algo.Policy, id uint16) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, id)
	return appendDecideParams(dst, p)
}

// The sizes of a rule's answer in decide.lua's reply: allowed and reason,
// then four numbers, and a refund token if asked for.
const (
	ruleReply      = 2 + 4*8
	ruleReplyToken = ruleReply + 8
)

// parseReply reads decide.lua's reply into the parts' calls' results: the
// string decide.lua answers, or, for a call of one request of one rule that
// it admitted, the integer it answers instead, as its RESP line (":n").
func (r *Store) parseReply(b []byte, parts []*part, tokens bool) error {
	if len(b) > 0 && b[0] == ':' {
		// remaining + (capacity + 1) * reset after
		v, rest, err := respLine(b, ':')
		if err != nil {
			return err
		}
		if len(rest) != 0 || len(parts) != 1 || len(parts[0].ids) != 1 || v < 0 {
			return fmt.Errorf("reply is an integer, %d, for %d requests", v, len(parts))
		}
		p := parts[0]
		capacity := r.policy(p.ids[0]).Capacity()
		p.admitted = true
		p.c.res[p.idx[0]] = algo.Result{Allowed: true, Limit: capacity, Remaining: v % (capacity + 1), ResetAfter: micros(v / (capacity + 1))}
		return nil
	}
	per := ruleReply
	if tokens {
		per = ruleReplyToken
	}
	if len(b) > 0 && b[0] == scripts.FlatReply {
		// A request of several rules (the flat layout) that every rule
		// admitted with no delay: [B] 3, then per rule [d] remaining,
		// [d] reset after.
		if len(parts) != 1 || len(b) != 1+16*len(parts[0].ids) {
			return errors.New("reply is not a flat admission")
		}
		p := parts[0]
		p.admitted = true
		for j, id := range p.ids {
			p.c.res[p.idx[j]] = algo.Result{Allowed: true, Limit: r.policy(id).Capacity(), Remaining: whole(b[1+16*j:]), ResetAfter: micros(whole(b[9+16*j:]))}
		}
		return nil
	}
	for i := 0; i < len(parts); i = requestEnd(parts, i) {
		if end := requestEnd(parts, i); end > i+1 {
			// One request of several parts (see appendBatch): admitted as
			// one, then its parts' rules in order.
			rules := 0
			for _, p := range parts[i:end] {
				rules += len(p.ids)
			}
			if len(b) < 1+per*rules {
				return errors.New("reply is short")
			}
			for _, p := range parts[i:end] {
				p.admitted = b[0] == 1
			}
			b = b[1:]
			for _, p := range parts[i:end] {
				var err error
				if b, err = r.parseRules(b, p, per, tokens); err != nil {
					return err
				}
			}
			continue
		}
		p := parts[i]
		if len(b) > 0 && b[0] == scripts.LeanReply {
			// A request of one rule that it admitted with no delay: [B] 2,
			// [d] remaining, [d] reset after.
			if len(b) < 17 || len(p.ids) != 1 {
				return errors.New("reply is short")
			}
			p.admitted = true
			p.c.res[p.idx[0]] = algo.Result{Allowed: true, Limit: r.policy(p.ids[0]).Capacity(), Remaining: whole(b[1:]), ResetAfter: micros(whole(b[9:]))}
			b = b[17:]
			continue
		}
		if len(b) < 1+per*len(p.ids) {
			return errors.New("reply is short")
		}
		p.admitted = b[0] == 1
		var err error
		if b, err = r.parseRules(b[1:], p, per, tokens); err != nil {
			return err
		}
	}
	if len(b) != 0 {
		return fmt.Errorf("reply has %d bytes too many", len(b))
	}
	return nil
}

// parseRules reads the replies of a part's rules, per bytes each, from b
// and returns the rest.
func (r *Store) parseRules(b []byte, p *part, per int, tokens bool) ([]byte, error) {
	num := func(b []byte, i int) int64 { return whole(b[2+8*i:]) }
	for j, id := range p.ids {
		c := r.policy(id)
		res := algo.Result{
			Allowed:    b[0] == 1,
			Reason:     algo.Reason(b[1]),
			Limit:      c.Capacity(),
			Remaining:  num(b, 0),
			ResetAfter: micros(num(b, 1)),
			RetryAfter: micros(num(b, 2)),
			Delay:      micros(num(b, 3)),
		}
		if res.Reason > algo.ReasonCostTooHigh {
			return nil, fmt.Errorf("reply has unknown reason %d", b[1])
		}
		if tokens {
			p.tokens[j] = float64(num(b, 4))
		}
		p.c.res[p.idx[j]] = res
		b = b[per:]
	}
	return b, nil
}
