package redislock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/child"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// handoffChildEnv makes the test binary a waiting process: "addr name
// budget", it acquires name on addr with that wait budget and a minute's
// lease, and prints what it got.
const handoffChildEnv = "FENCE_HANDOFF_CHILD"

// TestHandoffChild is the child of TestKilledWaiterProcessAtHead; it runs
// only with handoffChildEnv set.
func TestHandoffChild(t *testing.T) {
	spec := os.Getenv(handoffChildEnv)
	if spec == "" {
		return // not a child: nothing to do
	}
	var addr, name, wait string
	_, err := fmt.Sscan(spec, &addr, &name, &wait)
	budget, perr := time.ParseDuration(wait)
	if err != nil || perr != nil {
		fmt.Println("bad spec:", err, perr)
		os.Exit(2)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	l, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		fmt.Println("new:", err)
		os.Exit(2)
	}
	fmt.Println("waiting")
	ls, err := l.Acquire(context.Background(), name, fence.Wait(budget), fence.TTL(time.Minute))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("granted", ls.Token())
	select {} // until killed
}

// startWaiterProcess starts a child process that waits for name on srv
// with budget, and returns it once the child has said it is about to wait.
func startWaiterProcess(t *testing.T, srv *redistest.Server, name string, budget time.Duration) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHandoffChild$")
	cmd.Env = append(os.Environ(), handoffChildEnv+"="+fmt.Sprint(srv.Addr, " ", name, " ", budget))
	child.DieWithParent(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "waiting" {
		t.Fatalf("child: %q, %v", line, err)
	}
	return cmd, r
}

// TestKilledWaiterProcessAtHead: a waiter in another process, queued at
// the head, is killed with SIGKILL (no withdrawal, no closing of its
// connections: the server sees them reset). The release grants it the lock
// for what is left of its budget, not its lease (a minute), and the waiter
// behind it, in this process, gets the lock when that grant ends, with a
// larger token.
func TestKilledWaiterProcessAtHead(t *testing.T) {
	t.Parallel() // own server; mostly waits out the killed waiter's budget
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:killedhead"
	queue := lockKey(name) + ":queue"
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))

	const budget = 2 * time.Second
	began := time.Now()
	cmd, _ := startWaiterProcess(t, srv, name, budget)
	waitFor(t, func() bool { return admin.LLen(ctx(t), queue).Val() == 1 })
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	got := make(chan fence.Lease, 1)
	errs := make(chan error, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		errs <- err
		got <- ls
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), queue).Val() == 2 })
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatalf("the waiter behind the killed one: %v", err)
	}
	ls := <-got
	defer ls.Release(context.Background())
	if took := time.Since(began); took > budget+3*time.Second {
		t.Fatalf("the waiter behind the killed one got the lock %v after the killed one began waiting with a budget of %v", took, budget)
	}
	if ls.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", ls.Token(), holder.Token())
	}
}

// TestSubscriptionKilledJustBeforeGrant: the waiter's subscription
// connection is killed (CLIENT KILL TYPE pubsub) right before the release
// that grants it the lock: the grant is published to nobody. The waiter
// must still get the lock within moments (it tries again when it has
// subscribed again), not at the old holder's TTL (a minute) while the
// lock, granted to it, sits idle.
//
// The waiter's Locker is on a *redis.Client, then (rounds 3 to 5) on a
// struct embedding the redis.UniversalClient interface around one, which
// subscribes both ways on its one connection and must come back on both.
func TestSubscriptionKilledJustBeforeGrant(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:subkilled"
	for round := range 6 {
		holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
		waiter := newLocker(t, srv.Client(t))
		if round >= 3 { // (replica sync off: refused on a client it cannot identify only when it finds a cluster)
			waiter = lockerWith(t, interfaceWrapped{srv.Client(t)}, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
		}
		got := make(chan error, 1)
		go func() {
			ls, err := waiter.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
			if err == nil {
				err = ls.Release(ctx(t))
			}
			got <- err
		}()
		waitFor(t, func() bool { return subscribers(t, admin, name) == 1 })
		if round >= 3 {
			ch := lockKey(name) + ":released"
			waitFor(t, func() bool { return admin.PubSubShardNumSub(ctx(t), ch).Val()[ch] == 1 })
		}
		if err := admin.ClientKillByFilter(ctx(t), "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		if err := holder.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if took := time.Since(released); took > 5*time.Second {
			t.Fatalf("round %d: the waiter got the lock %v after the release", round, took)
		}
	}
}

// TestServerPausedAcrossWaiterDeadline: the server is paused (SIGSTOP)
// while the holder's release is on its way, and the budget of the waiter
// at the head of the queue ends during the pause. When the server goes on,
// the release must not grant the lock to that waiter (it has left, and its
// withdrawal is behind the release), but to the next one, at once.
func TestServerPausedAcrossWaiterDeadline(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:pausedhead"
	queue := lockKey(name) + ":queue"
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))

	short := make(chan error, 1)
	go func() {
		_, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(700*time.Millisecond), fence.TTL(time.Minute))
		short <- err
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), queue).Val() == 1 })
	next := make(chan fence.Lease, 1)
	nextErr := make(chan error, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		nextErr <- err
		next <- ls
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), queue).Val() == 2 })

	resume := srv.Pause(t)
	releaseErr := make(chan error, 1)
	go func() { releaseErr <- holder.Release(ctx(t)) }()
	if err := <-short; !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("the short waiter, its budget ended during the pause: %v", err)
	}
	resumed := time.Now()
	resume()
	if err := <-releaseErr; err != nil {
		t.Fatal(err)
	}
	if err := <-nextErr; err != nil {
		t.Fatal(err)
	}
	ls := <-next
	defer ls.Release(context.Background())
	if took := time.Since(resumed); took > 5*time.Second {
		t.Fatalf("the next waiter got the lock %v after the server went on", took)
	}
}

// TestServerRestartedUnderQueue: the server restarts without persistence
// while two waiters (two Lockers) queue behind a holder with a minute's
// lease: the lock, its queue and the grants published meanwhile are gone.
// Each waiter must get the lock soon after the server is back (their
// subscriptions come back and wake them), not at the old holder's TTL, one
// after the other, with tokens above the old holder's (the clock floor).
func TestServerRestartedUnderQueue(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:restarted-queue"
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	type result struct {
		token fence.Token
		err   error
	}
	got := make(chan result, 2)
	for i := range 2 {
		l := newLocker(t, srv.Client(t))
		go func() {
			ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
			if err != nil {
				got <- result{0, err}
				return
			}
			got <- result{ls.Token(), ls.Release(ctx(t))}
		}()
		waitFor(t, func() bool { return subscribers(t, admin, name) == int64(i+1) })
	}
	srv.Restart(t)
	restarted := time.Now()
	for range 2 {
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.token <= holder.Token() {
			t.Fatalf("token %d after the restart, not above the old holder's %d", r.token, holder.Token())
		}
	}
	if took := time.Since(restarted); took > 10*time.Second {
		t.Fatalf("the waiters got the lock %v after the restart", took)
	}
}

// TestWaiterCancelledAtGrant: the head waiter's context is cancelled at
// the moment the release grants it the lock (in rounds, the cancel a
// little before, at, or after the release). Its Acquire returns the
// cancellation or a lease (then released); either way the waiter behind
// it, in another Locker, gets the lock within moments, not when the
// cancelled waiter's grant of a minute would end.
func TestWaiterCancelledAtGrant(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:cancelled-at-grant"
	queue := lockKey(name) + ":queue"
	heads, nexts := newLocker(t, srv.Client(t)), newLocker(t, srv.Client(t))
	holders := newLocker(t, srv.Client(t))
	for round := range 12 {
		holder := acquire(t, holders, name, fence.TTL(time.Minute))
		hctx, cancel := context.WithCancel(ctx(t))
		defer cancel()
		headDone := make(chan error, 1)
		go func() {
			ls, err := heads.Acquire(hctx, name, fence.Wait(time.Minute), fence.TTL(time.Minute))
			if err == nil {
				err = ls.Release(ctx(t))
			}
			headDone <- err
		}()
		waitFor(t, func() bool { return admin.LLen(ctx(t), queue).Val() == 1 && subscribers(t, admin, name) == 1 })
		nextDone := make(chan error, 1)
		go func() {
			ls, err := nexts.Acquire(ctx(t), name, fence.Wait(time.Minute), fence.TTL(time.Minute))
			if err == nil {
				err = ls.Release(ctx(t))
			}
			nextDone <- err
		}()
		waitFor(t, func() bool { return admin.LLen(ctx(t), queue).Val() == 2 && subscribers(t, admin, name) == 2 })
		released := time.Now()
		switch round % 3 {
		case 0:
			cancel()
			_ = holder.Release(ctx(t))
		case 1:
			go cancel()
			_ = holder.Release(ctx(t))
		case 2:
			_ = holder.Release(ctx(t))
			cancel()
		}
		if err := <-headDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: the cancelled head: %v", round, err)
		}
		if err := <-nextDone; err != nil {
			t.Fatalf("round %d: the next waiter: %v", round, err)
		}
		if took := time.Since(released); took > 5*time.Second {
			t.Fatalf("round %d: the next waiter got the lock %v after the release", round, took)
		}
	}
}
