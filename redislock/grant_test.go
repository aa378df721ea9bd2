package redislock_test

import (
	"context"
	"errors"
	"fmt"
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

// subscribers is how many clients are subscribed to name's release channel.
func subscribers(t *testing.T, admin *redis.Client, name string) int64 {
	ch := lockKey(name) + ":released"
	return admin.PubSubNumSub(ctx(t), ch).Val()[ch]
}

// TestGrantFIFOAcrossLockers: waiters of separate Lockers (as of separate
// processes) that queued in a known order get the lock in that order. On
// the wake-and-race design, every Locker's subscription is woken by each
// release and the waiters race: the order is anyone's.
func TestGrantFIFOAcrossLockers(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name, n = "lock:fifo", 6
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	order := make(chan int, n)
	errs := make(chan error, n)
	for i := range n {
		l := newLocker(t, srv.Client(t))
		go func() {
			ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
			if err != nil {
				errs <- err
				return
			}
			order <- i
			errs <- ls.Release(ctx(t))
		}()
		// Waiter i has tried (and found the lock held) before it
		// subscribes: the next one comes after it.
		waitFor(t, func() bool { return subscribers(t, admin, name) == int64(i+1) })
	}
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	var got []int
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(order)
	for i := range order {
		got = append(got, i)
	}
	for i, w := range got {
		if w != i {
			t.Fatalf("waiters got the lock in the order %v, want 0..%d", got, n-1)
		}
	}
}

// TestDeadWaiterBlocksNoLongerThanItsBudget: a queued waiter whose process
// died (its client closed mid-wait: nothing withdraws it) is granted the
// lock when the holder releases, but only for what was left of its wait
// budget; the waiter behind it gets the lock when that ends, not after a
// lease time (a minute) or its own timer on the old holder's TTL.
func TestDeadWaiterBlocksNoLongerThanItsBudget(t *testing.T) {
	t.Parallel() // own server; mostly waits out the dead waiter's budget (2 s slack)
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:dead"
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))

	deadClient := redis.NewClient(&redis.Options{Addr: srv.Addr})
	dead := newLocker(t, deadClient)
	deadDone := make(chan error, 1)
	budget := 2 * time.Second
	deadStart := time.Now()
	go func() {
		_, err := dead.Acquire(ctx(t), name, fence.Wait(budget), fence.TTL(time.Minute))
		deadDone <- err
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 })
	_ = deadClient.Close() // killed: it cannot withdraw

	got := make(chan error, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 2 })
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter behind the dead one: %v", err)
	}
	if took := time.Since(deadStart); took > budget+2*time.Second {
		t.Fatalf("the waiter behind the dead one got the lock %v after the dead one began waiting %v", took, budget)
	}
	if err := <-deadDone; err == nil {
		t.Fatal("the dead waiter acquired")
	}
}

// TestGaveUpWaiterSkipped: a waiter that gave up cleanly (its context
// cancelled) is out of the queue: the release grants the lock to the one
// behind it at once.
func TestGaveUpWaiterSkipped(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:gaveup"
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	cctx, cancel := context.WithCancel(ctx(t))
	quitter := make(chan error, 1)
	go func() {
		_, err := newLocker(t, srv.Client(t)).Acquire(cctx, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		quitter <- err
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 })
	got := make(chan fence.Lease, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 2 })
	cancel()
	if err := <-quitter; !errors.Is(err, context.Canceled) {
		t.Fatalf("the quitter: %v, want context.Canceled", err)
	}
	waitFor(t, func() bool { return admin.HLen(ctx(t), lockKey(name)+":waiters").Val() == 1 })
	start := time.Now()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	ls := <-got
	if ls == nil {
		t.FailNow()
	}
	defer ls.Release(ctx(t))
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the waiter behind the quitter took %v after the release", took)
	}
}

// TestGrantAfterBudgetEnded: the lock is granted to a waiter whose grant
// message never reaches it (here the test writes the grant, as the release
// script would, and publishes nothing); the waiter's budget ends. Its
// withdrawal finds the lock its own and hands it on at once: the next
// waiter does not wait for the lease time (a minute).
func TestGrantAfterBudgetEnded(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:late"
	lock := lockKey(name)
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	first := make(chan error, 1)
	go func() {
		_, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(time.Second), fence.TTL(time.Minute))
		first <- err
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lock+":queue").Val() == 1 })
	owner := admin.LIndex(ctx(t), lock+":queue", 0).Val()
	got := make(chan error, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lock+":queue").Val() == 2 && subscribers(t, admin, name) == 2
	})
	// The holder's lease ends; the grant to the first waiter is written
	// but its message is lost.
	_ = holder
	if _, err := admin.TxPipelined(ctx(t), func(p redis.Pipeliner) error {
		p.LPop(ctx(t), lock+":queue")
		p.HDel(ctx(t), lock+":waiters", owner)
		p.Set(ctx(t), lock, owner, time.Minute)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := <-first; !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("the first waiter: %v, want ErrHeld at the end of its budget", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the second waiter: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the second waiter got the lock %v after the first gave up, as if it waited for the lease", took)
	}
}

// TestExpiredHolderHandsToHead: the holder dies (its lease expires, nobody
// releases); the queued waiters get the lock in their order, the first
// within about the holder's remaining TTL.
func TestExpiredHolderHandsToHead(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name, n = "lock:expired", 3
	ttl := time.Second
	_ = acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(ttl)) // never released
	start := time.Now()
	type result struct {
		i, turn int
		took    time.Duration
		err     error
	}
	// The turn is taken before the Release that grants the next waiter:
	// the order in which the goroutines report afterwards is the
	// scheduler's (CI once saw waiter 2 report before waiter 1).
	var turns atomic.Int32
	results := make(chan result, n)
	for i := range n {
		l := newLocker(t, srv.Client(t))
		go func() {
			ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
			took := time.Since(start)
			turn := -1
			if err == nil {
				turn = int(turns.Add(1)) - 1
				err = ls.Release(ctx(t))
			}
			results <- result{i, turn, took, err}
		}()
		waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == int64(i+1) })
	}
	for range n {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.i != r.turn {
			t.Fatalf("waiter %d got the lock in turn %d", r.i, r.turn)
		}
		if r.turn == 0 && r.took > ttl+time.Second {
			t.Fatalf("the head got the lock %v after the holder's %v lease began", r.took, ttl)
		}
	}
}

// TestHandoffCommands: 16 waiters queue; each release grants the lock to
// the next with one message, and the waiter takes it with no command of
// its own: per acquisition, the try that queued it and its release. (Their
// budgets outlast the lease time: a grant for less, capped by what is left
// of the waiter's budget, is confirmed by a try.)
func TestHandoffCommands(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name, n = "lock:handoff", 16
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	ch := lockKey(name) + ":released"
	ps := admin.Subscribe(ctx(t), ch)
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx(t)); err != nil {
		t.Fatal(err)
	}
	var cmds counter
	c := srv.Client(t)
	c.AddHook(&cmds)
	// Replica sync off: no read of the replica count either.
	waiters, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			ls, err := waiters.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(10*time.Second))
			if err == nil {
				err = ls.Release(ctx(t))
			}
			errs <- err
		})
		waitFor(t, func() bool {
			// Queued, and the Locker's subscription (beside the test's) is
			// confirmed before the next waiter tries. The server counts
			// the subscription before the Locker has read its
			// confirmation: the first waiter's second try, made once it
			// has, says the Locker knows (under load, a second waiter
			// that tried in between tried once more too).
			return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == int64(i+1) && subscribers(t, admin, name) == 2 &&
				(i > 0 || cmds.n.Load() == 2)
		})
	}
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// One try each, one release each; the first waiter's subscription was
	// confirmed after its try, so it tried once more.
	if got := cmds.n.Load(); got != 2*n+1 {
		t.Fatalf("%d waiters sent %d commands (%v), want %d", n, got, cmds.names, 2*n+1)
	}
	admin.Publish(ctx(t), ch, "marker")
	grants := 0
	for {
		msg, err := ps.ReceiveMessage(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if msg.Payload == "marker" {
			break
		}
		if !strings.HasPrefix(msg.Payload, "g ") {
			t.Fatalf("message %q, want grants only", msg.Payload)
		}
		grants++
	}
	if grants != n {
		t.Fatalf("%d releases with a waiter sent %d grants", n, grants)
	}
}

// TestForgedGrant: a grant published by someone who can publish but does
// not know the waiter's secret (here: the right owner, the right try
// number, a token the record does not hold) does not give the waiter a
// lease; it confirms, finds the lock held, and waits on. When the holder
// releases, it gets the lock with the token of the record.
func TestForgedGrant(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:forged"
	lock := lockKey(name)
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	got := make(chan fence.Lease, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	waitFor(t, func() bool { return subscribers(t, admin, name) == 1 })
	owner := admin.LIndex(ctx(t), lock+":queue", 0).Val()
	const forged = 1 << 52
	for try := 1; try <= 3; try++ {
		admin.Publish(ctx(t), lock+":released", fmt.Sprintf("g %s %d 60000 %d 0 %040x", owner, forged, try, 0))
	}
	// The waiter confirms each: a try that finds the lock held.
	waitFor(t, func() bool {
		v := admin.HGet(ctx(t), lock+":waiters", owner).Val()
		return strings.HasPrefix(v, "60000 ") && !strings.HasPrefix(v, "60000 1 ")
	})
	select {
	case ls := <-got:
		t.Fatalf("a forged grant gave the waiter %v", ls)
	default:
	}
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	ls := <-got
	if ls == nil {
		t.FailNow()
	}
	defer ls.Release(ctx(t))
	if rec, _ := admin.Get(ctx(t), lock+":token").Int64(); ls.Token() == forged || int64(ls.Token()) != rec {
		t.Fatalf("the waiter holds token %d, the record %d", ls.Token(), rec)
	}
}

// TestGrantConfirmedWithReplicaSync: with replica sync on, a granted
// waiter confirms the grant with its own acquire script and WAIT; a grant
// that no replica acknowledges is refused (and given back), not held.
func TestGrantConfirmedWithReplicaSync(t *testing.T) {
	t.Parallel() // own servers; mostly waits on grants and WAITs
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name = "lock:synced"
	opts := &redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}}
	newSynced := func(c *redis.Client) *redislock.Locker {
		l, err := redislock.New(c, opts)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	holder := acquire(t, newSynced(primary.Client(t)), name, fence.TTL(time.Minute))
	var cmds counter
	c := primary.Client(t)
	c.AddHook(&cmds)
	waiter := newSynced(c)
	got := make(chan error, 1)
	go func() {
		ls, err := waiter.Acquire(ctx(t), name, fence.Wait(3*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	waitFor(t, func() bool { return subscribers(t, admin, name) == 1 })
	before := cmds.n.Load()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// The confirmation (EVALSHA and WAIT) and the release (EVALSHA).
	if n := cmds.n.Load() - before; n < 3 {
		t.Fatalf("the granted waiter sent %d commands after the grant, want a confirmation with WAIT", n)
	}

	// The replica cut off: the grant is confirmed, WAIT times out, and
	// the waiter does not hold the lock; the lock is not left to it.
	holder = acquire(t, newSynced(primary.Client(t)), name, fence.TTL(time.Minute))
	go func() {
		_, err := waiter.Acquire(ctx(t), name, fence.Wait(time.Second), fence.TTL(time.Minute))
		got <- err
	}()
	waitFor(t, func() bool { return subscribers(t, admin, name) == 1 })
	redistest.CutLink(t, primary, replica)
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("a grant no replica acknowledged: %v, want ErrNotReplicated", err)
	}
	waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey(name)).Val() == 0 })
}

// TestNoWaitAcquireRespectsQueue: a lock whose holder's lease ran out (here
// deleted behind its back) while a waiter queued is not taken by an
// Acquire without a wait budget that finds it free: it is granted to the
// queued waiter, at once, and the Acquire gets ErrHeld.
func TestNoWaitAcquireRespectsQueue(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:queued"
	_ = acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	got := make(chan error, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(10*time.Second))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	// The waiter subscribes after the try that queued it and, its
	// subscription confirmed after that try, tries once more at once (a
	// grant may have fallen in between), then waits on the holder's TTL.
	// Wait for that second try too (its number is in the waiter's entry):
	// one that ran after the deletion below would take the lock itself (as
	// the queue's head) and release it, and the Acquire would rightly find
	// the lock free.
	waitFor(t, func() bool {
		if subscribers(t, admin, name) != 1 {
			return false
		}
		for _, entry := range admin.HGetAll(ctx(t), lockKey(name)+":waiters").Val() {
			if f := strings.Fields(entry); len(f) == 4 && f[1] == "2" { // px, try, secret, deadline
				return true
			}
		}
		return false
	})
	admin.Del(ctx(t), lockKey(name)) // the holder's lease ran out
	start := time.Now()
	if _, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire without a wait on a free lock with a queued waiter = %v, want ErrHeld", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the queued waiter: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the queued waiter got the lock %v later, as if on its timer", took)
	}
}

// TestReleasedForOlderWaiters: a waiter of an older fence sets the waiting
// mark and listens for "released"; a release with no queued waiter
// publishes it while the mark is there.
func TestReleasedForOlderWaiters(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:older"
	ch := lockKey(name) + ":released"
	ps := admin.Subscribe(ctx(t), ch)
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lease := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	admin.Set(ctx(t), lockKey(name)+":waiting", "1", time.Minute)
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	msg, err := ps.ReceiveMessage(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if msg.Payload != "released" {
		t.Fatalf("a release with an older waiter's mark published %q, want \"released\"", msg.Payload)
	}
}
