package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// The article's payment approval: wait up to 2 s for the lock, hold it for
// at most 10 s, and pass the token to the approval.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer client.Close()
	locker, err := redislock.New(client, nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	lease, err := locker.Acquire(ctx, "lock:payment:1001", fence.Wait(2*time.Second), fence.TTL(10*time.Second))
	if errors.Is(err, fence.ErrNotAcquired) {
		fmt.Println("try again later:", err)
		return
	}
	defer lease.Release(ctx)

	approve := func(paymentID int, token fence.Token) {
		// UPDATE payment SET status = 'APPROVED', last_fencing_token = $2
		//  WHERE id = $1 AND last_fencing_token < $2
		fmt.Printf("approving payment %d with a token: %v\n", paymentID, token > 0)
	}
	approve(1001, lease.Token())
	// Output: approving payment 1001 with a token: true
}

// Without fence.TTL the watchdog renews the lease until Release; the work
// stops when the lease's context is cancelled.
func ExampleLocker_Acquire_watchdog() {
	client := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer client.Close()
	locker, _ := redislock.New(client, &redislock.Options{WatchdogTTL: 3 * time.Second})
	ctx := context.Background()

	lease, err := locker.Acquire(ctx, "leader:billing")
	if err != nil {
		fmt.Println(err)
		return
	}
	// A second caller that does not wait is refused.
	_, err = locker.Acquire(ctx, "leader:billing")
	fmt.Println(errors.Is(err, fence.ErrHeld))

	fmt.Println(lease.Release(ctx), lease.Err())
	// Output:
	// true
	// <nil> fence: lease released
}
