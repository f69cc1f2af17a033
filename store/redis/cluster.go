package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/scripts"
)

// runCluster sends a batch as one decide.lua call per primary, all at
// once: the requests of every slot the primary serves, in the client's
// view of the slots, its first slot's keys declared (decide.lua's flag 2).
// Should a slot have moved, or be migrating with a key gone, the call
// answers TRYAGAIN before deciding anything, and its requests go again one
// call each, where Redis's redirections lead (see evalSlots). Requests
// whose primary the client does not know go one call per slot. A call
// completes as soon as the primaries holding its slots have answered: a
// primary that fails or stalls holds up, and fails, only the requests with
// keys on it. A request that spans slots of one primary is one request of
// that primary's call, decided there all or nothing; one that spans
// primaries is settled when all of them have answered (refunding those that
// admitted it if another did not). The calls, their arguments and their
// grouping live in the worker and are reused batch after batch.
func (r *Store) runCluster(ctx context.Context, w *worker, live []*call) {
	cw := &w.cluster
	cw.reset()
	for _, c := range live {
		c.pending.Store(int32(len(c.parts)))
		for i := range c.parts {
			p := &c.parts[i]
			sc := cw.slotCall(p.slot)
			sc.parts = append(sc.parts, p)
			sc.keys = p.appendKeys(sc.keys)
		}
	}
	for i := range cw.calls {
		sc := &cw.calls[i]
		sc.shard = r.shardOf(sc.slot)
		for _, p := range sc.parts {
			p.shard = sc.shard
		}
		cw.add(sc)
	}
	if cap(cw.merged) < len(cw.byShard) {
		cw.merged = make([]slotCall, 0, len(cw.byShard)) // no growing: byShard points into it
	}
	for i, calls := range cw.byShard {
		if i == 0 || len(calls) < 2 || r.general {
			// No primary known (i == 0), a lone slot, or the previous
			// release's script, which reads no flag 2.
			for _, sc := range calls {
				w.parts = sc.parts
				sc.blob = r.appendBatch(sc.blob[:0], w, scripts.FlagRefundTokens)
			}
			continue
		}
		var m *slotCall
		cw.merged, m = extend(cw.merged)
		m.slot, m.shard = calls[0].slot, calls[0].shard
		m.keys = append(m.keys, calls[0].keys...)
		for _, sc := range calls {
			for _, p := range sc.parts {
				m.parts = appendRequest(m.parts, p)
			}
		}
		w.parts = m.parts
		m.blob = r.appendBatch(m.blob[:0], w, scripts.FlagRefundTokens|scripts.FlagSlots)
		clear(calls)
		cw.byShard[i] = append(calls[:0], m)
	}
	// One goroutine per primary but the last, whose calls go from here.
	var last []*slotCall
	for _, calls := range cw.byShard {
		if len(calls) == 0 {
			continue
		}
		if last != nil {
			cw.wg.Add(1)
			go func(calls []*slotCall) {
				defer cw.wg.Done()
				r.evalSlots(ctx, r.decideSHAArg, r.decideSrcArg, calls, r.split, r.decided)
			}(last)
		}
		last = calls
	}
	if last != nil {
		r.evalSlots(ctx, r.decideSHAArg, r.decideSrcArg, last, r.split, r.decided)
	}
	cw.wg.Wait()
}

// appendRequest appends to a primary's call the parts of p's request on
// that primary, together, when p is the first of them; so that the call
// decides the request as one, all or nothing across its slots (see
// appendBatch), and refunds nothing on that primary if another of its rules
// there denies.
func appendRequest(parts []*part, p *part) []*part {
	if len(p.c.parts) == 1 {
		return append(parts, p)
	}
	for i := range p.c.parts {
		q := &p.c.parts[i]
		if q == p {
			break
		}
		if q.shard == p.shard {
			return parts // appended with the first
		}
	}
	for i := range p.c.parts {
		if q := &p.c.parts[i]; q.shard == p.shard {
			parts = append(parts, q)
		}
	}
	return parts
}

// settleSlot settles a slot call of decide.lua, and each call of the batch
// once all its slots have answered. r.decided is it, bound once.
func (r *Store) settleSlot(sc *slotCall) {
	r.settle(sc)
	for _, p := range sc.parts {
		if p.c.pending.Add(-1) == 0 {
			r.settleCall(p.c) // p.c may be reused from here on
		}
	}
}

// clusterWork is a worker's reusable memory for a cluster batch: one slot
// call per slot, the calls grouped by primary, and a call per primary of
// several slots.
type clusterWork struct {
	calls   []slotCall
	bySlot  map[uint16]int // index in calls
	byShard [][]*slotCall  // by shard + 1 (shard -1: no primary known)
	merged  []slotCall     // a primary's slots in one call
	wg      sync.WaitGroup // the primaries' goroutines
}

func (cw *clusterWork) reset() {
	for _, calls := range []*[]slotCall{&cw.calls, &cw.merged} {
		for i := range *calls {
			sc := &(*calls)[i]
			clear(sc.parts) // nothing of past batches kept alive
			clear(sc.keys)
			clear(sc.args)
			sc.reply.Reset()
			*sc = slotCall{parts: sc.parts[:0], keys: sc.keys[:0], blob: sc.blob, args: sc.args[:0], reply: sc.reply}
		}
		*calls = (*calls)[:0]
	}
	for i := range cw.byShard {
		clear(cw.byShard[i])
		cw.byShard[i] = cw.byShard[i][:0]
	}
	if cw.bySlot == nil {
		cw.bySlot = map[uint16]int{}
	}
	clear(cw.bySlot)
}

// slotCall returns the batch's call for slot s, adding it if needed.
func (cw *clusterWork) slotCall(s uint16) *slotCall {
	if i, ok := cw.bySlot[s]; ok {
		return &cw.calls[i]
	}
	cw.bySlot[s] = len(cw.calls)
	var sc *slotCall
	cw.calls, sc = extend(cw.calls)
	sc.slot = s
	return sc
}

// add lists sc under its primary. Only once every slot call exists: the
// list holds pointers into calls.
func (cw *clusterWork) add(sc *slotCall) {
	i := sc.shard + 1
	for i >= len(cw.byShard) {
		cw.byShard = append(cw.byShard, nil)
	}
	cw.byShard[i] = append(cw.byShard[i], sc)
}

// settleCall completes a call whose parts have all answered: admitted if
// every part admitted it; if not, the parts that admitted it are refunded,
// by its caller before it answers (see refundNow), or, if the caller has
// given up, in the background.
func (r *Store) settleCall(c *call) {
	c.err, c.admitted = callError(c), true
	for i := range c.parts {
		c.admitted = c.admitted && c.parts[i].err == nil && c.parts[i].admitted
	}
	var lost []refund
	if !c.admitted {
		lost = r.undo(c, nil)
	}
	c.lost = lost
	// The refunds are owed before the caller hears its answer, so that
	// whoever waits for them after an answer waits for these too.
	if len(lost) > 0 {
		r.owed.Add(1)
	}
	if !r.complete(c, c.err) && len(lost) > 0 { // c may be reused from here on
		r.queueRefunds(lost)
	}
}

// refundNow applies a denied request's refunds before its caller answers,
// so that a client told no finds its other rules as they were before the
// request: each slot gets one attempt, within a budget of its own. At most
// refundConns callers do so at once, so that a flood of such denials holds
// no more connections than that, never those the batches need; a caller
// that finds no turn within the budget leaves its refunds to the background
// loop, as it does those that surely did not run. It settles one owed
// refund.
func (r *Store) refundNow(rs []refund) {
	budget := r.timeout
	if budget <= 0 {
		budget = time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	select {
	case r.refundN <- struct{}{}:
		rs, _ = r.refundOnce(ctx, rs)
		<-r.refundN
	case <-ctx.Done():
	}
	if len(rs) > 0 {
		r.owed.Add(1)
		r.queueRefunds(rs)
	}
	r.owed.Done()
}

// refundConns is how many callers may apply refunds at once, each on a
// connection of its own (with one more for the background loop).
const refundConns = 2

// queueRefunds hands owed refunds to the background loop, which settles
// them.
func (r *Store) queueRefunds(rs []refund) {
	select {
	case r.refunds <- rs:
	case <-r.stop:
		r.onLost(len(rs), errClosed)
		r.owed.Done()
	}
}

// notExecuted reports whether Redis refused a call before running it, for
// a moment: a slot's keys split by a migration (TRYAGAIN), a cluster or a
// primary down, a server loading or read-only. Such a call can be sent
// again, and if it never runs, nothing was decided.
func notExecuted(err error) bool {
	if err == nil {
		return false
	}
	for _, p := range []string{"TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY"} {
		if goredis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// split makes one call per part of sc, each on its own slot's keys.
func (r *Store) split(sc *slotCall) []*slotCall {
	if len(sc.parts) == 1 && sc.parts[0].slot == sc.slot {
		return []*slotCall{sc}
	}
	out := make([]*slotCall, len(sc.parts))
	for i, p := range sc.parts {
		w := worker{parts: []*part{p}}
		out[i] = &slotCall{parts: w.parts, blob: r.appendBatch(nil, &w, scripts.FlagRefundTokens), keys: p.appendKeys(nil), slot: p.slot, shard: p.shard}
	}
	return out
}

// settle reads a settled call's reply, or its error, into its parts.
func (r *Store) settle(sc *slotCall) {
	err := sc.err
	if err == nil {
		var body []byte
		if body, err = bulk(sc.reply.Bytes()); err == nil {
			err = r.parseReply(body, sc.parts, true)
		}
	}
	if err != nil {
		if notExecuted(err) {
			err = fmt.Errorf("redis decide: %w: %w", algo.ErrUnreachable, err)
		} else {
			err = classify(err)
		}
		for _, p := range sc.parts {
			p.err = err
		}
	}
}

// callError is a call's error from its parts': none if every part was
// decided; else, with the shards that failed, the most doubtful: a call
// that may have run (a timeout, an error) over one that surely did not
// (unreachable).
func callError(c *call) error {
	var worst error
	var shards []int
	for i := range c.parts {
		p := &c.parts[i]
		if p.err == nil {
			continue
		}
		shards = append(shards, p.shard)
		if worst == nil || errors.Is(worst, algo.ErrUnreachable) && !errors.Is(p.err, algo.ErrUnreachable) {
			worst = p.err
		}
	}
	if worst == nil {
		return nil
	}
	return &algo.ShardError{Shards: shards, Err: worst}
}

// undo collects the refunds of a request that is not admitted but that
// some of its slots admitted, and shows those slots' rules as unconsumed.
func (r *Store) undo(c *call, rs []refund) []refund {
	for i := range c.parts {
		p := &c.parts[i]
		if !p.admitted {
			continue
		}
		for j, id := range p.ids {
			res := &c.res[p.idx[j]]
			if !res.Allowed {
				continue // a shadow rule that denied consumed nothing
			}
			cost := p.costs[j]
			rs = append(rs, refund{id: id, cost: cost, key: string(p.key(j)), token: p.tokens[j], request: c.id, slot: p.slot})
			res.Remaining = min(res.Remaining+cost, res.Limit)
			res.Delay = 0
		}
	}
	return rs
}

// refund is one rule's consumption to take back.
type refund struct {
	id      uint16 // the policy's
	cost    int64
	key     string
	token   float64
	request float64 // the request's id
	slot    uint16
}

// errNotApplied says a refund found its state rewritten since.
var errNotApplied = errors.New("redis refund: the state was rewritten since the decision")

// refundLoop applies in the background the refunds of callers that gave
// up, and retries those whose first attempt surely did not run, so that a
// refund whose slot is moving or whose primary is failing over still
// happens; what cannot be applied is reported to OnRefundLost.
func (r *Store) refundLoop() {
	defer r.wg.Done()
	for {
		select {
		case rs := <-r.refunds:
			r.applyRefunds(rs)
			r.owed.Done()
		case <-r.stop:
			for {
				select {
				case rs := <-r.refunds:
					r.onLost(len(rs), errClosed)
					r.owed.Done()
				default:
					return
				}
			}
		}
	}
}

func (r *Store) applyRefunds(rs []refund) {
	var err error
	for attempt := 0; attempt < 5 && len(rs) > 0; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(min(100*time.Millisecond<<attempt, time.Second)):
			case <-r.stop:
				r.onLost(len(rs), errClosed)
				return
			}
			r.cluster.ReloadState(context.Background())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		rs, err = r.refundOnce(ctx, rs)
		cancel()
	}
	if len(rs) > 0 {
		r.onLost(len(rs), err)
	}
}

// refundOnce runs refund.lua once per slot and returns the refunds that
// surely did not run (see classify), to retry. One that failed after it
// was sent may have run: sending it again could refund it twice, handing
// its client back more than the denied request took, so it is reported
// lost instead.
func (r *Store) refundOnce(ctx context.Context, rs []refund) ([]refund, error) {
	groups := map[uint16][]refund{}
	var calls []*slotCall
	for _, f := range rs {
		if _, ok := groups[f.slot]; !ok {
			calls = append(calls, &slotCall{slot: f.slot})
		}
		groups[f.slot] = append(groups[f.slot], f)
	}
	for _, sc := range calls {
		sc.blob, sc.keys = r.appendRefunds(groups[sc.slot])
	}
	var failed []refund
	var errs []error
	r.evalSlots(ctx, r.refundSHA, scripts.Refund, calls, nil, func(sc *slotCall) {
		err := sc.err
		n := 0
		if err == nil {
			var v int64
			v, _, err = respLine(sc.reply.Bytes(), ':')
			n = int(v)
		}
		switch {
		case err != nil && errors.Is(classify(err), algo.ErrUnreachable):
			failed = append(failed, groups[sc.slot]...)
			errs = append(errs, err)
		case err != nil:
			r.onLost(len(groups[sc.slot]), err)
		case n < len(groups[sc.slot]):
			r.onLost(len(groups[sc.slot])-n, errNotApplied)
		}
	})
	return failed, errors.Join(errs...)
}

// appendRefunds builds refund.lua's argument and keys for refunds of one
// slot.
func (r *Store) appendRefunds(rs []refund) ([]byte, []keyArg) {
	pinned := -1.0
	if r.clock != nil {
		pinned = float64(algo.SinceEpoch(r.clock()))
	}
	b := binary.LittleEndian.AppendUint64(nil, math.Float64bits(pinned))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(rs)))
	npolAt := len(b)
	b = append(b, 0, 0)
	seen := map[uint16]bool{}
	for _, f := range rs {
		if !seen[f.id] {
			seen[f.id] = true
			b = appendParams(b, r.policy(f.id), f.id)
		}
	}
	binary.LittleEndian.PutUint16(b[npolAt:], uint16(len(seen)))
	keys := make([]keyArg, 0, len(rs))
	for _, f := range rs {
		b = binary.LittleEndian.AppendUint16(b, f.id)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(f.cost)))
		b = binary.LittleEndian.AppendUint16(b, uint16(len(f.key)))
		b = append(b, f.key...)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f.token))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f.request))
		keys = append(keys, keyArg(f.key))
	}
	return b, keys
}

// Shards appends to dst the numbers of the parts of Redis that decide
// reqs, each once: in a cluster, the primaries that serve their slots, as
// the client last learned them; otherwise 0. A guard keeps a circuit breaker
// per shard, so that one failing primary does not send every decision to
// the fail mode.
func (r *Store) Shards(dst []int, reqs []algo.Request) []int {
	if r.cluster == nil {
		return append(dst, 0)
	}
	for i := range reqs {
		n := r.shardOf(slot(reqs[i].Key))
		found := false
		for _, d := range dst {
			found = found || d == n
		}
		if !found {
			dst = append(dst, n)
		}
	}
	return dst
}

// slotKeys holds, per cluster slot, a short key that hashes to it, so that
// the client's routing can be asked about a slot without building a key.
type slotKeys [16384]string

func newSlotKeys() *slotKeys {
	var k slotKeys
	left := len(k)
	for n := 0; left > 0; n++ {
		s := strconv.Itoa(n)
		if h := slot([]byte(s)); k[h] == "" {
			k[h] = s
			left--
		}
	}
	return &k
}

// shardOf returns the shard number of the primary serving the slot, or -1
// if the client does not know one.
func (r *Store) shardOf(s uint16) int {
	c, err := r.cluster.MasterForKey(context.Background(), r.slotKey(s))
	if err != nil {
		return -1
	}
	addr := c.Options().Addr
	r.nodeMu.RLock()
	n, ok := r.nodes[addr]
	r.nodeMu.RUnlock()
	if ok {
		return n
	}
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	if n, ok := r.nodes[addr]; ok {
		return n
	}
	n = len(r.nodeAddrs)
	r.nodes[addr] = n
	r.nodeAddrs = append(r.nodeAddrs, addr)
	return n
}

// Probe reports whether a shard (see Shards) can decide again: without a
// cluster, Warm; in a cluster, the shard's primary loads the scripts and
// makes one decision on a slot it serves, within the budget, which reads a
// key under the prefix and writes nothing. So a primary that answers but
// cannot decide (the cluster down, a slot it no longer serves, a user
// denied the prefix) keeps its circuit open, as a dead one does. A failed probe has the client
// reload the cluster's layout, so that routing learns of a failover. A
// shard that serves no slot in the client's layout any more (its primary
// failed over, or gave its slots away) can decide again: nothing goes to it.
func (r *Store) Probe(ctx context.Context, shard int) error {
	if r.cluster == nil {
		return r.Warm(ctx)
	}
	err := r.probeShard(ctx, shard)
	if err != nil {
		r.cluster.ReloadState(ctx)
	}
	return err
}

func (r *Store) probeShard(ctx context.Context, shard int) error {
	r.nodeMu.RLock()
	var addr string
	if shard >= 0 && shard < len(r.nodeAddrs) {
		addr = r.nodeAddrs[shard]
	}
	r.nodeMu.RUnlock()
	if addr == "" {
		return fmt.Errorf("redis probe: no primary known for shard %d", shard)
	}
	s, c, ok := r.slotServedBy(ctx, addr)
	if !ok {
		return nil
	}
	if err := loadScripts(ctx, c); err != nil {
		return fmt.Errorf("redis probe: %w", err)
	}
	sc, err := r.probeCall(ctx, []byte(r.slotKey(s)))
	if err != nil {
		return err
	}
	ctx, cancel := r.withinBudget(ctx)
	defer cancel()
	r.pipeline(ctx, c, r.decideSHAArg, r.decideSrcArg, []*slotCall{sc})
	if sc.last != nil {
		return fmt.Errorf("redis probe: decision on slot %d at %s: %w", s, addr, sc.last)
	}
	return nil
}

// slotServedBy returns a slot that the client believes the primary at addr
// serves, and the primary's client; ok is false if it serves none.
func (r *Store) slotServedBy(ctx context.Context, addr string) (s uint16, c *goredis.Client, ok bool) {
	for i := range 16384 {
		s = uint16(i)
		m, err := r.cluster.MasterForKey(ctx, r.slotKey(s))
		if err == nil && m.Options().Addr == addr {
			return s, m, true
		}
	}
	return 0, nil, false
}
