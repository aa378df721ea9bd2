// Package rediscluster holds what redislock and guard/redisstore both do
// with a go-redis cluster client when they follow a redirection
// themselves (their script and WAIT go to one node in one pipeline, which
// the cluster client's own routing would split).
package rediscluster

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// MasterByAddr returns the cluster client's node client for addr, which a
// redirection (MOVED or ASK) named as the slot's master. The client's slot
// map may not list it as a master yet (just after a failover or a slot
// migration), so every node is searched.
func MasterByAddr(ctx context.Context, cc *redis.ClusterClient, addr string) (*redis.Client, error) {
	var mu sync.Mutex
	var found *redis.Client
	err := cc.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	if err == nil && found == nil {
		err = fmt.Errorf("redirected to %s, which the cluster client does not list", addr)
	}
	return found, err
}
