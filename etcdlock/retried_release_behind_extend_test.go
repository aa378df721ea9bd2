package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// As TestRetriedReleaseAfterLossNotReleased, with an Extend under way as
// the first Release (ctx done) is called: that Release cannot take the
// lease's turn from the Extend and fails at once, revoking the etcd lease
// (releaseFailed), without reading the key. Its key was removed before by
// another client: the Release retried later must say fence.ErrLeaseLost,
// not take the key gone for the revoke's doing. Before the fix it returned
// nil.
func TestRetriedReleaseBehindExtendAfterRemove(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	// While armed, the next LeaseGrant (the Extend's) waits for let.
	var armed atomic.Bool
	granting, let := make(chan struct{}), make(chan struct{})
	// A watch that delivers nothing (deafWatchClient): the lease must not
	// see the removal and end before the Extend sends its Grant (ci99:
	// the test waited for that Grant until go test's timeout).
	client := deafWatchClient(t, endpoints, grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if strings.HasSuffix(method, "/LeaseGrant") && armed.CompareAndSwap(true, false) {
				close(granting)
				<-let
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
	l, err := etcdlock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	removeHolder(t, admin, t.Name())
	armed.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(ctxFor(t, 20*time.Second), time.Minute) }()
	select {
	case <-granting: // the Extend holds the lease's turn
	case err := <-extended:
		t.Fatalf("Extend = %v before it sent its Grant: the scenario was not built", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the Extend sent no Grant in 10 s")
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	first := lease.Release(done)
	close(let)
	t.Logf("Extend = %v", <-extended)
	if !errors.Is(first, context.Canceled) {
		t.Fatalf("Release with a done ctx behind an Extend = %v, want context.Canceled", first)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release retried (the first, with its ctx done: %v) of a lease whose key was removed = %v, want ErrLeaseLost", first, err)
	}
}
