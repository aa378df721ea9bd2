package fence_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// Run acquires, calls the function with the lease, and releases. The token
// goes with every write so that the resource can reject it if it is stale.
// The examples use the in-memory memlock; redislock works the same way.
func ExampleRun() {
	locker, _ := memlock.New(nil)

	err := fence.Run(context.Background(), locker, "lock:payment:1001",
		func(ctx context.Context, lease fence.Lease) error {
			fmt.Println("holding", lease.Name(), "with token", lease.Token())
			return nil // write with lease.Token(); stop when ctx is done
		},
		fence.Wait(2*time.Second), fence.TTL(10*time.Second))
	fmt.Println("err:", err)
	// Output:
	// holding lock:payment:1001 with token 1
	// err: <nil>
}

// A lease lost while fn runs cancels fn's context, with the loss as its
// cause, and Run returns an error matching ErrLeaseLost.
func ExampleRun_leaseLost() {
	locker, _ := memlock.New(nil)

	err := fence.Run(context.Background(), locker, "lock:payment:1001",
		func(ctx context.Context, lease fence.Lease) error {
			locker.Remove(lease.Name()) // an operator deletes the lock
			<-ctx.Done()
			return context.Cause(ctx)
		})
	fmt.Println(errors.Is(err, fence.ErrLeaseLost))
	// Output:
	// true
}

// Acquire with a zero Wait tries once; an error says why the lock was not
// taken.
func ExampleLocker() {
	locker, _ := memlock.New(nil)
	ctx := context.Background()

	lease, err := locker.Acquire(ctx, "lock:payment:1001", fence.TTL(10*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lease.Release(ctx)

	_, err = locker.Acquire(ctx, "lock:payment:1001")
	fmt.Println(errors.Is(err, fence.ErrNotAcquired), errors.Is(err, fence.ErrHeld))
	fmt.Println(err)
	// Output:
	// true true
	// fence: lock not acquired: "lock:payment:1001": fence: held by another owner
}

// Lead campaigns, runs fn while it leads, and returns when ctx ends. Here
// the leader stops the whole campaign after its first term.
func ExampleLead() {
	locker, _ := memlock.New(nil)
	ctx, cancel := context.WithCancel(context.Background())

	err := fence.Lead(ctx, locker, "leader:billing",
		func(ctx context.Context, lease fence.Lease) error {
			fmt.Println("leading with token", lease.Token())
			cancel() // shut down: fn's context ends, and so does Lead
			<-ctx.Done()
			return nil
		},
		fence.OnDeposed(func(lease fence.Lease, err error) { fmt.Println("term of token", lease.Token(), "ended:", err) }))
	fmt.Println("Lead:", err)
	// Output:
	// leading with token 1
	// term of token 1 ended: <nil>
	// Lead: context canceled
}
