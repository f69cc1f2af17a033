package guard

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"time"

	"github.com/authlimit/authlimit/algo"
)

// denyCache remembers, per policy and key, a denial and how long it holds: a
// request of at least the same cost cannot pass before its retry-after, so
// until then it is denied here without asking the store. This keeps a flood
// from one client off Redis. An entry is kept at most maxHold, so that the
// store is asked again now and then (its state may have been lost, or reset
// by an operator), and the cache is emptied whenever a circuit closes. It is
// bounded and sharded.
type denyCache struct {
	seed     maphash.Seed
	shards   [16]denyShard
	perShard int
}

type denyShard struct {
	mu sync.Mutex
	// m holds denials by the hash of their policy id and key tag, so that
	// a lookup hashes the key once: the hash picks the shard and is the
	// map's key. Each denial keeps its key, and one whose key is not the
	// one looked up is no answer (two keys of one hash share a slot).
	m map[uint64]denial
}

type denial struct {
	key     denyKey
	at      time.Time
	until   time.Time // the denial's retry-after
	forgets time.Time // when the cache stops answering it
	cost    int64
	res     algo.Result
}

// maxHold is the longest the cache answers one denial: a flooding client's
// key reaches the store about once a second.
const maxHold = time.Second

func newDenyCache(size int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed(), perShard: max(size/16, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[uint64]denial)
	}
	return c
}

// denyKey is a cache key on the stack: the policy's id, then the key tag.
type denyKey struct {
	b [4 + 64]byte
	n int
}

// key fills k and returns its shard and hash.
func (c *denyCache) key(k *denyKey, id uint32, tag []byte) (*denyShard, uint64) {
	binary.LittleEndian.PutUint32(k.b[:4], id)
	k.n = 4 + copy(k.b[4:], tag)
	h := maphash.Bytes(c.seed, k.b[:k.n])
	return &c.shards[h%uint64(len(c.shards))], h
}

// get returns the cached denial of the policy's key for a request of the
// given cost, with its times brought up to now.
func (c *denyCache) get(id uint32, tag []byte, cost int64, now time.Time) (algo.Result, bool) {
	var k denyKey
	sh, h := c.key(&k, id, tag)
	sh.mu.Lock()
	d, ok := sh.m[h]
	ok = ok && d.key == k
	if ok && !now.Before(d.forgets) {
		delete(sh.m, h)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || cost < d.cost {
		return algo.Result{}, false
	}
	elapsed := now.Sub(d.at)
	r := d.res
	r.RetryAfter = d.until.Sub(now)
	r.ResetAfter = max(r.ResetAfter-elapsed, r.RetryAfter)
	return r, true
}

// put remembers a denial that waiting cures (ReasonLimited).
func (c *denyCache) put(id uint32, tag []byte, cost int64, res algo.Result, now time.Time) {
	if res.Reason != algo.ReasonLimited || res.RetryAfter <= 0 {
		return
	}
	var k denyKey
	sh, h := c.key(&k, id, tag)
	d := denial{key: k, at: now, until: now.Add(res.RetryAfter), forgets: now.Add(min(res.RetryAfter, maxHold)), cost: cost, res: res}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[h]; ok {
		// Replace in place (another key of the same hash loses its
		// denial, and asks the store again).
		sh.m[h] = d
		return
	}
	if len(sh.m) >= c.perShard {
		// Make room: drop expired entries among a random few (map
		// iteration starts anywhere), else the last of them.
		var last uint64
		n := 0
		for k, d := range sh.m {
			if !now.Before(d.forgets) {
				delete(sh.m, k)
			}
			last = k
			if n++; n == 8 {
				break
			}
		}
		if len(sh.m) >= c.perShard {
			delete(sh.m, last)
		}
	}
	sh.m[h] = d
}

// clear forgets every denial.
func (c *denyCache) clear() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
}
