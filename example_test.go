package fence_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// Run acquires, calls the function with the lease, and releases. The token
// goes with every write so that the resource can reject it if it is stale.
func ExampleRun() {
	client := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer client.Close()
	locker, _ := redislock.New(client, nil)

	err := fence.Run(context.Background(), locker, "lock:payment:1001",
		func(ctx context.Context, lease fence.Lease) error {
			fmt.Println("holding", lease.Name())
			return nil // write with lease.Token(); stop when ctx is done
		},
		fence.Wait(2*time.Second), fence.TTL(10*time.Second))
	fmt.Println("err:", err)
	// Output:
	// holding lock:payment:1001
	// err: <nil>
}
