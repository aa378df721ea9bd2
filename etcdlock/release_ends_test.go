package etcdlock_test

import (
	"context"
	"errors"
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

// heldDelete is a client interceptor that, once armed, calls before just
// before it sends the next DeleteRange (Release's delete), sends it, and
// holds its reply back until proceed is closed: a delete applied on the
// server whose sender still waits for the answer.
type heldDelete struct {
	before  atomic.Pointer[func()]
	applied chan error // the held delete's error, once it is applied
	proceed chan struct{}
	once    sync.Once
}

func newHeldDelete() *heldDelete {
	return &heldDelete{applied: make(chan error, 1), proceed: make(chan struct{})}
}

func (h *heldDelete) arm(before func()) { h.before.Store(&before) }

func (h *heldDelete) release() { h.once.Do(func() { close(h.proceed) }) }

func (h *heldDelete) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !strings.HasSuffix(method, "/DeleteRange") {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	before := h.before.Swap(nil)
	if before == nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	(*before)()
	err := invoker(ctx, method, req, reply, cc, opts...)
	h.applied <- err
	<-h.proceed
	return err
}

// leaseState is what a lease says of itself at one moment.
type leaseState struct {
	err   error
	done  bool
	cause error // the cause its Context was cancelled with
}

func stateOf(lease fence.Lease) leaseState {
	s := leaseState{err: lease.Err(), cause: context.Cause(lease.Context())}
	select {
	case <-lease.Done():
		s.done = true
	default:
	}
	return s
}

// checkEnded fails the test unless s is the state of a lease ended by
// Release: Err ErrReleased, Done closed, Context cancelled with that cause.
func checkEnded(t *testing.T, when string, s leaseState) {
	t.Helper()
	if !errors.Is(s.err, fence.ErrReleased) || !s.done || !errors.Is(s.cause, fence.ErrReleased) {
		t.Errorf("%s: lease Err %v, Done closed %v, Context cause %v; want ErrReleased, closed, ErrReleased", when, s.err, s.done, s.cause)
	}
}

// Release ends the lease before its delete leaves: once the delete is
// applied another Acquire may take the lock, while the releasing call
// still waits for its reply, and a goroutine of the old holder working
// under lease.Context() must have stopped by then. Release used to end
// the lease only after the reply (fencetest's MutualExclusion: "token N
// granted while the lease of token M, being released, has no Err"). The
// end is reported once the reply says how it ended: released, or, if the
// key was already gone when the delete arrived (removed by an operator
// as the holder released), lost (LostRemoved), which Err then says too.
func TestReleaseEndsLeaseBeforeDelete(t *testing.T) {
	for _, removed := range []bool{false, true} {
		name := "released"
		if removed {
			name = "removed"
		}
		t.Run(name, func(t *testing.T) {
			endpoints := shared.Endpoints()
			admin := newClient(t, endpoints, nil)
			h := newHeldDelete()
			t.Cleanup(h.release)
			c, err := clientv3.New(clientv3.Config{
				Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
				DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(h.intercept)},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			rec := &observetest.Recorder{}
			l, err := etcdlock.New(c, &etcdlock.Options{Observer: rec})
			if err != nil {
				t.Fatal(err)
			}
			other := newLocker(t, endpoints, nil)
			ctx := ctxFor(t, 30*time.Second)
			// A watchdog lease (its renewals stop with it), and a fixed one.
			var opts []fence.Option
			if removed {
				opts = append(opts, fence.TTL(time.Minute))
			}
			lease, err := l.Acquire(ctx, t.Name(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			var atSend leaseState
			h.arm(func() {
				if removed {
					// The operator's delete lands just before Release's.
					if _, err := admin.Delete(ctx, lease.(*etcdlock.Lease).Key()); err != nil {
						t.Errorf("operator's delete: %v", err)
					}
				}
				atSend = stateOf(lease)
			})
			var relErr error
			released := make(chan struct{})
			go func() { defer close(released); relErr = lease.Release(ctx) }()
			t.Cleanup(func() { h.release(); <-released })
			select {
			case err := <-h.applied:
				if err != nil {
					t.Fatalf("Release's delete: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Release's delete not applied after 10 s")
			}
			checkEnded(t, "as the delete was sent", atSend)
			checkEnded(t, "with the delete applied, its reply held", stateOf(lease))
			if ends := rec.Ends(); len(ends) != 0 {
				t.Errorf("lease end reported before Release's result: %+v", ends)
			}
			// The lock is free: another Acquire takes it while the
			// releasing call waits.
			next, err := other.Acquire(ctx, t.Name(), fence.Wait(0))
			if err != nil {
				t.Fatalf("Acquire with the delete applied: %v", err)
			}
			checkEnded(t, "as the next lease was granted", stateOf(lease))
			if err := next.Release(ctx); err != nil {
				t.Fatal(err)
			}

			h.release()
			select {
			case <-released:
			case <-time.After(10 * time.Second):
				t.Fatal("Release still waiting 10 s after its reply")
			}
			ends := rec.WaitEnds(t, 1, 5*time.Second)
			if removed {
				if !errors.Is(relErr, fence.ErrLeaseLost) || errors.Is(relErr, fence.ErrReleased) {
					t.Fatalf("Release of a removed key = %v, want ErrLeaseLost", relErr)
				}
				if err := lease.Err(); err != relErr {
					t.Errorf("Err after Release = %v, want its result %v", err, relErr)
				}
				if ends[0].Cause != fence.LostRemoved || ends[0].Err != relErr {
					t.Errorf("LeaseEnded %+v, want cause %q, Err %v", ends[0], fence.LostRemoved, relErr)
				}
			} else {
				if relErr != nil {
					t.Fatalf("Release = %v", relErr)
				}
				if err := lease.Err(); err != fence.ErrReleased {
					t.Errorf("Err after Release = %v, want ErrReleased", err)
				}
				if ends[0].Cause != fence.Released {
					t.Errorf("LeaseEnded %+v, want cause %q", ends[0], fence.Released)
				}
			}
			if err := lease.Release(ctx); err != relErr {
				t.Errorf("Release again = %v, want %v", err, relErr)
			}
			if ends := rec.Ends(); len(ends) != 1 || ends[0].Token != lease.Token() {
				t.Errorf("LeaseEnded events %+v, want one, of token %d", ends, lease.Token())
			}
		})
	}
}
