package redislock_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// forgedGrant is a grant message as the scripts publish it, to owner, for
// px ms, with a MAC nobody signed: what a client that may publish on the
// release channel, but cannot read fence's keys, can send.
func forgedGrant(owner string, px int64) string {
	return fmt.Sprintf("g %s %d %d 1 0 %040x", owner, int64(1)<<52, px, 0)
}

// TestForgedGrantsDoNotPostponeWaiters: a client that may publish on the
// lock's release channel but cannot read the keys sends two grants to an
// owner that does not wait: a short one, then one for a very long time.
// A waiter cannot check a grant to another owner (it does not know that
// owner's secret), and it moves its timer to the end of such grants (the
// lock is granted on: see Locker.deliver). The holder then dies: nobody
// releases, its lock expires, and only the waiter's timer, at the
// holder's TTL, brings it to try. A forger must not be able to move that
// timer past the holder's TTL: the waiter would sleep through its whole
// budget, with the lock free, and end with ErrHeld.
func TestForgedGrantsDoNotPostponeWaiters(t *testing.T) {
	t.Parallel() // own servers; mostly waits out the dead holder's TTL (1 s slack)
	t.Run("sync-off", func(t *testing.T) {
		srv := redistest.Start(t)
		forgedPostpone(t, srv, srv.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	})
	t.Run("sync-on", func(t *testing.T) {
		primary := redistest.Start(t)
		redistest.StartReplica(t, primary)
		redistest.WaitReplicated(t, primary, 1)
		forgedPostpone(t, primary, primary.Client(t), redislock.Options{})
	})
}

func forgedPostpone(t *testing.T, srv *redistest.Server, forger *redis.Client, o redislock.Options) {
	const name, holderTTL, budget = "lock:forged-postpone", 500 * time.Millisecond, 4 * time.Second
	admin := srv.Client(t)
	// The holder dies holding the lock: nobody releases it.
	crashed := redis.NewClient(&redis.Options{Addr: srv.Addr})
	acquire(t, lockerWith(t, crashed, o), name, fence.TTL(holderTTL))
	_ = crashed.Close()
	start := time.Now()

	got := make(chan error, 1)
	go func() {
		ls, err := lockerWith(t, srv.Client(t), o).Acquire(ctx(t), name, fence.Wait(budget), fence.TTL(time.Second))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	waitFor(t, func() bool { return subscribers(t, admin, name) == 1 })
	other := fmt.Sprintf("%032x", 7)
	ch := lockKey(name) + ":released"
	for _, px := range []int64{100, 1e9} {
		if err := forger.Publish(ctx(t), ch, forgedGrant(other, px)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter, after two forged grants to another owner, %v after the holder (TTL %v) died: %v", time.Since(start).Round(time.Millisecond), holderTTL, err)
	}
	if took := time.Since(start); took > holderTTL+time.Second {
		t.Fatalf("the waiter took the lock %v after the holder (TTL %v) died", took, holderTTL)
	}
}

// TestReplayedGrantAfterSyncLowered: with replica sync, a waiter is
// granted the lock (grant G), confirms it with a try, and the replica,
// cut off, does not acknowledge: it keeps the lock and tries again. (Here
// the replica is killed; the waiter's WAIT finds it gone.) The lock, which
// no replica has, is lost (a failover to a replica would lose it; a DEL
// stands for that here), and a Locker without replica sync (another
// process) takes it; the waiter's next try queues it. (Until a refused
// waiter kept its grant, its give-back granted the lock to that other
// Locker's waiter.) An operator, the replica being gone, lowers the
// expected replica count to zero. A client that may publish and
// subscribe on the release channel (but cannot read the keys) captured G
// and now replays it: G is signed with the waiter's secret, was made
// after one of its tries, gives a whole lease and is young (within a
// quarter of the lease of that try). With no replica sync applying to its
// last try, the waiter takes it without a confirming try: it holds a
// lease on a lock that the other waiter holds, with a smaller token.
func TestReplayedGrantAfterSyncLowered(t *testing.T) {
	t.Parallel() // own servers; mostly waits on grants
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name = "lock:replayed"
	lock := lockKey(name)
	synced := redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}}
	holder := acquire(t, lockerWith(t, primary.Client(t), synced), name, fence.TTL(time.Minute))
	refused := make(chan struct{}, 16)
	lw := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: synced.ReplicaSync, Logger: slog.New(signalHandler{refused})})
	type result struct {
		ls  fence.Lease
		err error
	}
	wGot, yGot := make(chan result, 1), make(chan result, 1)
	go func() {
		ls, err := lw.Acquire(ctx(t), name, fence.Wait(time.Minute), fence.TTL(20*time.Second))
		wGot <- result{ls, err}
	}()
	waitFor(t, func() bool { return subscribers(t, admin, name) == 1 && admin.LLen(ctx(t), lock+":queue").Val() == 1 })
	wOwner := admin.LIndex(ctx(t), lock+":queue", 0).Val()

	// The forger captures the grant to the waiter.
	ps := primary.Client(t).Subscribe(ctx(t), lock+":released")
	defer ps.Close()
	if _, err := ps.Receive(ctx(t)); err != nil {
		t.Fatal(err)
	}

	replica.Kill() // the replica is lost
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	var grant string
	for grant == "" {
		m, err := ps.ReceiveMessage(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(m.Payload, "g "+wOwner+" ") {
			grant = m.Payload
		}
	}
	// The waiter's confirmations are refused; its back-off after the
	// eighth is half a second or more (pause.Backoff): the lock is lost
	// then, and another process takes it.
	for i := range 8 {
		select {
		case <-refused:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d refused confirmations in 10 s", i)
		}
	}
	if admin.Get(ctx(t), lock).Val() != wOwner {
		t.Fatalf("the lock is %q, not kept by the refused waiter %q", admin.Get(ctx(t), lock).Val(), wOwner)
	}
	if err := admin.Del(ctx(t), lock).Err(); err != nil {
		t.Fatal(err)
	}
	ly := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	go func() {
		ls, err := ly.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		yGot <- result{ls, err}
	}()
	y := <-yGot
	if y.err != nil {
		t.Fatal(y.err)
	}
	defer y.ls.Release(ctx(t))
	waitFor(t, func() bool { return admin.LIndex(ctx(t), lock+":queue", 0).Val() == wOwner }) // queued behind y
	// The operator lowers the expected count: the replica is gone.
	if err := lw.SetExpectedReplicas(ctx(t), name, 0); err != nil {
		t.Fatal(err)
	}
	// Replay the grant for 2 s (the waiter confirms the first it reads by
	// a try, which finds the lock held, without replica sync now).
	stop := time.Now().Add(2 * time.Second)
	for time.Now().Before(stop) {
		if err := admin.Publish(ctx(t), lock+":released", grant).Err(); err != nil {
			t.Fatal(err)
		}
		select {
		case w := <-wGot:
			if w.err == nil {
				defer w.ls.Release(ctx(t))
				t.Fatalf("a replayed grant gave the waiter token %d while the lock is held by another owner (%s, token %d): two holders",
					w.ls.Token(), admin.Get(ctx(t), lock).Val(), y.ls.Token())
			}
			t.Fatalf("the waiter: %v", w.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := y.ls.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	w := <-wGot
	if w.err != nil {
		t.Fatal(w.err)
	}
	if w.ls.Token() <= y.ls.Token() {
		t.Fatalf("the waiter's token %d, after %d", w.ls.Token(), y.ls.Token())
	}
	_ = w.ls.Release(ctx(t))
}
