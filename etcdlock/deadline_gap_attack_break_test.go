package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// gapAttack is observetest's GapAttack for etcdlock, runs held.
var gapAttack = observetest.GapAttack{
	New: func(t *testing.T, obs fence.Observer) fence.Locker {
		return pastDeadlineLocker(t, obs, nil)
	},
	Pass: etcdlock.PassDeadline,
	Set:  etcdlock.SetDeadline,
}

// TestConcurrentCallsPastDeadline: see
// observetest.ConcurrentCallsPastDeadline. Eight goroutines find a lease
// past its deadline at once (Release and Extend among them, which wait for
// ls.op and give the etcd lease back), the Observer calls it back: one
// end, reported by the one that made it before it returned, and every
// call says lost.
func TestConcurrentCallsPastDeadline(t *testing.T) {
	for _, watchdog := range []bool{false, true} {
		t.Run(fmt.Sprintf("watchdog=%v", watchdog), func(t *testing.T) {
			observetest.ConcurrentCallsPastDeadline(t, gapAttack, watchdog)
		})
	}
}

// TestHeldLeaseCallsDoNotAllocate: see
// observetest.HeldLeaseCallsDoNotAllocate.
func TestHeldLeaseCallsDoNotAllocate(t *testing.T) {
	observetest.HeldLeaseCallsDoNotAllocate(t, gapAttack)
}

// TestReleasedThenPastDeadline: see observetest.ReleasedThenPastDeadline.
func TestReleasedThenPastDeadline(t *testing.T) {
	for _, failFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("failFirst=%v", failFirst), func(t *testing.T) {
			observetest.ReleasedThenPastDeadline(t, gapAttack, failFirst)
		})
	}
}

// revokeCounter is a unary interceptor that counts LeaseRevoke calls.
type revokeCounter struct{ n atomic.Int64 }

func (c *revokeCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == "/etcdserverpb.Lease/LeaseRevoke" {
		c.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// givingBack reports whether a goroutine is in Locker.giveBack.
func givingBack() bool { return strings.Contains(observetest.Stacks(), "etcdlock.(*Locker).giveBack") }

// waitGivenBack waits, up to 10 s, for no goroutine to be in giveBack.
func waitGivenBack(t *testing.T) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(10 * time.Second)
	for givingBack() {
		select {
		case <-tick.C:
		case <-limit:
			t.Fatalf("a giveBack is still running 10 s on:\n%s", observetest.Stacks())
		}
	}
}

// TestErrLoopGivesBackOnce: a user polls Err (and Done, Context) in tight
// loops on four goroutines past the lease's deadline, before its run has
// seen it. Err gives the etcd lease back in a goroutine of its own: the
// first call that ends the lease does, once; the thousands after it start
// nothing. Then Release returns the loss and revokes nothing more, and
// closing the client right after an Err that ended a lease leaves no
// giveBack behind.
func TestErrLoopGivesBackOnce(t *testing.T) {
	rc := &revokeCounter{}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   shared.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(rc.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = c.Close()
		}
	})
	ctx := ctxFor(t, 30*time.Second)
	rec := &observetest.Recorder{}
	l, err := etcdlock.New(c, &etcdlock.Options{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	etcdlock.HoldRuns(l)
	ls, err := l.Acquire(ctx, "deadline-gap:err-loop", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waitGivenBack(t)
	before := rc.n.Load()
	etcdlock.PassDeadline(t, ls)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 2500 {
				_ = ls.Err()
				_ = ls.Done()
				_ = ls.Context()
			}
		})
	}
	wg.Wait()
	waitGivenBack(t)
	if n := rc.n.Load() - before; n != 1 {
		t.Errorf("revokes sent for 30000 calls past the deadline: %d, want 1", n)
	}
	if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release = %v, want ErrLeaseLost", err)
	}
	waitGivenBack(t)
	if n := rc.n.Load() - before; n != 1 {
		t.Errorf("revokes sent after Release: %d, want 1", n)
	}
	if ends := rec.Ends(); len(ends) != 1 || ends[0].Cause != fence.LostExpired {
		t.Errorf("ends %+v, want one, expired", ends)
	}

	// An Err that ends a lease, the client closed right after.
	ls2, err := l.Acquire(ctx, "deadline-gap:err-then-close", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	etcdlock.PassDeadline(t, ls2)
	if err := ls2.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Err = %v, want ErrLeaseLost", err)
	}
	_ = c.Close()
	closed = true
	waitGivenBack(t)
}

// failKeepAlive is a stream interceptor that fails every LeaseKeepAlive
// stream: run's renewals fail, and are logged.
func failKeepAlive(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if method == "/etcdserverpb.Lease/LeaseKeepAlive" {
		return nil, errors.New("test: keep-alive refused")
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// TestCallAtFailedRenewal: see observetest.CallAtFailedRenewal. The
// Logger's handler, told on run's goroutine that a renewal failed, finds
// the lease past its deadline with one of its calls, which ends and
// reports it there; the Observer's callback then calls Release (which
// halts and joins run: it must not wait for run, which is in the handler)
// and Extend.
func TestCallAtFailedRenewal(t *testing.T) {
	c := dialClient(t, shared.Endpoints(), grpc.WithChainStreamInterceptor(failKeepAlive))
	for _, call := range []string{"Err", "Done", "Context", "Release", "Extend"} {
		t.Run(call, func(t *testing.T) {
			observetest.CallAtFailedRenewal(t, "renewal failed", call,
				func(t *testing.T, obs fence.Observer, log *slog.Logger) fence.Locker {
					// Renewed a second in.
					l, err := etcdlock.New(c, &etcdlock.Options{Observer: obs, Logger: log, WatchdogTTL: 3 * time.Second})
					if err != nil {
						t.Fatal(err)
					}
					return l
				},
				func(ls fence.Lease) { etcdlock.SetDeadline(ls, time.Now().Add(-time.Millisecond)) })
		})
	}
}
