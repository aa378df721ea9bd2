package redislock_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestLateUndoOfRefusedTryEndsTheWait: a waiting Acquire's try takes the
// free lock, but its WAIT counts no replica (the replica is paused): the
// take is undone with a plain, owner-checked release, whose write is
// delayed on the network; its read times out (the client's ReadTimeout,
// 900 ms, ends it before the undo's own 1 s bound: errUnreleased wrapping
// an i/o timeout, joined with fence.ErrNotReplicated; transient). The wait
// went on with the same owner; the replica back, the next try found the
// lock its own and got a lease; then the delayed undo reached Redis, found
// the lock the owner's, and deleted it under that live lease, and another
// owner got the lock while it held. Now the Acquire gives up (its
// withdrawal revokes the owner), and the lock, once the undo has run, is
// free for another Acquire.
func TestLateUndoOfRefusedTryEndsTheWait(t *testing.T) {
	const name = "lock:late-undo"
	lock := lockKey(name)
	srv, replica, tr, c := heldUndo(t, name, 900*time.Millisecond)
	admin := srv.Client(t)
	l := lockerWith(t, c, redislock.Options{})
	resume := replica.Pause(t)
	before := commandCalls(t, admin, "evalsha")
	got := make(chan error, 1)
	go func() {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = fmt.Errorf("got a lease, token %d, deadline in %v, while its undo is on its way", ls.Token(), time.Until(ls.Deadline()).Round(time.Millisecond))
			_ = ls.Release(ctx(t))
		}
		got <- err
	}()
	waitFor(t, func() bool { return commandCalls(t, admin, "evalsha") > before }) // the try ran
	waitFor(t, tr.holding)                                                        // the undo's write, held
	resume()
	redistest.WaitReplicated(t, srv, 1)
	select {
	case err := <-got:
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("Acquire whose undo may still run: %v, want ErrNotAcquired", err)
		}
		t.Logf("Acquire: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("Acquire still waiting 15 s after its undo failed")
	}
	if err := tr.deliver(); err != nil {
		t.Fatal(err)
	}
	other, err := lockerWith(t, srv.Client(t), redislock.Options{}).Acquire(ctx(t), name, fence.Wait(3*time.Second), fence.TTL(time.Second))
	if err != nil {
		t.Fatalf("after the given-up Acquire and its undo: %v; the lock is held for %v by %s", err, admin.PTTL(ctx(t), lock).Val(), admin.Get(ctx(t), lock).Val())
	}
	_ = other.Release(ctx(t))
}

// heldUndo starts a server with a replica, and a client of it with
// readTimeout whose first release of name is held on its way by tr: the
// undo of a take that replica sync refused, an EVALSHA with release.lua's
// ReleaseKeys keys, the lock first; armed before any Acquire, so that it is
// held however late the WAIT times out. The scripts are loaded, so that a try
// is one EVALSHA.
func heldUndo(t *testing.T, name string, readTimeout time.Duration) (srv, replica *redistest.Server, tr *transit, c *redis.Client) {
	t.Helper()
	srv = redistest.Start(t)
	replica = redistest.StartReplica(t, srv)
	redistest.WaitReplicated(t, srv, 1)
	if err := acquire(t, lockerWith(t, srv.Client(t), redislock.Options{}), "lock:warm-up").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lock := lockKey(name)
	tr = &transit{match: fmt.Appendf(nil, "$1\r\n%d\r\n$%d\r\n%s\r\n", redislock.ReleaseKeys, len(lock), lock)}
	tr.arm()
	c = redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: tr.dial, ReadTimeout: readTimeout, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return srv, replica, tr, c
}
