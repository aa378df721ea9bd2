package etcdlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"google.golang.org/grpc"
)

// A Release under way as Close is called: its lease ends (and leaves the
// list of those Close releases) as its delete leaves, so Close neither
// released it nor waited for it. With the delete held in the client (an
// interceptor standing in for a slow member), Close returned nil at once,
// the key still there; the client closed after Close, as Close's doc
// allows, cut the delete, and the key stayed for its etcd lease's TTL
// (1 key left, want 0; the Release returned 'client connection is
// closing'). Now Close waits for it, within ctx.
func TestCloseWaitsForReleaseUnderWay(t *testing.T) {
	entered, gate := make(chan struct{}, 1), make(chan struct{})
	client := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if strings.HasSuffix(method, "/DeleteRange") {
				select {
				case entered <- struct{}{}:
				default:
				}
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
	l, err := etcdlock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease := acquire(t, l, t.Name(), time.Minute)
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctxFor(t, 10*time.Second)) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the Release's delete was not sent within 10 s")
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctxFor(t, 10*time.Second)) }()
	var cerr error
	select {
	case cerr = <-closed:
		t.Logf("Close returned %v with the Release's delete still held", cerr)
		// What a user may do once Close has returned.
		_ = client.Close()
		close(gate)
	case <-time.After(500 * time.Millisecond):
		// Waiting for the Release, as it should: let the delete through.
		close(gate)
		cerr = <-closed
	}
	rerr := <-released
	t.Logf("Close = %v, Release = %v", cerr, rerr)
	if cerr != nil {
		t.Errorf("Close = %v", cerr)
	}
	if n := countKeys(t, newClient(t, shared.Endpoints(), nil), l.Prefix(t.Name())); n != 0 {
		t.Errorf("%d key(s) left after Close and the client's close, want 0", n)
	}
	if err := lease.Err(); err != fence.ErrReleased {
		t.Errorf("Err = %v", err)
	}
}
