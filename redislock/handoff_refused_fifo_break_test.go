package redislock_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// signalHandler is a slog.Handler that signals each record on a channel.
type signalHandler struct{ c chan struct{} }

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(context.Context, slog.Record) error {
	select {
	case h.c <- struct{}{}:
	default:
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// TestRefusedGrantKeepsPlace: waiters of two Lockers (as two processes)
// queue in order, first then second, with replica sync on. The replica
// stops while the lock is handed to the first: its confirmation of the
// grant is refused (too few acknowledgements), and the lock, given back,
// is granted to the second, while the first queues again, behind it. Once
// the replica is back, the first in line should get the lock first.
func TestRefusedGrantKeepsPlace(t *testing.T) {
	if os.Getenv("FENCE_RUN_SKIPPED") == "" {
		t.Skip("design question: a waiter whose confirmation of a grant is refused by replica sync gives the lock back (granted to the next " +
			"waiter) and queues again at the tail, so after a replica's hiccup the second waiter gets the lock first (FIFO across processes " +
			"lost; with FENCE_RUN_SKIPPED=1: the second waiter first). Fix I would choose: the give-back of a refused grant confirmation " +
			"(release.lua with a flag) keeps the owner at the head of the queue, its entry kept, and grants nobody else; the refused " +
			"waiter's next try then finds the lock its own again. That changes who holds a lock no replica confirms, and how long others " +
			"wait behind one waiter's retries, so it is not built here")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name = "lock:refused-fifo"
	sync := redislock.ReplicaSync{Timeout: 200 * time.Millisecond}
	holder := acquire(t, lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync}), name, fence.TTL(time.Minute))
	refused := make(chan struct{}, 1)
	first := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync, Logger: slog.New(signalHandler{refused})})
	second := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync})
	order := make(chan string, 2)
	wait := func(l *redislock.Locker, who string) {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err != nil {
			order <- who + " failed (" + err.Error() + ")"
			return
		}
		order <- who
		_ = ls.Release(context.Background())
	}
	go wait(first, "first")
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 && subscribers(t, admin, name) == 1
	})
	go wait(second, "second")
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 2 && subscribers(t, admin, name) == 2
	})

	resume := replica.Pause(t)
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	<-refused // the first's confirmation of its grant
	resume()
	if got := <-order; got != "first" {
		t.Fatalf("after the refused confirmation, %s waiter got the lock first; want the first in line", got)
	}
	if got := <-order; got != "second" {
		t.Fatalf("then %s; want the second", got)
	}
}
