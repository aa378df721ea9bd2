package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
)

// lateNodeTimeout is the node timeout of the tests of late replies: long
// next to the healthy nodes' round trips, so that Acquire, deciding at the
// majority, returns well before it, and a paused node's reply can come
// after Acquire returned and still within it.
const lateNodeTimeout = 2 * time.Second

// lateLocker returns a Locker over srvs whose clients leave a request to
// the per-node timeout (no deadline on the socket, a read timeout past
// it), warmed up on name: scripts loaded, connections pooled.
func lateLocker(t *testing.T, srvs []*redistest.Server, name string) *redlock.Locker {
	t.Helper()
	cs := clientsWith(t, srvs, lateOptions)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	warm, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("warm-up Acquire: %v", err)
	}
	if err := warm.Extend(ctxFor(t), 10*time.Second); err != nil { // loads extend.lua
		t.Fatalf("warm-up Extend: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("warm-up Release: %v", err)
	}
	// Release returns at a majority: the last node's delete may still be
	// on its way, and an Acquire sent now could find the lock there.
	waitUnlocked(t, srvs, name, 5*time.Second)
	return l
}

// pause stops srvs (SIGSTOP) until the test ends or resume is called.
func pause(t *testing.T, srvs []*redistest.Server) (resume func()) {
	for _, s := range srvs {
		s.Signal(syscall.SIGSTOP)
		t.Cleanup(func() { s.Signal(syscall.SIGCONT) })
	}
	return func() {
		for _, s := range srvs {
			s.Signal(syscall.SIGCONT)
		}
	}
}

// acquireFast acquires name and fails the test unless Acquire returned
// well before the node timeout: at the majority's replies, not the paused
// nodes'.
func acquireFast(t *testing.T, l *redlock.Locker, name string, ttl time.Duration) fence.Lease {
	t.Helper()
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Acquire with nodes paused: %v", err)
	}
	if took >= lateNodeTimeout/2 {
		t.Fatalf("Acquire took %v with nodes paused (node timeout %v): it waited for them", took, lateNodeTimeout)
	}
	return lease
}

// A node paused while Acquire is out grants the lock after Acquire
// returned (at a majority): Release called at once must leave nothing
// locked there, whether the node wakes while Release waits for it (then it
// runs the acquisition and the release in either order) or after Release
// gave up on it (the late grant is then given back when it is read, and the
// release retried). 3 masters with one paused, 5 with two.
func TestLateGrantAfterRelease(t *testing.T) {
	for _, c := range []struct{ n, slow int }{{3, 1}, {5, 2}} {
		for _, wake := range []string{"during Release", "after Release"} {
			t.Run(fmt.Sprintf("%d masters %d paused, woken %s", c.n, c.slow, wake), func(t *testing.T) {
				srvs := nodes(t, c.n)
				const name, ttl = "late-release", 30 * time.Second
				l := lateLocker(t, srvs, name)
				slow := srvs[c.n-c.slow:]
				resume := pause(t, slow)
				lease := acquireFast(t, l, name, ttl)
				if on := lockedOn(t, srvs[:c.n-c.slow], name); len(on) != c.n-c.slow {
					t.Fatalf("locked on %v of the running nodes, want all", on)
				}
				done := make(chan error, 1)
				go func() { done <- lease.Release(ctxFor(t)) }()
				if wake == "during Release" {
					// Once the running nodes released it, Release
					// waits for the paused ones.
					waitUnlocked(t, srvs[:c.n-c.slow], name, 5*time.Second)
					resume()
				}
				if err := <-done; err != nil {
					t.Fatalf("Release: %v", err)
				}
				resume()
				// The lease time is 30 s: a lock left behind would
				// outlast the deadline by far.
				waitUnlocked(t, srvs, name, 5*time.Second)
			})
		}
	}
}

// A try that fails (the lock held on a majority by another owner) is
// decided as soon as the majority refused, without waiting for a paused
// node; that node grants the try when it wakes, after Acquire returned,
// and must not keep the lock.
func TestLateGrantAfterFailedAcquire(t *testing.T) {
	for _, c := range []struct{ n, slow int }{{3, 1}, {5, 2}} {
		t.Run(fmt.Sprintf("%d masters %d paused", c.n, c.slow), func(t *testing.T) {
			srvs := nodes(t, c.n)
			const name = "late-failed"
			l := lateLocker(t, srvs, name)
			// Another owner holds the lock on a majority of the nodes.
			q := c.n/2 + 1
			for _, s := range srvs[:q] {
				if err := s.Client(t).Set(ctxFor(t), lockKey(name), "someone-else", time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
			slow := srvs[c.n-c.slow:]
			resume := pause(t, slow)
			start := time.Now()
			_, err := l.Acquire(ctxFor(t), name, fence.TTL(30*time.Second))
			took := time.Since(start)
			if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrHeld) {
				t.Fatalf("Acquire of a lock held on a majority = %v, want ErrHeld", err)
			}
			if took >= lateNodeTimeout/2 {
				t.Fatalf("Acquire took %v to fail (node timeout %v): it waited for the paused nodes", took, lateNodeTimeout)
			}
			resume()
			// The paused nodes run the try (the lock is free there)
			// and the revocation, in either order.
			waitUnlocked(t, srvs[q:], name, 5*time.Second)
			for _, s := range srvs[:q] {
				if v, err := s.Client(t).Get(ctxFor(t), lockKey(name)).Result(); err != nil || v != "someone-else" {
					t.Fatalf("the other owner's lock = %q, %v", v, err)
				}
			}
		})
	}
}

// Extend while a paused node's grant is still on its way: the renewal
// succeeds on the majority; the grant, once it comes, joins the lease, so
// the next renewal moves the lock there too, and Release deletes it there.
func TestExtendWithLateReplyInFlight(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "late-extend", 30 * time.Second
	l := lateLocker(t, srvs, name)
	resume := pause(t, srvs[2:])
	lease := acquireFast(t, l, name, ttl)
	done := make(chan error, 1)
	go func() { done <- lease.Extend(ctxFor(t), 2*ttl) }()
	// Let the renewal reach the running nodes (the lock's expiry there
	// moves past the lease time), then wake the paused one, which runs the
	// acquisition and the renewal, in either order.
	deadline := time.Now().Add(5 * time.Second)
	for {
		pttl, err := srvs[0].Client(t).PTTL(ctxFor(t), lockKey(name)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl > ttl+time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewal did not reach node 0")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	resume()
	if err := <-done; err != nil {
		t.Fatalf("Extend with a grant in flight: %v", err)
	}
	waitLocked(t, srvs[2], name, 5*time.Second)
	// The grant joined the lease: a renewal moves the lock on node 2.
	if err := lease.Extend(ctxFor(t), 3*ttl); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	pttl, err := srvs[2].Client(t).PTTL(ctxFor(t), lockKey(name)).Result()
	if err != nil || pttl <= 2*ttl {
		t.Fatalf("node 2's lock PTTL after a renewal to %v: %v, %v; want it moved", 3*ttl, pttl, err)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	if err := context.Cause(lease.Context()); !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("lease cause %v", err)
	}
}

// waitLocked waits until name is locked on s, or fails.
func waitLocked(t *testing.T, s *redistest.Server, name string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for len(lockedOn(t, []*redistest.Server{s}, name)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not locked on %s after %v", s.Addr, within)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// Release is decided at a majority too: with nodes paused (SIGSTOP) after
// the lease was granted everywhere, Release returns nil well before the
// node timeout, once the running majority deleted the lock, and a second
// Release returns the same; the paused nodes' releases go on in the
// background and leave nothing locked once they wake. 3 masters with one
// paused, 5 with two.
func TestReleaseAtMajority(t *testing.T) {
	for _, c := range []struct{ n, slow int }{{3, 1}, {5, 2}} {
		t.Run(fmt.Sprintf("%d masters %d paused", c.n, c.slow), func(t *testing.T) {
			srvs := nodes(t, c.n)
			const name, ttl = "release-majority", 30 * time.Second
			l := lateLocker(t, srvs, name)
			lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			// Acquire returned at a majority: the other grants may
			// still be on their way.
			for _, s := range srvs {
				waitLocked(t, s, name, 5*time.Second)
			}
			slow := srvs[c.n-c.slow:]
			resume := pause(t, slow)
			start := time.Now()
			err = lease.Release(ctxFor(t))
			took := time.Since(start)
			if err != nil {
				t.Fatalf("Release with %d of %d nodes paused: %v", c.slow, c.n, err)
			}
			if took >= lateNodeTimeout/2 {
				t.Fatalf("Release took %v with nodes paused (node timeout %v): it waited for them", took, lateNodeTimeout)
			}
			if err := lease.Release(ctxFor(t)); err != nil {
				t.Fatalf("second Release: %v, want the first's nil", err)
			}
			if on := lockedOn(t, srvs[:c.n-c.slow], name); len(on) != 0 {
				t.Fatalf("still locked on running nodes %v after Release", on)
			}
			resume()
			// The lease time is 30 s: a lock left on a paused node would
			// outlast the deadline by far.
			waitUnlocked(t, srvs, name, 5*time.Second)
		})
	}
}
