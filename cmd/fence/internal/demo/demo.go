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
	"os"
	"os/exec"
	"path/filepath"
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
// be told (a server failed to start, ctx ended, a write to w failed: Run
// stops at the first, with that error); a story whose outcome differs from
// the article's also returns an error, because the demo would be lying.
func Run(ctx context.Context, w io.Writer, o Options) error {
	// A reader that goes away (fence demo | head) ends the demo as Ctrl-C
	// does, cleaning up, rather than letting it tell the rest to nobody.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	tl := &timeline{w: &stopWriter{w: w, stop: stop}, color: o.Color}
	err := run(ctx, tl, o)
	if cause := context.Cause(ctx); err != nil && cause != ctx.Err() {
		return cause
	}
	return err
}

// stopWriter stops the demo at its first failed write.
type stopWriter struct {
	w    io.Writer
	stop context.CancelCauseFunc
}

func (s *stopWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err != nil {
		s.stop(fmt.Errorf("writing the stories: %w", err))
	}
	return n, err
}

func run(ctx context.Context, tl *timeline, o Options) error {
	tl.note("fence demo: the article's stories, told live.\n" +
		"Payment 1001 (5000) waits for approval. Every approval takes lock:payment:1001 (wait 2 s,\n" +
		"lease 10 s), reads the payment, and charges it. Each acquisition gets a fencing token: the\n" +
		"Redis server's clock in microseconds, or the last token + 1 if that is larger.")
	stories := []func(context.Context, *timeline, int) error{
		writesLast(unfenced), writesLast(tokenOnly), writesFirst(tokenOnly), writesFirst(fenced),
	}
	for i, story := range stories {
		if err := story(ctx, tl, i+1); err != nil {
			return err
		}
	}
	n := len(stories)
	switch _, err := exec.LookPath("redis-server"); {
	case o.SkipFailover:
	case err != nil:
		tl.note("\nThe failover stories need redis-server on the PATH (apt-get install -y redis-server); skipped.")
	default:
		for i, synced := range []bool{false, true} {
			if err := failover(ctx, tl, n+i+1, synced); err != nil {
				return err
			}
		}
	}
	tl.note("\nHolding a lock never proves you still hold it. Pass the token with every write and let the\n" +
		"resource reject older ones (package guard), fencing first and reading after the fence, in one\n" +
		"transaction (guard.Tx); confirm acquisitions on replicas (redislock's ReplicaSync, on by default).")
	return nil
}

// The three ways to approve, from worst to right.
type approval int

const (
	unfenced  approval = iota // a plain UPDATE
	tokenOnly                 // the article's conditional update, the payment read before it
	fenced                    // guard.Tx: fence, then read, then write
)

func (ap approval) approve(s *payment.Service) func(context.Context, int64, string) (fence.Token, error) {
	switch ap {
	case unfenced:
		return s.ApproveWithoutFencing
	case tokenOnly:
		return s.ApproveTokenOnly
	}
	return s.Approve
}

func (ap approval) String() string {
	switch ap {
	case unfenced:
		return "without fencing: the approval is a plain UPDATE"
	case tokenOnly:
		return "with the article's fencing: read, then UPDATE … WHERE last_fencing_token < token"
	}
	return "with the fenced read-modify-write: fence, read and write in one transaction (guard.Tx)"
}

// world is a story's embedded Redis and SQLite, with payment 1001 pending.
type world struct {
	mr     *miniredis.Miniredis
	locker fence.Locker
	db     *sql.DB
	close  func()
}

func newWorld(ctx context.Context) (*world, error) {
	mr, err := miniredis.Run()
	if err != nil {
		return nil, err
	}
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	dir, err := os.MkdirTemp("", "fence-demo")
	if err != nil {
		mr.Close()
		return nil, err
	}
	db, err := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(dir, "payments.db")))
	w := &world{mr: mr, db: db, close: func() {
		if db != nil {
			_ = db.Close()
		}
		_ = client.Close()
		mr.Close()
		_ = os.RemoveAll(dir)
	}}
	if err == nil {
		w.locker, err = redislock.New(client, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	}
	if err == nil {
		err = payment.CreateSchema(ctx, db)
	}
	if err == nil {
		err = payment.Insert(ctx, db, 1001, 5000)
	}
	if err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// expire ends A's lease: the embedded Redis's clock moves past it.
func (w *world) expire(tl *timeline) {
	w.mr.FastForward(payment.LockLease + 500*time.Millisecond)
	tl.say("redis", "A's 10 s lease runs out (the embedded Redis's clock moves forward 10.5 s)")
}

// writesLast is section 3 of the article: A reads, pauses past its lease;
// B approves; A wakes up and writes last.
func writesLast(ap approval) func(context.Context, *timeline, int) error {
	return func(ctx context.Context, tl *timeline, n int) error {
		tl.title(n, "a worker pauses past its lease and writes last, "+ap.String(),
			"embedded Redis (miniredis) and SQLite, nothing to install")
		w, err := newWorld(ctx)
		if err != nil {
			return err
		}
		defer w.close()
		b := &payment.Service{Locker: w.locker, DB: w.db, Pause: func(_ context.Context, step payment.Step, _ int64, token fence.Token) {
			if step == payment.Read {
				tl.say("worker B", fmt.Sprintf("acquires lock:payment:1001 with token %d; reads PENDING", token))
			}
		}}
		var tokenB fence.Token
		var errB error
		a := &payment.Service{Locker: w.locker, DB: w.db, Pause: func(ctx context.Context, step payment.Step, _ int64, token fence.Token) {
			if step != payment.Read {
				return
			}
			tl.say("worker A", fmt.Sprintf("holds lock:payment:1001 with token %d", token))
			tl.say("worker A", "reads payment 1001: PENDING, 5000 … and pauses (a long GC pause)")
			w.expire(tl)
			if tokenB, errB = ap.approve(b)(ctx, 1001, "B"); errB == nil {
				tl.say("worker B", "approves payment 1001 and charges 5000")
			}
			tl.say("worker A", "wakes up, still sure it holds the lock, and approves with its token")
		}}
		_, errA := ap.approve(a)(ctx, 1001, "A")
		if errB != nil {
			return fmt.Errorf("worker B: %w", errB)
		}
		charges, p, err := outcome(ctx, w.db)
		if err != nil {
			return err
		}
		var stale *guard.StaleError
		switch {
		case ap == unfenced && len(charges) == 2:
			tl.bad("database", "A's write is ACCEPTED")
			tl.result(false, fmt.Sprintf("payment 1001 charged twice (10000), approved by %s; B's approval overwritten", p.ApprovedBy))
		case ap != unfenced && errors.As(errA, &stale) && len(charges) == 1:
			tl.good("database", fmt.Sprintf("A's write is REJECTED: token %d < %d already accepted", stale.Token, stale.Last))
			tl.result(true, fmt.Sprintf("payment 1001 charged once (5000), approved by %s with token %d", p.ApprovedBy, tokenB))
		default:
			return fmt.Errorf("story %d did not go as the article says: A: %v; %d charges", n, errA, len(charges))
		}
		return nil
	}
}

// writesFirst is issue 10's story, the hole in the article's fix: A reads,
// pauses past its lease; B acquires and starts; A wakes up and writes
// FIRST, then B goes on.
func writesFirst(ap approval) func(context.Context, *timeline, int) error {
	return func(ctx context.Context, tl *timeline, n int) error {
		tl.title(n, "a worker pauses past its lease and writes FIRST, "+ap.String(),
			"embedded Redis (miniredis) and SQLite, nothing to install")
		w, err := newWorld(ctx)
		if err != nil {
			return err
		}
		defer w.close()
		bStarted, bRead, bGo := make(chan struct{}), make(chan struct{}), make(chan struct{})
		b := &payment.Service{Locker: w.locker, DB: w.db, Pause: func(_ context.Context, step payment.Step, _ int64, token fence.Token) {
			switch step {
			case payment.Locked:
				if ap == fenced {
					tl.say("worker B", fmt.Sprintf("acquires lock:payment:1001 with token %d; its fence waits for A's transaction", token))
				} else {
					tl.say("worker B", fmt.Sprintf("acquires lock:payment:1001 with token %d", token))
				}
				close(bStarted)
			case payment.Read:
				tl.say("worker B", "reads payment 1001: PENDING … and is slow to write")
				close(bRead)
				<-bGo
			}
		}}
		var errB error
		bDone := make(chan struct{})
		storyCtx := ctx // B is another request: A's contexts end when A returns
		a := &payment.Service{Locker: w.locker, DB: w.db, Pause: func(ctx context.Context, step payment.Step, _ int64, token fence.Token) {
			switch step {
			case payment.Read:
				tl.say("worker A", fmt.Sprintf("holds lock:payment:1001 with token %d", token))
				if ap == fenced {
					tl.say("worker A", fmt.Sprintf("fences payment:1001 with token %d, reads PENDING, 5000 … and pauses", token))
				} else {
					tl.say("worker A", "reads payment 1001: PENDING, 5000 … and pauses (a long GC pause)")
				}
				w.expire(tl)
				go func() { defer close(bDone); _, errB = ap.approve(b)(storyCtx, 1001, "B") }()
				// B may fail before it gets there (Ctrl-C, a Redis error):
				// then A goes on, and the story reports B's error.
				select {
				case <-bStarted:
				case <-bDone:
				}
				if ap != fenced {
					select {
					case <-bRead:
					case <-bDone:
					}
				}
				tl.say("worker A", "wakes up, still sure it holds the lock, and approves with its token")
			case payment.Written:
				if ap == fenced {
					tl.say("database", "A's write is accepted: the payment was pending when A read it, after its fence")
				} else {
					tl.bad("database", fmt.Sprintf("A's stale write is ACCEPTED: its token %d is the newest the payment has seen", token))
				}
			}
		}}
		_, errA := ap.approve(a)(ctx, 1001, "A")
		close(bGo)
		<-bDone
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("story %d interrupted: %w", n, err)
		}
		if errA != nil && !errors.Is(errA, fence.ErrLeaseLost) {
			return fmt.Errorf("worker A: %w", errA)
		}
		charges, p, err := outcome(ctx, w.db)
		if err != nil {
			return err
		}
		switch {
		case ap != fenced && errB == nil && len(charges) == 2:
			tl.bad("worker B", fmt.Sprintf("writes with token %d > %d: ACCEPTED too, and charges 5000", charges[1].Token, charges[0].Token))
			tl.result(false, "payment 1001 charged twice (10000): the token ordered the writes, but B acted on a read taken before A's write")
		case ap == fenced && errors.Is(errB, payment.ErrAlreadyApproved) && len(charges) == 1:
			tl.good("worker B", "once A's transaction commits, B's fence passes and B reads APPROVED: it charges nothing")
			tl.result(true, fmt.Sprintf("payment 1001 charged once (5000), approved by %s: the read came after the fence", p.ApprovedBy))
		default:
			return fmt.Errorf("story %d did not go as told: A: %v; B: %v; %d charges", n, errA, errB, len(charges))
		}
		return nil
	}
}

func outcome(ctx context.Context, db *sql.DB) ([]payment.Charge, payment.Payment, error) {
	charges, err := payment.Charges(ctx, db, 1001)
	if err != nil {
		return nil, payment.Payment{}, err
	}
	p, err := payment.Get(ctx, db, 1001)
	return charges, p, err
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
	primary, replicas, err := redisserver.StartReplicated(1)
	if err != nil {
		return err
	}
	defer primary.Close()
	replica := replicas[0]
	defer replica.Close()
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
