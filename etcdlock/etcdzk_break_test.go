package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdserver"
	"github.com/fencekit/fence/internal/refused"
	"github.com/fencekit/fence/internal/silent"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestPrefixOnLockerNotMadeByNew: Prefix on a nil Locker (a New whose
// error was ignored) or a zero one does not panic, and names the keys New
// with default options would use.
func TestPrefixOnLockerNotMadeByNew(t *testing.T) {
	want := etcdlock.DefaultPrefix + "a%2Fb/"
	var nilLocker *etcdlock.Locker
	for what, l := range map[string]*etcdlock.Locker{"zero": {}, "nil": nilLocker} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s Locker: Prefix panicked: %v", what, r)
				}
			}()
			if got := l.Prefix("a/b"); got != want {
				t.Errorf("%s Locker: Prefix(%q) = %q; want %q", what, "a/b", got, want)
			}
		}()
	}
}

// TestDeadEndpointsKeepCallersDeadline: on an endpoint that accepts and
// never answers, and on one that refuses connections, Acquire (try-lock
// and with a wait budget longer than ctx) returns an error within the
// caller's deadline, not ErrHeld, and Close returns within its own.
func TestDeadEndpointsKeepCallersDeadline(t *testing.T) {
	for what, addr := range map[string]string{"silent": silent.Addr(t), "refused": refused.Addr(t)} {
		t.Run(what, func(t *testing.T) {
			l := newLocker(t, []string{"http://" + addr}, nil)
			for _, opts := range [][]fence.Option{nil, {fence.Wait(time.Minute)}, {fence.TTL(time.Second)}} {
				ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
				start := time.Now()
				lease, err := l.Acquire(ctx, "dead-endpoint", opts...)
				took := time.Since(start)
				cancel()
				if lease != nil || !errors.Is(err, fence.ErrNotAcquired) || errors.Is(err, fence.ErrHeld) {
					t.Errorf("Acquire(%d opts) = %v, %v; want ErrNotAcquired, not ErrHeld", len(opts), lease, err)
				}
				if took > 3*time.Second {
					t.Errorf("Acquire(%d opts) took %v with a 700 ms deadline", len(opts), took)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			defer cancel()
			start := time.Now()
			_ = l.Close(ctx)
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("Close took %v with a 700 ms deadline", took)
			}
		})
	}
}

// TestNestedPrefixes: two Lockers whose prefixes nest ("nest/" and
// "nest/b/") keep apart the locks that do not share a name: lock "x" of
// the second has keys under "nest/b/x/", which are also under lock "b" of
// the first. Before, lock "b" was ErrHeld while the second Locker held its
// lock "x" (the oldest key under "nest/b/" was that one). Now a key with a
// "/" after the lock's prefix is another Locker's: a try-lock takes "b",
// and a waiter created behind such a key waits for the holder of "b",
// takes the lock when it releases, and gets a greater token.
func TestNestedPrefixes(t *testing.T) {
	endpoints := shared.Endpoints()
	outer := newLocker(t, endpoints, &etcdlock.Options{Prefix: "nest/"})
	inner := newLocker(t, endpoints, &etcdlock.Options{Prefix: "nest/b/"})
	ctx := ctxFor(t, 30*time.Second)
	x, err := inner.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := outer.Acquire(ctx, "b")
	if err != nil {
		t.Fatalf("lock \"b\" of prefix \"nest/\" while lock \"x\" of prefix \"nest/b/\" is held: %v", err)
	}
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A foreign key between the holder's and the waiter's.
	if x, err = inner.Acquire(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = x.Release(ctx) }()
	if _, err := outer.Acquire(ctx, "b"); !errors.Is(err, fence.ErrHeld) {
		t.Errorf("try-lock of \"b\" while it is held: %v; want ErrHeld", err)
	}
	got := make(chan error, 1)
	go func() {
		next, err := outer.Acquire(ctx, "b", fence.Wait(10*time.Second))
		if err == nil {
			if next.Token() <= b.Token() {
				err = errors.New("token did not grow")
			}
			_ = next.Release(ctx)
		}
		got <- err
	}()
	admin := newClient(t, endpoints, nil)
	for end := time.Now().Add(10 * time.Second); ; {
		r, err := admin.Get(ctx, outer.Prefix("b"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if r.Count == 3 { // holder, foreign key, waiter
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d keys under %q after 10 s; want 3", r.Count, outer.Prefix("b"))
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	select {
	case err := <-got:
		t.Fatalf("the waiter returned while \"b\" was held: %v", err)
	default:
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("waiter behind another Locker's key: %v", err)
	}
}

// TestCloseWhileAcquiresAndLeasesInFlight: Close runs while a watchdog
// lease and a fence.TTL lease are held and waiters wait; it returns within
// its ctx, the waiters give their keys back and fail with ErrClosed (as
// fence.ErrClosed says: whatever their wait budget) rather than wait on
// a closed Locker (TestCloseEndsWaiterWithHungMember), the leases held go
// on until released, and once every lease is released and the client
// closed, no key is left and no goroutine (TestMain's check).
func TestCloseWhileAcquiresAndLeasesInFlight(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	client := newClient(t, endpoints, nil)
	l, err := etcdlock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	const name = "close-in-flight"
	holder, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	fixed, err := l.Acquire(ctx, name+"-ttl", fence.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// A spare for Close to revoke.
	if sp, err := l.Acquire(ctx, name+"-spare", fence.TTL(5*time.Second)); err != nil {
		t.Fatal(err)
	} else if err := sp.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	const waiters = 3
	got := make(chan fence.Lease, waiters)
	errs := make(chan error, waiters)
	for range waiters {
		go func() {
			lease, err := l.Acquire(wctx, name, fence.Wait(20*time.Second))
			if err != nil {
				errs <- err
				return
			}
			got <- lease
		}()
	}
	keys := func() int64 {
		r, err := admin.Get(ctx, l.Prefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	for end := time.Now().Add(10 * time.Second); keys() < 1+waiters; {
		if time.Now().After(end) {
			t.Fatalf("%d keys after 10 s; want %d", keys(), 1+waiters)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	err = l.Close(cctx)
	ccancel()
	if err != nil {
		t.Errorf("Close = %v", err)
	}
	for range waiters {
		select {
		case err := <-errs:
			if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrClosed) {
				t.Errorf("waiter after Close: %v, want ErrNotAcquired and ErrClosed", err)
			}
		case lease := <-got:
			t.Errorf("a waiter took the lock on a closed Locker: token %d", lease.Token())
			_ = lease.Release(ctx)
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter has not returned 10 s after Close")
		}
	}
	// Close released the leases held: their keys are gone, and a Release
	// after it returns what Close's did.
	if n := keys(); n != 0 {
		t.Errorf("%d keys after Close, want none", n)
	}
	for _, lease := range []fence.Lease{holder, fixed} {
		if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
			t.Errorf("lease %q: Err after Close = %v, want fence.ErrReleased", lease.Name(), err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Error(err)
		}
	}
	for end := time.Now().Add(10 * time.Second); keys() != 0; {
		if time.Now().After(end) {
			t.Fatalf("%d keys left 10 s after every lease ended", keys())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if err := l.Close(ctx); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if ids := l.SpareIDs(); len(ids) != 0 {
		t.Errorf("spares after Close: %v", ids)
	}
	_ = client.Close()
}

// TestIsOwnerOfLeaseNotFromAcquire: IsOwner of a nil *Lease panicked, and
// of a zero Lease (declared, not returned by Acquire) returned no error but
// a Cmp on the empty key, which etcd refuses only when the Txn is sent
// ("etcdserver: key is not provided"), far from the mistake. Both are
// refused with fence.ErrInvalidOption, as a lease of another backend is.
func TestIsOwnerOfLeaseNotFromAcquire(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	ctx := ctxFor(t, 10*time.Second)
	var nilLease *etcdlock.Lease
	for what, ls := range map[string]*etcdlock.Lease{"zero": {}, "nil": nilLease} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s Lease: IsOwner panicked: %v", what, r)
				}
			}()
			cmp, err := etcdlock.IsOwner(ls)
			if errors.Is(err, fence.ErrInvalidOption) {
				return
			}
			t.Errorf("%s Lease: IsOwner = %v; want an error matching fence.ErrInvalidOption", what, err)
			resp, err := admin.Txn(ctx).If(cmp).Then(clientv3.OpPut("isowner-zero", "written")).Commit()
			if err == nil && resp.Succeeded {
				t.Errorf("%s Lease: a Txn guarded by its IsOwner wrote", what)
			}
			t.Logf("%s Lease: a Txn guarded by its IsOwner: %v", what, err)
		}()
	}
}

// TestStandaloneRestartLosesNothing: the only member killed and restarted
// from its data dir while a watchdog lease is held and a waiter waits: the
// lease stays held (its renewals ride out the restart), the waiter keeps
// waiting, takes the lock when the holder releases, and its token is
// greater than the holder's.
func TestStandaloneRestartLosesNothing(t *testing.T) {
	c, err := etcdserver.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	m := c.Members[0]
	l := newLocker(t, c.Endpoints(), &etcdlock.Options{WatchdogTTL: 6 * time.Second})
	ctx := ctxFor(t, time.Minute)
	const name = "restarted"
	holder, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		next, err := l.Acquire(ctx, name, fence.Wait(40*time.Second))
		if err == nil {
			if next.Token() <= holder.Token() {
				err = errors.New("token did not grow")
			}
			_ = next.Release(ctx)
		}
		got <- err
	}()
	admin := newClient(t, c.Endpoints(), nil)
	for end := time.Now().Add(10 * time.Second); ; {
		r, err := admin.Get(ctx, l.Prefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if r.Count == 2 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d keys after 10 s; want 2", r.Count)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Past two renewals of the holder after the restart: its Deadline
	// moved twice (a renewal every third of its 6 s lease time).
	last, renewed := holder.Deadline(), 0
	tick := time.NewTicker(10 * time.Millisecond) // polling with a deadline
	defer tick.Stop()
	limit := time.NewTimer(20 * time.Second)
	defer limit.Stop()
	for renewed < 2 {
		select {
		case err := <-got:
			t.Fatalf("the waiter returned while the lock was held: %v", err)
		case <-holder.Done():
			t.Fatalf("the holder's lease ended across the restart: %v", holder.Err())
		case <-limit.C:
			t.Fatalf("the holder's lease renewed %d times in 20 s after the restart, want 2 (Deadline %v)", renewed, holder.Deadline().Format(time.StampMilli))
		case <-tick.C:
			if d := holder.Deadline(); d.After(last) {
				last, renewed = d, renewed+1
			}
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter has not taken the lock 20 s after the release")
	}
}
