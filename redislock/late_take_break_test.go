package redislock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
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

// TestLateTakeRetryWithinBudget: an Acquire with a 2 s wait budget whose
// first try takes the lock with a reply past the lease's deadline gives it
// back and tries again with a new owner; that try is held on its way (the
// server hangs now). The budget bounds every try but the Acquire's first
// (README), but the try again was made as a first try, on the caller's
// context alone: Acquire returned only when the client's read timeout
// (10 s) ended it. Then the held try reaches Redis: its owner, given up
// on, must not take the lock.
func TestLateTakeRetryWithinBudget(t *testing.T) {
	const name, ttl, wait = "lock:late-take-retry-budget", 300 * time.Millisecond, 2 * time.Second
	s := newLateTake(t, name)
	s.tr.arm()
	start := time.Now()
	got := acquireAsync(s.l, name, fence.TTL(ttl), fence.Wait(wait))
	waitFor(t, s.tr.holding)
	probe, err := s.l.Acquire(ctx(t), name+":probe", fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	<-probe.Done()
	s.tr.arm() // the try again, once the first is delivered
	if err := s.tr.deliver(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s.tr.holding)
	r := acquired{}.wait(t, got)
	took := time.Since(start)
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) though its try again is held", r.lease.Token())
	}
	if !errors.Is(r.err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired", r.err)
	}
	t.Logf("Acquire after %v: %v", took.Round(time.Millisecond), r.err)
	if took > wait+time.Second {
		t.Errorf("Acquire with a %v budget returned after %v: its try again after the late take was not bounded by the budget", wait, took.Round(time.Millisecond))
	}
	// The try held on its way arrives now, for an owner whose Acquire
	// gave up: it must not take the lock.
	if err := s.l.WaitGiveBacks(ctx(t)); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, s.admin, "evalsha")
	if err := s.tr.deliver(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return commandCalls(t, s.admin, "evalsha") > before })
	if holder, pttl := s.admin.Get(ctx(t), lockKey(name)).Val(), s.admin.PTTL(ctx(t), lockKey(name)).Val(); holder != "" {
		t.Errorf("after the held try arrived late, the lock is held by %s for %v", holder, pttl)
	}
}

// TestLateTakesBackOff: every acquire try of a lock is delayed on its way
// by 15 ms, longer than a lease of fence.MinTTL, so every take is answered
// past the lease's deadline and given back. An Acquire with a 1 s budget
// tries again until the budget ends, as it should; but it tried again at
// once each time, a new owner's take and its give-back after every late
// reply, hammering a server (or network) already too slow, where a failed
// try waits pause.Backoff before the next.
func TestLateTakesBackOff(t *testing.T) {
	const name, wait = "lock:late-takes-backoff", time.Second
	srv := redistest.Start(t)
	lock := lockKey(name)
	match := fmt.Appendf(nil, "$1\r\n5\r\n$%d\r\n%s\r\n", len(lock), lock)
	var tries atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &slowTries{Conn: c, match: match, n: &tries}, nil
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: dial})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{})
	start := time.Now()
	ls, err := l.Acquire(ctx(t), name, fence.TTL(fence.MinTTL), fence.Wait(wait))
	took := time.Since(start)
	if ls != nil {
		t.Fatalf("Acquire returned a lease, Err %v", ls.Err())
	}
	if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "too late") {
		t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", err)
	}
	n := tries.Load()
	t.Logf("Acquire after %v, %d tries: %v", took.Round(time.Millisecond), n, err)
	if took < wait-100*time.Millisecond || took > wait+time.Second {
		t.Errorf("Acquire with a %v budget returned after %v", wait, took.Round(time.Millisecond))
	}
	if n > 20 {
		t.Errorf("%d tries in a %v budget, every one answered too late: no back-off between them", n, wait)
	}
}

// slowTries delays each write that carries match by 15 ms, counting them.
type slowTries struct {
	net.Conn
	match []byte
	n     *atomic.Int64
}

func (c *slowTries) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.match) {
		c.n.Add(1)
		t := time.NewTimer(15 * time.Millisecond)
		<-t.C
	}
	return c.Conn.Write(p)
}

// TestLateGrantConfirmationKeepsLine: as TestLateGrantConfirmationRetried,
// with a second waiter queued behind the first. The first's confirmation
// of its grant is answered past the lease's deadline (or arrives after the
// grant ran out): the second must get the lock at once, not at a holder's
// expiry, and the first, trying again as a new owner, must queue behind
// it: no lease for it while the second holds the lock, then one with a
// greater token.
func TestLateGrantConfirmationKeepsLine(t *testing.T) {
	const name, ttl = "lock:late-grant-line", 400 * time.Millisecond
	s := newLateTake(t, name)
	lock := lockKey(name)
	holder := acquire(t, lockerWith(t, s.srv.Client(t), redislock.Options{}), name, fence.TTL(time.Minute))
	first := s.queueBehind(t, fence.TTL(ttl), fence.Wait(15*time.Second))
	second := acquireAsync(lockerWith(t, s.srv.Client(t), redislock.Options{}), name, fence.TTL(time.Minute), fence.Wait(15*time.Second))
	waitFor(t, func() bool { return s.admin.HLen(ctx(t), lock+":waiters").Val() == 2 })
	s.releaseToConfirm(t, holder, ttl/2)
	s.deliverAfter(t, ttl)
	delivered := time.Now()
	var r2 acquired
	select {
	case r2 = <-second:
	case r := <-first:
		t.Fatalf("the first waiter, whose confirmation came too late, got %v (err %v) before the second", r.lease, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the second waiter has no lease 10 s after the first's late confirmation")
	}
	if r2.err != nil {
		t.Fatalf("second waiter: %v", r2.err)
	}
	t.Cleanup(func() { _ = r2.lease.Release(context.Background()) })
	// The grant to the first ran out (its lease time) as its confirmation
	// was held: the confirmation, arriving, either took the free lock
	// late and gave it back (a revocation mark) or found the second first
	// in line and queued behind it (none).
	t.Logf("second waiter's lease %v after the late confirmation was delivered; %d revocation marks", time.Since(delivered).Round(time.Millisecond), s.revoked(t))
	if d := time.Since(delivered); d > 2*time.Second {
		t.Errorf("the second waiter got the lock %v after the first's late confirmation was given back", d.Round(time.Millisecond))
	}
	if err := r2.lease.Err(); err != nil {
		t.Fatalf("second waiter's lease already ended: %v", err)
	}
	select {
	case r := <-first:
		if r.lease != nil {
			t.Fatalf("the first waiter got a lease (token %d) while the second holds the lock (token %d)", r.lease.Token(), r2.lease.Token())
		}
		t.Fatalf("the first waiter gave up with budget left: %v", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := r2.lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	r1 := acquired{}.wait(t, first)
	if r1.err != nil {
		t.Fatalf("the first waiter after the second released: %v", r1.err)
	}
	if r1.lease.Token() <= r2.lease.Token() {
		t.Errorf("first waiter's token %d not above the second's %d", r1.lease.Token(), r2.lease.Token())
	}
	if err := r1.lease.Release(ctx(t)); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// eventLog records an Observer's acquisitions and lease ends.
type eventLog struct {
	fence.NopObserver
	mu     sync.Mutex
	events []string
}

func (e *eventLog) AcquireDone(ev fence.AcquireEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, fmt.Sprintf("acquire %s %d", ev.Result, ev.Token))
}

func (e *eventLog) LeaseEnded(ev fence.LeaseEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, fmt.Sprintf("ended %s %d", ev.Cause, ev.Token))
}

// TestLateTakeObserved: a take answered too late, given back and tried
// again within the budget, is one Acquire to the Observer: one
// acquisition, of the lease returned, and one end, its release; no event
// for the take given back (no lease, so no 'acquired' and no 'expired').
// A try-once Acquire whose take came too late is one failed Acquire.
func TestLateTakeObserved(t *testing.T) {
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			const ttl = 300 * time.Millisecond
			name := "lock:late-observed-" + wait.String()
			s := newLateTake(t, name)
			log := &eventLog{}
			c := redis.NewClient(&redis.Options{Addr: s.srv.Addr, Dialer: s.tr.dial, ReadTimeout: 10 * time.Second, MaxRetries: -1})
			t.Cleanup(func() { _ = c.Close() })
			l := lockerWith(t, c, redislock.Options{Observer: log})
			s.tr.arm()
			got := acquireAsync(l, name, fence.TTL(ttl), fence.Wait(wait))
			s.deliverAfter(t, ttl)
			r := acquired{}.wait(t, got)
			var want []string
			if wait == 0 {
				if r.err == nil {
					t.Fatalf("try-once Acquire after a late take: a lease")
				}
				want = []string{"acquire error 0"}
			} else {
				if r.err != nil {
					t.Fatalf("Acquire: %v", r.err)
				}
				if err := r.lease.Release(ctx(t)); err != nil {
					t.Fatal(err)
				}
				want = []string{fmt.Sprintf("acquire acquired %d", r.lease.Token()), fmt.Sprintf("ended released %d", r.lease.Token())}
			}
			if err := l.WaitGiveBacks(ctx(t)); err != nil {
				t.Fatal(err)
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			if !slices.Equal(log.events, want) {
				t.Errorf("Observer saw %q, want %q", log.events, want)
			}
		})
	}
}

// TestLateTakeThenHeld: a late take's give-back grants the lock to another
// Acquire queued meanwhile, which holds it for a minute; the late Acquire's
// try again (a new owner) waits for the rest of its budget and must say so
// as any waiter whose budget ran out: ErrHeld, not the caller's ctx (which
// has not ended).
func TestLateTakeThenHeld(t *testing.T) {
	const name, ttl, wait = "lock:late-take-then-held", 300 * time.Millisecond, 2 * time.Second
	s := newLateTake(t, name)
	s.tr.arm()
	got := acquireAsync(s.l, name, fence.TTL(ttl), fence.Wait(wait))
	waitFor(t, s.tr.holding)
	lock := lockKey(name)
	s.tr.mu.Lock()
	s.tr.match = fmt.Appendf(nil, "$1\r\n%d\r\n$%d\r\n%s\r\n", redislock.ReleaseKeys, len(lock), lock) // the give-back, next
	s.tr.armed = true
	s.tr.mu.Unlock()
	s.deliverAfter(t, ttl)
	waitFor(t, s.tr.holding) // the late take holds the lock; its give-back is on its way
	other := acquireAsync(lockerWith(t, s.srv.Client(t), redislock.Options{}), name, fence.TTL(time.Minute), fence.Wait(10*time.Second))
	waitFor(t, func() bool { return s.admin.HLen(ctx(t), lock+":waiters").Val() == 1 })
	if err := s.tr.deliver(); err != nil {
		t.Fatal(err)
	}
	ro := acquired{}.wait(t, other)
	if ro.err != nil {
		t.Fatalf("the Acquire queued behind the late take: %v", ro.err)
	}
	r := acquired{}.wait(t, got)
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) while another holds the lock (token %d)", r.lease.Token(), ro.lease.Token())
	}
	t.Logf("Acquire: %v", r.err)
	if !errors.Is(r.err, fence.ErrNotAcquired) || !errors.Is(r.err, fence.ErrHeld) || errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("Acquire = %v, want ErrNotAcquired matching ErrHeld, not context.DeadlineExceeded", r.err)
	}
}
