package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
)

// Close ends the leases still held, as redlock's Close and etcd's
// concurrency.Session.Close do: a watchdog lease and one of fence.TTL,
// held at Close, are released (Done closed, Err and the Context's cause
// fence.ErrReleased), their keys are gone, and another Locker takes each
// lock at once, with a greater token. Before, Close returned nil and both
// went on (Err nil, Done open, the watchdog renewing its lease) until the
// user released them: a Lead term on etcdlock ran on after Close.
func TestCloseEndsHeldLeases(t *testing.T) {
	l := newLocker(t, shared.Endpoints(), nil)
	watched, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name()+"-watchdog")
	if err != nil {
		t.Fatal(err)
	}
	fixed := acquire(t, l, t.Name()+"-ttl", time.Minute)
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("Close = %v", err)
	}
	admin := newClient(t, shared.Endpoints(), nil)
	other := newLocker(t, shared.Endpoints(), nil)
	for _, lease := range []fence.Lease{watched, fixed} {
		select {
		case <-lease.Done():
		default:
			t.Errorf("lease %q: Done still open after Close returned (Err %v)", lease.Name(), lease.Err())
		}
		if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
			t.Errorf("lease %q: Err after Close = %v, want fence.ErrReleased", lease.Name(), err)
		}
		if cause := context.Cause(lease.Context()); !errors.Is(cause, fence.ErrReleased) {
			t.Errorf("lease %q: Context's cause after Close = %v, want fence.ErrReleased", lease.Name(), cause)
		}
		if n := countKeys(t, admin, l.Prefix(lease.Name())); n != 0 {
			t.Errorf("lease %q: %d keys left after Close", lease.Name(), n)
		}
		// No wait budget: a key left behind makes it fail with ErrHeld.
		next, err := other.Acquire(ctxFor(t, 10*time.Second), lease.Name(), fence.TTL(time.Minute))
		if err != nil {
			t.Errorf("lease %q: another Locker's Acquire after Close = %v", lease.Name(), err)
			continue
		}
		t.Logf("lease %q: token %d, the next holder's %d", lease.Name(), lease.Token(), next.Token())
		if next.Token() <= lease.Token() {
			t.Errorf("lease %q: the next holder's token %d is not above %d", lease.Name(), next.Token(), lease.Token())
		}
		if err := next.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Error(err)
		}
	}
}

// Release of a lease that Close released returns what Close's release
// returned (nil here: the lease was held), and Extend of it the lease's
// Err, as redlock's do: an error matching fence.ErrLeaseLost and
// fence.ErrReleased. Before, Close left the lease held: Extend failed
// with fence.ErrClosed, the lease left as it was (Err nil), and Release
// freed the lock then, not Close.
func TestReleaseAndExtendAfterCloseOfHeldLease(t *testing.T) {
	l := newLocker(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), time.Minute)
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("Close = %v", err)
	}
	err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute)
	t.Logf("Extend after Close = %v; the lease's Err %v", err, lease.Err())
	if !errors.Is(err, fence.ErrReleased) || !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend after Close = %v, want an error matching fence.ErrReleased and fence.ErrLeaseLost", err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Errorf("Release after Close = %v, want nil, as Close's release returned", err)
	}
}

// fence.Lead on etcdlock: Close ends the leader's term at once (the
// term's ctx is cancelled as Close releases the lease), and Lead returns
// an error matching fence.ErrClosed, its next campaign refused. Before,
// the term went on after Close had returned nil (its ctx still open 2 s
// later), and Lead with it.
func TestCloseDeposesLeader(t *testing.T) {
	l := newLocker(t, shared.Endpoints(), nil)
	elected := make(chan struct{})
	ended := make(chan error, 1)
	led := make(chan error, 1)
	go func() {
		led <- fence.Lead(context.Background(), l, t.Name(), func(ctx context.Context, _ fence.Lease) error {
			select {
			case elected <- struct{}{}:
			default:
				t.Error("elected again after Close")
			}
			<-ctx.Done()
			ended <- context.Cause(ctx)
			return nil
		}, fence.Backoff(10*time.Millisecond, 100*time.Millisecond))
	}()
	select {
	case <-elected:
	case <-time.After(10 * time.Second):
		t.Fatal("not elected within 10 s")
	}
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctxFor(t, 10*time.Second)) }()
	select {
	case cause := <-ended:
		t.Logf("the term's ctx ended %v after Close was called, cause %v", time.Since(start).Round(time.Millisecond), cause)
		if !errors.Is(cause, fence.ErrReleased) {
			t.Errorf("the term's cause = %v, want fence.ErrReleased", cause)
		}
	case <-time.After(2 * time.Second):
		// Lead still runs its term: the test's end would leak it.
		t.Fatal("the term's ctx still open 2 s after Close was called")
	}
	select {
	case err := <-led:
		t.Logf("Lead = %v, %v after Close was called", err, time.Since(start).Round(time.Millisecond))
		if !errors.Is(err, fence.ErrClosed) {
			t.Errorf("Lead after Close = %v, want an error matching fence.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lead still running 5 s after Close")
	}
	if err := <-closed; err != nil {
		t.Errorf("Close = %v", err)
	}
}

// With one member of three hung (paused: its connection open, nothing
// answered), Close still releases a lease held, trying the next member
// after an attempt's timeout, and returns within its ctx: the key is gone
// on the members that serve. Before, Close returned nil at once, the lease
// held and its key in place.
func TestCloseReleasesHeldWithHungMember(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	l := newLocker(t, c.Endpoints(), &etcdlock.Options{WatchdogTTL: 3 * time.Second})
	var leases []fence.Lease
	for i := range 3 {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name()+"-"+string(rune('a'+i)))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	leader := etcdtest.Leader(t, c)
	hung := c.Members[0]
	if hung == leader {
		hung = c.Members[1]
	}
	hung.Stop()
	t.Cleanup(hung.Cont)
	const within = 5 * time.Second
	start := time.Now()
	err := l.Close(ctxFor(t, within))
	took := time.Since(start)
	t.Logf("Close with member %s hung = %v after %v", hung.Name, err, took.Round(time.Millisecond))
	if err != nil {
		t.Errorf("Close on a cluster that serves, one member hung = %v", err)
	}
	if took > within+time.Second {
		t.Errorf("Close took %v, past its ctx of %v", took.Round(time.Millisecond), within)
	}
	var serving []string
	for _, m := range c.Members {
		if m != hung {
			serving = append(serving, m.ClientURL)
		}
	}
	admin := newClient(t, serving, nil)
	for _, lease := range leases {
		if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
			t.Errorf("lease %q: Err after Close = %v, want fence.ErrReleased", lease.Name(), err)
		}
		if n := countKeys(t, admin, l.Prefix(lease.Name())); n != 0 {
			t.Errorf("lease %q: %d keys left after Close", lease.Name(), n)
		}
	}
}
