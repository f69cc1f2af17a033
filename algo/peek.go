package algo

import (
	"context"
	"fmt"
	"time"
)

// peekName names the policy Peek decides beside each request, so that the
// decision denies and consumes nothing. Its key is never written.
const peekName = "authlimit-peek"

// Peek reports what d would decide for reqs, consuming nothing: each
// request's result is its rule's answer with the counts that stand
// (Remaining before the request's cost is taken), and the bool whether the
// whole request would be admitted. Every store decides with the same
// meaning, so Peek works for every algorithm on every store without a
// store of its own: each rule is decided on its own beside a policy that
// never admits (cost 2 under a limit of 1) keyed by the same tag, so that
// the decision is all or nothing within one key tag (one Redis Cluster
// slot, no refund), denies, and writes nothing. The never-admitting
// policy's key is never written.
func Peek(ctx context.Context, d Decider, reqs []Request, res []Result) (bool, error) {
	if len(res) < len(reqs) {
		return false, fmt.Errorf("peek: %d results for %d requests: %w", len(res), len(reqs), ErrInvalid)
	}
	never, err := NewPolicy(Spec{Name: peekName, Algorithm: FixedWindow, Limit: 1, Window: time.Second})
	if err != nil {
		return false, fmt.Errorf("peek: %w", err)
	}
	admitted := true
	var pair [2]Request
	var out [2]Result
	for i, q := range reqs {
		pair[0] = q
		pair[0].Shadow = false
		pair[1] = Request{Policy: never, Key: q.Key, Cost: 2}
		if _, err := d.Decide(ctx, pair[:], out[:]); err != nil {
			return false, fmt.Errorf("peek %s: %w", q.Policy.Name(), err)
		}
		res[i] = out[0]
		if !out[0].Allowed && !q.Shadow {
			admitted = false
		}
	}
	return admitted, nil
}

// Reset forgets the state of each request's policy for its key, as if it
// had never been decided: the next decision starts afresh.
func (m *Memory) Reset(ctx context.Context, reqs []Request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for i := range reqs {
		q := &reqs[i]
		if q.Policy == nil || !ValidTag(q.Key) {
			return fmt.Errorf("memory reset: request %d: %w", i, ErrInvalid)
		}
		var k memKey
		sh := &m.shards[m.makeKey(&k, q)]
		// The state's item in the shard's expiry heap stays: found
		// without its state, it is dropped and counts nothing.
		sh.mu.Lock()
		removed := false
		if _, ok := sh.logs[k.h]; ok {
			delete(sh.logs, k.h)
			removed = true
		} else if _, ok := sh.m[k.h]; ok {
			delete(sh.m, k.h)
			removed = true
		}
		if removed {
			m.keys.Add(-1)
			sh.deleted++
		}
		sh.mu.Unlock()
	}
	return nil
}
