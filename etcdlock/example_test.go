package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The article's payment approval: wait up to 2 s for the lock, hold it for
// at most 10 s, and pass the token, the lock key's revision, to the approval.
func Example() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{exampleEndpoint}, Logger: zap.NewNop()})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	locker, err := etcdlock.New(client, nil)
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

// A resource kept in etcd itself: the write goes through only while the
// lease still owns the lock, however late it arrives.
func ExampleIsOwner() {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{exampleEndpoint}, Logger: zap.NewNop()})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	locker, _ := etcdlock.New(client, nil)
	ctx := context.Background()

	lease, err := locker.Acquire(ctx, "config:billing")
	if err != nil {
		fmt.Println(err)
		return
	}
	write := func(value string) bool {
		owner, err := etcdlock.IsOwner(lease)
		if err != nil {
			panic(err)
		}
		resp, err := client.Txn(ctx).If(owner).Then(clientv3.OpPut("billing/rate", value)).Commit()
		if err != nil {
			panic(err)
		}
		return resp.Succeeded
	}
	fmt.Println("while held:", write("1.5%"))
	_ = lease.Release(ctx)
	fmt.Println("after release:", write("9.9%"))
	// Output:
	// while held: true
	// after release: false
}
