package redislock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// replyHold holds the reply of the next command (or pipeline) answered
// without an error once it is armed: the command has run on the server, and
// the caller waits until the test lets the reply through.
type replyHold struct {
	armed   atomic.Bool
	arrived chan struct{}
	resume  chan struct{}
}

func newReplyHold() *replyHold {
	return &replyHold{arrived: make(chan struct{}), resume: make(chan struct{})}
}

func (h *replyHold) hold() {
	if h.armed.CompareAndSwap(true, false) {
		close(h.arrived)
		<-h.resume
	}
}

func (h *replyHold) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *replyHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil { // not a NOSCRIPT answer, after which the script is sent
			h.hold()
		}
		return err
	}
}
func (h *replyHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil {
			h.hold()
		}
		return err
	}
}

// A Release ends its lease before the script that frees the lock runs: the
// lock may be taken by another owner at once, before the releasing call has
// its reply. Before the fix the lease was still held (Err nil, Context
// live) while another lease of the lock was.
func TestReleaseEndsLeaseBeforeFreeing(t *testing.T) {
	srv := redistest.Start(t)
	for _, sync := range []bool{false, true} {
		name := "release-order"
		opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !sync}}
		if sync {
			name += "-synced"
		}
		t.Run(name, func(t *testing.T) {
			rec := &observetest.Recorder{}
			opts.Observer = rec
			c := srv.Client(t)
			hold := newReplyHold()
			c.AddHook(hold)
			l := newLockerWith(t, c, opts)
			other := newLocker(t, srv.Client(t))
			ls := acquire(t, l, name, fence.TTL(time.Minute))
			hold.armed.Store(true)
			released := make(chan error, 1)
			go func() { released <- ls.Release(ctx(t)) }()
			select {
			case <-hold.arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the release script was not sent")
			}
			next, err := other.Acquire(ctx(t), name, fence.TTL(time.Minute))
			if err != nil {
				close(hold.resume)
				t.Fatalf("the lock is not free once the release script ran: %v", err)
			}
			if ls.Err() == nil {
				t.Errorf("token %d granted while the released lease of token %d has no Err", next.Token(), ls.Token())
			}
			select {
			case <-ls.Done():
			default:
				t.Errorf("token %d granted while the released lease's Done is open", next.Token())
			}
			if cause := context.Cause(ls.Context()); !errors.Is(cause, fence.ErrReleased) {
				t.Errorf("the released lease's Context cause = %v, want ErrReleased", cause)
			}
			if n := len(rec.Ends()); n != 0 {
				t.Errorf("%d ends reported before the release's result is known", n)
			}
			close(hold.resume)
			if err := <-released; err != nil {
				t.Fatalf("Release = %v", err)
			}
			if ends := rec.WaitEnds(t, 1, 5*time.Second); ends[0].Cause != fence.Released {
				t.Errorf("reported %v, want Released", ends[0].Cause)
			}
			if err := ls.Err(); err != fence.ErrReleased {
				t.Errorf("Err = %v, want ErrReleased", err)
			}
			if err := next.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// An Extend whose reply comes after a Release ended the lease says, as an
// Extend after Release does, that the lease is no longer its holder's:
// ErrLeaseLost with ErrReleased. It returned ErrReleased alone.
func TestExtendInFlightWhenReleased(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	hold := newReplyHold()
	c.AddHook(hold)
	l := newLocker(t, c)
	ls := acquire(t, l, "extend-in-flight", fence.TTL(time.Minute))
	if err := ls.Extend(ctx(t), time.Minute); err != nil { // loads the script
		t.Fatal(err)
	}
	hold.armed.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- ls.Extend(ctx(t), time.Minute) }()
	select {
	case <-hold.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the renewal was not sent")
	}
	if err := ls.Release(ctx(t)); err != nil {
		t.Fatalf("Release = %v", err)
	}
	close(hold.resume)
	if err := <-extended; !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Extend in flight when Release ended the lease = %v, want ErrLeaseLost and ErrReleased", err)
	}
	if err := ls.Err(); err != fence.ErrReleased {
		t.Fatalf("Err = %v, want ErrReleased", err)
	}
}
