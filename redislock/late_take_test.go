package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// lateTake is a server, an admin client and a Locker whose client's
// requests pass through a transit that can hold one acquire try (an
// EVALSHA with acquire.lua's 5 keys, the lock first) on its way.
type lateTake struct {
	srv   *redistest.Server
	admin *redis.Client
	tr    *transit
	l     *redislock.Locker
	name  string
}

func newLateTake(t *testing.T, name string) *lateTake {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	// Scripts loaded, so that a try is one EVALSHA.
	if err := acquire(t, lockerWith(t, srv.Client(t), redislock.Options{}), "lock:warm-up").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lock := lockKey(name)
	tr := &transit{match: fmt.Appendf(nil, "$1\r\n5\r\n$%d\r\n%s\r\n", len(lock), lock)}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: tr.dial, ReadTimeout: 10 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return &lateTake{srv: srv, admin: admin, tr: tr, l: lockerWith(t, c, redislock.Options{}), name: name}
}

// deliverAfter lets a lease of ttl, taken now on another name, run out
// (the held try was sent before it), then sends the held try: its reply
// comes past the deadline of the lease it takes.
func (s *lateTake) deliverAfter(t *testing.T, ttl time.Duration) {
	t.Helper()
	waitFor(t, s.tr.holding)
	probe, err := lockerWith(t, s.srv.Client(t), redislock.Options{}).Acquire(ctx(t), s.name+":probe", fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-probe.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("probe lease not over after 10 s")
	}
	if err := s.tr.deliver(); err != nil {
		t.Fatal(err)
	}
}

// revoked counts the name's revocation marks.
func (s *lateTake) revoked(t *testing.T) int {
	t.Helper()
	keys, err := s.admin.Keys(ctx(t), lockKey(s.name)+":revoked:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// queueBehind starts an Acquire of s.name with opts (a wait budget among
// them) on s's Locker, whose lock is held, and waits until the Acquire
// has queued and subscribed: its first try queues it; subscribed, it tries
// once more at once (a grant may have fallen in between), then waits.
func (s *lateTake) queueBehind(t *testing.T, opts ...fence.Option) <-chan acquired {
	t.Helper()
	before := commandCalls(t, s.admin, "evalsha")
	got := acquireAsync(s.l, s.name, opts...)
	released := lockKey(s.name) + ":released"
	waitFor(t, func() bool { return commandCalls(t, s.admin, "evalsha") >= before+2 })
	waitFor(t, func() bool { return s.admin.PubSubNumSub(ctx(t), released).Val()[released] > 0 })
	return got
}

// releaseToConfirm lets since (more than a quarter of the waiter's lease
// time) pass from the queued waiter's last try, arms the transit and
// releases holder: the grant to the waiter is confirmed by a try (one
// older than a quarter of the lease gives no lease by itself), held on
// its way.
func (s *lateTake) releaseToConfirm(t *testing.T, holder fence.Lease, since time.Duration) {
	t.Helper()
	probe, err := lockerWith(t, s.srv.Client(t), redislock.Options{}).Acquire(ctx(t), s.name+":probe0", fence.TTL(since))
	if err != nil {
		t.Fatal(err)
	}
	<-probe.Done()
	s.tr.arm()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func acquireAsync(l *redislock.Locker, name string, opts ...fence.Option) <-chan acquired {
	got := make(chan acquired, 1)
	go func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ls, err := l.Acquire(c, name, opts...)
		got <- acquired{ls, err}
	}()
	return got
}

type acquired struct {
	lease fence.Lease
	err   error
}

func (a acquired) wait(t *testing.T, got <-chan acquired) acquired {
	t.Helper()
	select {
	case a = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("Acquire has not returned after 20 s")
	}
	if a.lease != nil {
		t.Cleanup(func() { _ = a.lease.Release(context.Background()) })
	}
	return a
}

// TestLateTakeTryOnce: a try-once Acquire's try is delayed on its way (a
// paused or starved server does the same) until the lease time has passed
// since it was sent; then it takes the free lock. Acquire returned a lease
// whose deadline had passed ("lease lost: its lease time ran out" at once),
// while the lock stayed on Redis for the full lease time from the script's
// run, held by nobody. It now returns ErrNotAcquired saying the reply came
// too late, once the lock is given back, its owner revoked.
func TestLateTakeTryOnce(t *testing.T) {
	const name, ttl = "lock:late-take-once", 500 * time.Millisecond
	s := newLateTake(t, name)
	s.tr.arm()
	got := acquireAsync(s.l, name, fence.TTL(ttl))
	waitFor(t, s.tr.holding)
	// The give-back (release.lua's ReleaseKeys keys, the lock first) is
	// held on its way in turn: Acquire returns only once it is answered,
	// so that a caller trying again at once finds the lock free.
	lock := lockKey(name)
	s.tr.mu.Lock()
	s.tr.match = fmt.Appendf(nil, "$1\r\n%d\r\n$%d\r\n%s\r\n", redislock.ReleaseKeys, len(lock), lock)
	s.tr.armed = true
	s.tr.mu.Unlock()
	s.deliverAfter(t, ttl)
	waitFor(t, s.tr.holding)
	select {
	case r := <-got:
		t.Fatalf("Acquire returned before its give-back was answered: %v, lease %v", r.err, r.lease)
	case <-time.After(200 * time.Millisecond):
	}
	if err := s.tr.deliver(); err != nil {
		t.Fatal(err)
	}
	r := acquired{}.wait(t, got)
	if r.lease != nil {
		t.Fatalf("Acquire whose reply came %v past the deadline returned a lease (token %d), Err = %v", time.Since(r.lease.Deadline()).Round(time.Millisecond), r.lease.Token(), r.lease.Err())
	}
	if !errors.Is(r.err, fence.ErrNotAcquired) || !errors.Is(r.err, fence.ErrLeaseLost) || !strings.Contains(r.err.Error(), "too late") {
		t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", r.err)
	}
	t.Logf("Acquire: %v", r.err)
	// Given back before Acquire returned.
	if holder, pttl := s.admin.Get(ctx(t), lockKey(name)).Val(), s.admin.PTTL(ctx(t), lockKey(name)).Val(); holder != "" {
		t.Errorf("the late take's lock is still held by %s for %v after its give-back", holder, pttl)
	}
	if n := s.revoked(t); n != 1 {
		t.Errorf("%d revocation marks, want 1 (the late try's owner)", n)
	}
}

// TestLateTakeRetriedWithinWait: the same late take in an Acquire with a
// wait budget is given back (revoked) and tried again with a new owner,
// which gets a live lease.
func TestLateTakeRetriedWithinWait(t *testing.T) {
	const name, ttl = "lock:late-take-wait", 500 * time.Millisecond
	s := newLateTake(t, name)
	s.tr.arm()
	got := acquireAsync(s.l, name, fence.TTL(ttl), fence.Wait(10*time.Second))
	s.deliverAfter(t, ttl)
	r := acquired{}.wait(t, got)
	if r.err != nil {
		t.Fatalf("Acquire with 10 s to wait after a late take: %v", r.err)
	}
	if err := r.lease.Err(); err != nil {
		t.Fatalf("Acquire returned a lease already ended: %v", err)
	}
	if n := s.revoked(t); n != 1 {
		t.Errorf("%d revocation marks, want 1 (the late try's owner)", n)
	}
	if holder := s.admin.Get(ctx(t), lockKey(name)).Val(); holder == "" {
		t.Errorf("lease token %d, but no lock on Redis", r.lease.Token())
	}
	if err := r.lease.Release(ctx(t)); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// TestLateGrantConfirmationRetried: a waiter is granted the lock by the
// holder's release, more than a quarter of its lease time after its last
// try, so it confirms the grant with a try; that try is delayed past the
// lease time. The confirmed grant is given back (revoked) like a late
// take, and the waiter, with budget left, tries again with a new owner and
// gets a live lease.
func TestLateGrantConfirmationRetried(t *testing.T) {
	const name, ttl = "lock:late-grant", 400 * time.Millisecond
	s := newLateTake(t, name)
	holder := acquire(t, lockerWith(t, s.srv.Client(t), redislock.Options{}), name, fence.TTL(time.Minute))
	got := s.queueBehind(t, fence.TTL(ttl), fence.Wait(15*time.Second))
	s.releaseToConfirm(t, holder, ttl/2)
	s.deliverAfter(t, ttl)
	r := acquired{}.wait(t, got)
	if r.err != nil {
		t.Fatalf("Acquire with budget left after a late confirmation: %v", r.err)
	}
	if err := r.lease.Err(); err != nil {
		t.Fatalf("Acquire returned a lease already ended: %v", err)
	}
	if n := s.revoked(t); n != 1 {
		t.Errorf("%d revocation marks, want 1 (the late confirmation's owner)", n)
	}
	if err := r.lease.Release(ctx(t)); err != nil {
		t.Errorf("Release: %v", err)
	}
}
