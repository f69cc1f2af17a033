package handler

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/authlimit/authlimit/algo"
)

// denyCache remembers, per rule and key, a denial and how long it holds: a
// request of at least the same cost cannot pass before its retry-after, so
// until then it is denied here without asking the store. This keeps a flood
// from one client off Redis. It is bounded and sharded.
type denyCache struct {
	seed     maphash.Seed
	shards   [16]denyShard
	perShard int
}

type denyShard struct {
	mu sync.Mutex
	m  map[string]denial
}

type denial struct {
	at    time.Time
	until time.Time
	cost  int64
	res   algo.Result
}

func newDenyCache(size int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed(), perShard: max(size/16, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]denial)
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

// get returns the cached denial of key for a request of the given cost, with
// its times brought up to now.
func (c *denyCache) get(key string, cost int64, now time.Time) (algo.Result, bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	d, ok := sh.m[key]
	if ok && !now.Before(d.until) {
		delete(sh.m, key)
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
func (c *denyCache) put(key string, cost int64, res algo.Result, now time.Time) {
	if res.Reason != algo.ReasonLimited || res.RetryAfter <= 0 {
		return
	}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[key]; !ok && len(sh.m) >= c.perShard {
		// Make room: drop expired entries among a random few (map
		// iteration starts anywhere), else the last of them.
		var last string
		n := 0
		for k, d := range sh.m {
			if !now.Before(d.until) {
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
	sh.m[key] = denial{at: now, until: now.Add(res.RetryAfter), cost: cost, res: res}
}
