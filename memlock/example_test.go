package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// A second caller waits in line and gets the lock, with a greater token, as
// soon as the first releases it.
func Example() {
	locker, _ := memlock.New(nil)
	ctx := context.Background()

	first, _ := locker.Acquire(ctx, "report", fence.TTL(time.Minute))
	second := make(chan fence.Lease)
	go func() {
		lease, _ := locker.Acquire(ctx, "report", fence.Wait(10*time.Second), fence.TTL(time.Minute))
		second <- lease
	}()
	fmt.Println("first holds token", first.Token())
	_ = first.Release(ctx)
	lease := <-second
	fmt.Println("second holds token", lease.Token())
	_ = lease.Release(ctx)
	// Output:
	// first holds token 1
	// second holds token 2
}

// Remove takes a lock away from its holder, as a failover would: the lease
// ends, and its Release reports the loss.
func ExampleLocker_Remove() {
	var locker memlock.Locker // the zero value is ready to use
	ctx := context.Background()
	lease, _ := locker.Acquire(ctx, "report")

	locker.Remove("report")
	<-lease.Done()
	fmt.Println(errors.Is(lease.Err(), fence.ErrLeaseLost))
	fmt.Println(errors.Is(lease.Release(ctx), fence.ErrLeaseLost))
	// Output:
	// true
	// true
}
