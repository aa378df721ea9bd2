package redislock_test

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
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestKeptRefusedGrantExpiryWithinBudget: a waiter's grant holds the lock
// for its lease or what is left of its wait budget if less (grant.lua: a
// waiter that died holds the lock no longer than it would have waited).
// Its confirmation refused by replica sync, the waiter keeps the lock
// (ad53203); the refused try should not leave the lock's expiry past the
// budget: a waiter that dies during its back-off (here: its next try
// never goes out) would leave the lock held by nobody for its whole lease.
func TestKeptRefusedGrantExpiryWithinBudget(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name = "lock:kept-refused-expiry"
	lock := lockKey(name)
	sync := redislock.ReplicaSync{Timeout: 200 * time.Millisecond}
	holder := acquire(t, lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync}), name, fence.TTL(time.Minute))
	refused := make(chan struct{}, 16)
	firstClient := primary.Client(t)
	dead := &deadAfter{key: lock, held: make(chan struct{}), end: make(chan struct{})}
	firstClient.AddHook(dead)
	first := lockerWith(t, firstClient, redislock.Options{ReplicaSync: sync, Logger: slog.New(signalHandler{refused})})
	const budget = 5 * time.Second
	firstErr := make(chan error, 1)
	go func() {
		ls, err := first.Acquire(ctx(t), name, fence.Wait(budget), fence.TTL(time.Minute))
		if err == nil {
			_ = ls.Release(context.Background())
			err = errors.New("got a lease with its replica paused")
		}
		firstErr <- err
	}()
	defer func() { close(dead.end); <-firstErr }()
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lock+":queue").Val() == 1 && subscribers(t, admin, name) == 1
	})
	firstOwner := admin.LIndex(ctx(t), lock+":queue", 0).Val()
	resume := replica.Pause(t)
	defer resume()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-refused:
	case <-time.After(10 * time.Second):
		t.Fatal("no refused confirmation within 10 s")
	}
	dead.arm() // the waiter dies before its next try
	select {
	case <-dead.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no try after the refused one within 10 s")
	}
	if owner := admin.Get(ctx(t), lock).Val(); owner != firstOwner {
		t.Fatalf("after its refused confirmation the lock is %q, not the first waiter's %q", owner, firstOwner)
	}
	if pttl := admin.PTTL(ctx(t), lock).Val(); pttl > budget {
		t.Fatalf("the dead waiter's kept lock expires in %v, past its %v wait budget (its lease time: 1m)", pttl, budget)
	}
}

// deadAfter, once armed, holds every acquire script call on key (5 keys)
// before it is sent, as if its process had died, until end is closed;
// then fails it.
type deadAfter struct {
	key   string
	armed atomic.Bool
	once  sync.Once
	held  chan struct{} // closed when a call is held
	end   chan struct{}
}

func (d *deadAfter) arm() { d.armed.Store(true) }

func (d *deadAfter) hold(cmds []redis.Cmder) error {
	if !d.armed.Load() {
		return nil
	}
	for _, c := range cmds {
		args := c.Args()
		if len(args) > 3 && strings.HasPrefix(strings.ToLower(fmt.Sprint(args[0])), "eval") && fmt.Sprint(args[2]) == "5" && fmt.Sprint(args[3]) == d.key {
			d.once.Do(func() { close(d.held) })
			<-d.end
			return errors.New("the process died")
		}
	}
	return nil
}

func (d *deadAfter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (d *deadAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := d.hold([]redis.Cmder{cmd}); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (d *deadAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := d.hold(cmds); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// TestKeptRefusedGrantResentCapLate: the call that brings a kept lock's
// expiry down to the budget (keep.lua, e4993c1) is delayed on the network
// past the client's read timeout; go-redis sends it again, and the resend
// answers. The waiter goes on, and once the replica is back its next try
// confirms the lock: a lease of a minute. Then the first copy reaches
// Redis and cuts the lock's expiry to the budget (20 s), under a lease
// whose holder believes it a minute: another owner could take the lock
// inside the lease.
func TestKeptRefusedGrantResentCapLate(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name = "lock:kept-refused-cap-late"
	lock := lockKey(name)
	sync := redislock.ReplicaSync{Timeout: 200 * time.Millisecond}
	holder := acquire(t, lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync}), name, fence.TTL(time.Minute))
	tr := &transit{match: fmt.Appendf(nil, "$1\r\n1\r\n$%d\r\n%s\r\n", len(lock), lock)}
	c := redis.NewClient(&redis.Options{Addr: primary.Addr, Dialer: tr.dial, ReadTimeout: 600 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	refused := make(chan struct{}, 16)
	first := lockerWith(t, c, redislock.Options{ReplicaSync: sync, Logger: slog.New(signalHandler{refused})})
	got := make(chan acquired, 1)
	go func() {
		ls, err := first.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		got <- acquired{ls, err}
	}()
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lock+":queue").Val() == 1 && subscribers(t, admin, name) == 1
	})
	tr.arm()
	resume := replica.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, tr.holding)
	// The resend answered; a refusal after it shows the waiter went on.
	for len(refused) > 0 {
		<-refused
	}
	select {
	case <-refused:
	case r := <-got:
		t.Logf("Acquire, its cap resent: lease %v, %v", r.lease != nil, r.err)
		if r.lease != nil {
			_ = r.lease.Release(ctx(t))
			t.Fatal("a lease with the replica paused")
		}
		deliverLate(t, admin, tr)
		freeWithin(t, primary, admin, name, "after the Acquire gave up and its delayed cap ran")
		return
	case <-time.After(10 * time.Second):
		t.Fatal("no refusal after the resent cap within 10 s")
	}
	resume()
	resumed = true
	var r acquired
	select {
	case r = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("Acquire has not returned 15 s after the replica is back")
	}
	if r.lease == nil {
		t.Logf("Acquire, its cap resent: %v", r.err)
		deliverLate(t, admin, tr)
		return
	}
	defer func() { _ = r.lease.Release(ctx(t)) }()
	deliverLate(t, admin, tr)
	if pttl, left := admin.PTTL(ctx(t), lock).Val(), time.Until(r.lease.Deadline()); pttl < left {
		t.Fatalf("after the first copy of the cap ran, the lock expires in %v, before its lease's deadline (%v left): another owner can take it inside the lease", pttl, left)
	}
}
