package redlock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// A lock on three independent masters; the token goes with every write.
func Example() {
	var nodes []redis.UniversalClient
	for _, addr := range []string{"redis-a:6379", "redis-b:6379", "redis-c:6379"} {
		nodes = append(nodes, redis.NewClient(&redis.Options{Addr: addr}))
	}
	locker, err := redlock.New(nodes, nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	// Before exit: Release returns once a majority deleted the lock, and
	// Close waits for the deletes still on their way to the other nodes.
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = locker.Close(ctx)
	}()
	err = fence.Run(ctx, locker, "lock:payment:1001", func(ctx context.Context, lease fence.Lease) error {
		fmt.Println("approve payment 1001 with token", lease.Token())
		return nil
	}, fence.Wait(2*time.Second), fence.TTL(10*time.Second))
	if err != nil {
		fmt.Println(err)
	}
}
