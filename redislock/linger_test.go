package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// unreadRenewal returns a lease of 2 s whose Extend(30 s) ran on Redis,
// moving the lock 30 s ahead, but whose reply came only after Extend had
// given up on it (its request held on the way for 200 ms): Extend failed,
// and the lease keeps its 2 s deadline, at which it has ended.
func unreadRenewal(t *testing.T, name string) (fence.Lease, *redis.Client) {
	t.Helper()
	lease, admin := unreadRenewalHeld(t, name, 2*time.Second)
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	return lease, admin
}

// unreadRenewalHeld is unreadRenewal for a lease of ttl, returned while it
// is still held.
func unreadRenewalHeld(t *testing.T, name string, ttl time.Duration) (fence.Lease, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	// 30000 ms, the renewal's lease ms argument, on its own line of the
	// request: nothing else sends it.
	h := redistest.NewHolder("\r\n30000\r\n")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: h.Dial})
	t.Cleanup(func() { _ = c.Close() })
	l := newLockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	lease, err := l.Acquire(ctx(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctx(t), ttl); err != nil { // loads the script
		t.Fatal(err)
	}
	h.Arm()
	short, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
	err = lease.Extend(short, 30*time.Second)
	cancel()
	if err == nil || h.Held() != 1 {
		t.Fatalf("the held renewal: Extend = %v with %d requests held; want a deadline error and 1", err, h.Held())
	}
	h.Disarm()
	if err := h.Let(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return admin.PTTL(ctx(t), lockKey(name)).Val() > 10*time.Second })
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended before its deadline: %v", err)
	}
	return lease, admin
}

// TestReleaseAfterUnreadRenewalFreesLock: a holder that calls Release once
// its lease has ended (a deferred Release) gets the lease's error, and the
// lock, still its own on Redis (the unread renewal moved it 30 s ahead), is
// deleted.
func TestReleaseAfterUnreadRenewalFreesLock(t *testing.T) {
	t.Parallel() // own server; mostly waits for the lease to end
	const name = "unread-renewal-release"
	lease, admin := unreadRenewal(t, name)
	if err := lease.Release(ctx(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of the ended lease = %v, want ErrLeaseLost", err)
	}
	if n := admin.Exists(ctx(t), lockKey(name)).Val(); n != 0 {
		t.Fatalf("locked for %v more after Release of the ended lease", admin.PTTL(ctx(t), lockKey(name)).Val())
	}
}

// TestUnreadRenewalGivenBackAtLeaseEnd: a renewal that moved the lock 30 s
// ahead but whose reply came after Extend gave up (the lease still held
// then) does not move the deadline; when the lease ends there, unreleased,
// the lock must be given back rather than held by nobody for the rest of
// the 30 s.
func TestUnreadRenewalGivenBackAtLeaseEnd(t *testing.T) {
	t.Parallel() // own server; mostly waits for the lease to end
	const name = "unread-renewal-linger"
	_, admin := unreadRenewal(t, name)
	awaitUnlocked(t, admin, name, 5*time.Second, "the lease ended at its deadline")
}

// TestLostRenewalReplyGivenBackAtLeaseEnd: a renewal sent to a paused
// server times out on the client's read (the connection is dropped, and
// its reply with it) and runs once the server resumes, before the lease's
// deadline: the lock moves 30 s ahead, the deadline does not. When the
// lease ends there, unreleased, the lock must be given back.
func TestLostRenewalReplyGivenBackAtLeaseEnd(t *testing.T) {
	t.Parallel() // own server; mostly waits for the lease to end
	srv := redistest.Start(t)
	admin := srv.Client(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l := newLockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lost-renewal-reply"
	lease, err := l.Acquire(ctx(t), name, fence.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctx(t), 3*time.Second); err != nil { // loads the script
		t.Fatal(err)
	}
	resume := srv.Pause(t)
	err = lease.Extend(ctx(t), 30*time.Second)
	resume()
	if err == nil {
		t.Fatal("Extend with its reply lost returned nil")
	}
	waitFor(t, func() bool { return admin.PTTL(ctx(t), lockKey(name)).Val() > 10*time.Second })
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended before its deadline: %v", err)
	}
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	awaitUnlocked(t, admin, name, 5*time.Second, "the lease ended at its deadline")
	if err := lease.Release(ctx(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of the ended lease = %v, want ErrLeaseLost", err)
	}
}

// awaitUnlocked waits up to within for the lock of name to be gone, and
// fails naming what it came after ("the lease ended at its deadline").
func awaitUnlocked(t *testing.T, admin *redis.Client, name string, within time.Duration, after string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for admin.Exists(ctx(t), lockKey(name)).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still locked, for %v more, %v after %s", admin.PTTL(ctx(t), lockKey(name)).Val(), within, after)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}
