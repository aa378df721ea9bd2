// Package demo tells the article's stories live for `fence demo`: a worker
// that pauses past its lease (on an embedded Redis and SQLite, nothing to
// install), and, where redis-server is on the PATH, a failover that loses a
// lock, on real processes.
package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redisserver"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the embedded database
)

// Options of Run.
type Options struct {
	Color bool // ANSI colours (for a terminal)
	// SkipFailover leaves out the stories that need redis-server, even
	// when it is on the PATH.
	SkipFailover bool
}

// Run tells the stories to w. It returns an error only if a story could not
// be told (a server failed to start); a story whose outcome differs from
// the article's also returns an error, because the demo would be lying.
func Run(ctx context.Context, w io.Writer, o Options) error {
	tl := &timeline{w: w, color: o.Color}
	tl.note("fence demo: the article's stories, told live.\n" +
		"Payment 1001 (5000) waits for approval. Every approval takes lock:payment:1001 (wait 2 s,\n" +
		"lease 10 s), reads the payment, and charges it. Each acquisition gets a fencing token: the\n" +
		"Redis server's clock in microseconds, or the last token + 1 if that is larger.")
	for i, fenced := range []bool{false, true} {
		if err := pausedWorker(ctx, tl, i+1, fenced); err != nil {
			return err
		}
	}
	switch _, err := exec.LookPath("redis-server"); {
	case o.SkipFailover:
	case err != nil:
		tl.note("\nThe failover stories need redis-server on the PATH (apt-get install -y redis-server); skipped.")
	default:
		for i, synced := range []bool{false, true} {
			if err := failover(ctx, tl, i+3, synced); err != nil {
				return err
			}
		}
	}
	tl.note("\nHolding a lock never proves you still hold it. Pass the token with every write and let the\n" +
		"resource reject older ones (package guard); confirm acquisitions on replicas (redislock's\n" +
		"ReplicaSync, on by default).")
	return nil
}

// pausedWorker is section 3 of the article: A pauses past its lease, B
// approves, A wakes up and writes.
func pausedWorker(ctx context.Context, tl *timeline, n int, fenced bool) error {
	how := "without fencing: the approval is a plain UPDATE"
	if fenced {
		how = "with fencing: UPDATE … WHERE id = 1001 AND last_fencing_token < token"
	}
	tl.title(n, "a worker pauses past its lease, "+how,
		"embedded Redis (miniredis) and SQLite in memory")

	mr, err := miniredis.Run()
	if err != nil {
		return err
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	locker, err := redislock.New(client, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		return err
	}
	db, err := sql.Open("sqlite", fmt.Sprintf("file:demo%d?mode=memory&cache=shared", n))
	if err != nil {
		return err
	}
	defer db.Close()
	if err := payment.CreateSchema(ctx, db); err != nil {
		return err
	}
	if err := payment.Insert(ctx, db, 1001, 5000); err != nil {
		return err
	}

	b := &payment.Service{Locker: locker, DB: db}
	var tokenB fence.Token
	var errB error
	a := &payment.Service{Locker: locker, DB: db, AfterRead: func(ctx context.Context, id int64, token fence.Token) {
		tl.say("worker A", fmt.Sprintf("holds lock:payment:1001 with token %d", token))
		tl.say("worker A", "reads payment 1001: PENDING, 5000 … and pauses (a long GC pause)")
		mr.FastForward(payment.LockLease + 500*time.Millisecond)
		tl.say("redis", "A's 10 s lease runs out (the embedded Redis's clock moves forward 10.5 s)")
		b.AfterRead = func(_ context.Context, _ int64, token fence.Token) {
			tl.say("worker B", fmt.Sprintf("acquires lock:payment:1001 with token %d; reads PENDING", token))
		}
		tokenB, errB = b.Approve(ctx, id, "B")
		if errB == nil {
			tl.say("worker B", "approves payment 1001 and charges 5000")
		}
		tl.say("worker A", "wakes up, still sure it holds the lock, and approves with its token")
	}}
	approve := a.ApproveWithoutFencing
	if fenced {
		approve = a.Approve
	}
	_, errA := approve(ctx, 1001, "A")
	if errB != nil {
		return fmt.Errorf("worker B: %w", errB)
	}
	charges, err := payment.Charges(ctx, db, 1001)
	if err != nil {
		return err
	}
	p, err := payment.Get(ctx, db, 1001)
	if err != nil {
		return err
	}
	var stale *guard.StaleError
	switch {
	case !fenced && len(charges) == 2:
		tl.bad("database", "A's write is ACCEPTED")
		tl.result(false, fmt.Sprintf("payment 1001 charged twice (10000), approved by %s; B's approval overwritten", p.ApprovedBy))
	case fenced && errors.As(errA, &stale) && len(charges) == 1:
		tl.good("database", fmt.Sprintf("A's write is REJECTED: token %d < %d already accepted", stale.Token, stale.Last))
		tl.result(true, fmt.Sprintf("payment 1001 charged once (5000), approved by %s with token %d", p.ApprovedBy, tokenB))
	default:
		return fmt.Errorf("story %d did not go as the article says: A: %v; %d charges", n, errA, len(charges))
	}
	return nil
}

// failover is section 2 of the article on real processes: the primary dies
// before its replica has the lock, the replica is promoted, and a second
// worker takes the same lock; with the replica sync check, the first
// acquisition is refused instead.
func failover(ctx context.Context, tl *timeline, n int, synced bool) error {
	how := "without the replica sync check"
	if synced {
		how = "with the replica sync check (WAIT, 1 replica, 1 s)"
	}
	tl.title(n, "the primary fails before its replica has the lock, "+how,
		"real redis-server processes: a primary and its replica")
	primary, err := redisserver.Start("")
	if err != nil {
		return err
	}
	defer primary.Close()
	replica, err := redisserver.StartReplica("", primary)
	if err != nil {
		return err
	}
	defer replica.Close()
	if err := redisserver.WaitReplicated(primary, 1, 30*time.Second); err != nil {
		return err
	}
	pc := redis.NewClient(&redis.Options{Addr: primary.Addr, MaxRetries: -1})
	defer pc.Close()
	a, err := redislock.New(pc, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !synced}})
	if err != nil {
		return err
	}
	// A has been running for a while: it has seen its replica.
	if err := fence.Run(ctx, a, "warm-up", func(context.Context, fence.Lease) error { return nil }); err != nil {
		return err
	}
	tl.restart()
	tl.say("primary", fmt.Sprintf("%s replicates to %s", primary.Addr, replica.Addr))

	if err := redisserver.CutLink(ctx, primary, replica); err != nil {
		return err
	}
	tl.say("network", "the replica's link breaks (replica paused, its connection killed)")

	leaseA, errA := a.Acquire(ctx, "lock:payment:1001", fence.TTL(payment.LockLease))
	var nr *fence.NotReplicatedError
	switch {
	case errA == nil:
		tl.say("worker A", fmt.Sprintf("acquires lock:payment:1001 on the primary, token %d; starts approving", leaseA.Token()))
	case errors.As(errA, &nr):
		tl.good("worker A", fmt.Sprintf("is REFUSED: %d of %d replicas acknowledged within 1 s; the lock is released", nr.Acked, nr.Required))
	default:
		return fmt.Errorf("worker A: %w", errA)
	}

	if err := redisserver.Failover(ctx, primary, replica); err != nil {
		return err
	}
	tl.say("primary", "crashes (SIGKILL)")
	tl.say("replica", "is promoted to primary (REPLICAOF NO ONE)")
	rc := replica.Client()
	defer rc.Close()
	b, err := redislock.New(rc, nil)
	if err != nil {
		return err
	}
	leaseB, errB := b.Acquire(ctx, "lock:payment:1001", fence.TTL(payment.LockLease))
	if errB != nil {
		return fmt.Errorf("worker B: %w", errB)
	}
	defer leaseB.Release(ctx)
	switch {
	case errA == nil:
		tl.bad("worker B", fmt.Sprintf("acquires the same lock on the new primary, token %d", leaseB.Token()))
		tl.result(false, fmt.Sprintf("two workers hold lock:payment:1001 at once; only the resource's token check (%d < %d) can still tell them apart", leaseA.Token(), leaseB.Token()))
	default:
		tl.say("worker B", fmt.Sprintf("acquires lock:payment:1001 on the new primary, token %d", leaseB.Token()))
		tl.result(true, "one holder: A never started, because its lock was never safe")
	}
	return nil
}
