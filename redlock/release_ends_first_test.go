package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// gateReleaseReply is a hook on a node's client that, when armed, lets the
// first release script call run on the node and holds its reply from the
// caller until open is closed (or the call's context ends); held is closed
// once the node has run it.
type gateReleaseReply struct {
	relHash string
	armed   atomic.Bool
	calls   atomic.Int32
	held    chan struct{}
	open    chan struct{}
}

func newGateReleaseReply(relHash string) *gateReleaseReply {
	return &gateReleaseReply{relHash: relHash, held: make(chan struct{}), open: make(chan struct{})}
}

func (h *gateReleaseReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateReleaseReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *gateReleaseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) < 2 || fmt.Sprint(a[1]) != h.relHash || !h.armed.Load() || h.calls.Add(1) != 1 {
			return next(ctx, cmd)
		}
		err := next(ctx, cmd)
		close(h.held)
		select {
		case <-h.open:
		case <-ctx.Done():
		}
		return err
	}
}

// Release ends the lease before its first delete leaves: while the deletes
// have run on every node (the lock is free, and another Locker takes it)
// but their replies are held, the releasing lease's Err says released, its
// Done is closed and its Context cancelled with fence.ErrReleased as cause;
// the Observer is told once the result is settled, as Released. A lease
// whose lock was removed meanwhile ends the same way, and once the replies
// say it was lost, its Err matches fence.ErrLeaseLost and the end is
// reported as LostRemoved. Before the fix the lease ended only after the
// replies: Err was nil while another Locker held the lock.
func TestReleaseEndsLeaseBeforeDeletes(t *testing.T) {
	for _, tc := range []struct {
		what string
		lost bool // the lock is removed from every node before Release
	}{{"released", false}, {"lost", true}} {
		t.Run(tc.what, func(t *testing.T) {
			srvs := nodes(t, 3)
			name := "release-ends-first-" + tc.what
			_, relHash := redlock.ScriptHashes()
			hooks := make([]*gateReleaseReply, len(srvs))
			rhooks := make([]redis.Hook, len(srvs))
			for i := range srvs {
				hooks[i] = newGateReleaseReply(relHash)
				rhooks[i] = hooks[i]
			}
			rec := &recorder{}
			l, err := redlock.New(clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, rhooks...),
				&redlock.Options{WatchdogTTL: 3 * time.Second, NodeTimeout: 10 * time.Second, Observer: rec})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
			other := newLocker(t, srvs, &redlock.Options{NodeTimeout: generous})
			t.Cleanup(func() { _, _ = closeWithin(other, 10*time.Second) })
			warmRelease(t, l, srvs, name, 10*time.Second)
			opts := []fence.Option{} // a watchdog lease
			if tc.lost {
				opts = append(opts, fence.TTL(30*time.Second))
			}
			lease, err := l.Acquire(ctxFor(t), name, opts...)
			if err != nil {
				t.Fatal(err)
			}
			lctx := lease.Context()
			if tc.lost {
				for i, s := range srvs {
					if err := s.Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
						t.Fatalf("DEL on node %d: %v", i, err)
					}
				}
			}
			for _, h := range hooks {
				h.armed.Store(true)
			}
			opened := false
			openAll := func() {
				if !opened {
					opened = true
					for _, h := range hooks {
						close(h.open)
					}
				}
			}
			t.Cleanup(openAll)
			released := make(chan error, 1)
			relCtx := ctxFor(t)
			go func() { released <- lease.Release(relCtx) }()
			for i, h := range hooks {
				select {
				case <-h.held:
				case <-time.After(10 * time.Second):
					t.Fatalf("node %d did not run the release", i)
				}
			}
			// Every node has deleted the lock (or found it gone); no
			// reply has reached Release.
			if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
				t.Errorf("Err while the release's replies are held = %v, want fence.ErrReleased", err)
			}
			select {
			case <-lease.Done():
			default:
				t.Errorf("Done not closed while the release's replies are held")
			}
			if cause := context.Cause(lctx); !errors.Is(cause, fence.ErrReleased) {
				t.Errorf("Context's cause while the release's replies are held = %v, want fence.ErrReleased", cause)
			}
			next, err := other.Acquire(ctxFor(t), name, fence.TTL(30*time.Second))
			if err != nil {
				t.Fatalf("another Locker's Acquire with the lock deleted on every node: %v", err)
			}
			if err := lease.Err(); err == nil {
				t.Errorf("token %d granted while the releasing lease of token %d has Err nil", next.Token(), lease.Token())
			}
			early := 0
			rec.mu.Lock()
			for _, e := range rec.ends {
				if e.Token == lease.Token() {
					early++
				}
			}
			rec.mu.Unlock()
			if early != 0 {
				t.Errorf("the Observer was told of %d ends before the release's replies came", early)
			}
			openAll()
			var relErr error
			select {
			case relErr = <-released:
			case <-time.After(10 * time.Second):
				t.Fatal("Release did not return within 10s of its replies")
			}
			want := fence.Released
			if tc.lost {
				want = fence.LostRemoved
				if !errors.Is(relErr, fence.ErrLeaseLost) {
					t.Errorf("Release of the removed lock = %v, want fence.ErrLeaseLost", relErr)
				}
				if err := lease.Err(); !errors.Is(err, fence.ErrLeaseLost) || errors.Is(err, fence.ErrReleased) {
					t.Errorf("Err after a Release that found the lease lost = %v, want fence.ErrLeaseLost", err)
				}
			} else {
				if relErr != nil {
					t.Errorf("Release = %v, want nil", relErr)
				}
				if err := lease.Err(); err != fence.ErrReleased {
					t.Errorf("Err after Release = %v, want fence.ErrReleased", err)
				}
			}
			if again := lease.Release(ctxFor(t)); (again == nil) != (relErr == nil) {
				t.Errorf("Release again = %v, first %v", again, relErr)
			}
			rec.mu.Lock()
			var ends []fence.LeaseEvent
			for _, e := range rec.ends {
				if e.Token == lease.Token() {
					ends = append(ends, e)
				}
			}
			rec.mu.Unlock()
			if len(ends) != 1 || ends[0].Cause != want {
				t.Errorf("the Observer was told %+v, want one end, %q", ends, want)
			} else if tc.lost && !errors.Is(ends[0].Err, fence.ErrLeaseLost) {
				t.Errorf("the reported loss's Err = %v, want fence.ErrLeaseLost", ends[0].Err)
			}
			if err := next.Release(ctxFor(t)); err != nil {
				t.Errorf("Release of the next lease: %v", err)
			}
		})
	}
}
