// Package redisshare carries the denials summaries between replicas
// through Redis (denials.Exchange), with the commands the least-privilege
// user already has (SET, ZADD, PEXPIRE, ZRANGE, MGET) and keys under the
// key prefix that expire by themselves:
//
//	PREFIX:{top:LEN:INDEX}        a sorted set of the replicas that published window INDEX, by time
//	PREFIX:{top:LEN:INDEX}:NAME   replica NAME's summaries of that window
//
// A window's keys share one hash slot, so that a Redis Cluster serves
// them from one primary. A publish is one pipelined call; a fetch is two
// (the replicas, then their summaries).
package redisshare

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/denials"
)

// MaxBlob bounds a replica's summary as fetched: a larger one is skipped.
const MaxBlob = 16 << 20

// Exchange is a denials.Exchange over a Redis client.
type Exchange struct {
	client redis.UniversalClient
	prefix string
}

var _ denials.Exchange = (*Exchange)(nil)

// New returns an Exchange keeping its keys under prefix (AUTHLIMIT_KEY_PREFIX).
func New(client redis.UniversalClient, prefix string) *Exchange {
	return &Exchange{client: client, prefix: prefix}
}

func (x *Exchange) index(w denials.WindowID) string {
	return fmt.Sprintf("%s:{top:%d:%d}", x.prefix, int64(w.Length/time.Second), w.Index)
}

// Publish stores replica's blobs and names replica in each window's index,
// in one pipelined call.
func (x *Exchange) Publish(ctx context.Context, replica string, blobs []denials.Blob) error {
	now := float64(time.Now().UnixMilli())
	_, err := x.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, b := range blobs {
			idx := x.index(b.Window)
			p.Set(ctx, idx+":"+replica, b.Data, b.TTL)
			p.ZAdd(ctx, idx, redis.Z{Score: now, Member: replica})
			p.PExpire(ctx, idx, b.TTL)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis publish: %w", err)
	}
	return nil
}

// Fetch returns every replica's blob for each window, by replica name: the
// denials.MaxReplicas that published last.
func (x *Exchange) Fetch(ctx context.Context, windows []denials.WindowID) ([]map[string][]byte, error) {
	names := make([]*redis.StringSliceCmd, len(windows))
	_, err := x.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, w := range windows {
			names[i] = p.ZRangeArgs(ctx, redis.ZRangeArgs{Key: x.index(w), Start: 0, Stop: denials.MaxReplicas - 1, Rev: true})
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis fetch the replicas: %w", err)
	}
	out := make([]map[string][]byte, len(windows))
	for i, w := range windows {
		out[i] = map[string][]byte{}
		replicas := names[i].Val()
		if len(replicas) == 0 {
			continue
		}
		keys := make([]string, len(replicas))
		for j, r := range replicas {
			keys[j] = x.index(w) + ":" + r
		}
		vals, err := x.client.MGet(ctx, keys...).Result()
		if err != nil {
			return nil, fmt.Errorf("redis fetch the summaries: %w", err)
		}
		for j, v := range vals {
			if s, ok := v.(string); ok && len(s) <= MaxBlob {
				out[i][replicas[j]] = []byte(s)
			}
		}
	}
	return out, nil
}
