package zklock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/zkserver"
	"github.com/fencekit/fence/zklock"
)

// With 16 waiters, each release wakes exactly one: the one whose
// predecessor went away lists the directory again, and nobody else does.
// A lock that woke every waiter would list the directory once per waiter
// and release.
func TestReleaseWakesOne(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const name, waiters = "herd", 16
	holderLocker, admin := newLocker(t, addrs)
	holder, err := holderLocker.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := newLocker(t, addrs)
	leases := make(chan fence.Lease, waiters)
	errs := make(chan error, waiters)
	for range waiters {
		go func() {
			lease, err := l.Acquire(ctx, name, fence.Wait(45*time.Second))
			if err != nil {
				errs <- err
				return
			}
			leases <- lease
		}()
	}
	// Each waiter has its node and has listed the directory once.
	waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == waiters+1 && l.Listings() == waiters })
	current := holder
	var last fence.Token = holder.Token()
	for round := 1; round <= waiters; round++ {
		if err := current.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case current = <-leases:
		case err := <-errs:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatalf("round %d: no waiter woke", round)
		}
		if current.Token() <= last {
			t.Fatalf("round %d: token %#x, want > %#x", round, current.Token(), last)
		}
		last = current.Token()
		if got, want := l.Listings(), int64(waiters+round); got != want {
			t.Fatalf("round %d: %d listings, want %d: a release woke more than one waiter", round, got, want)
		}
	}
	if err := current.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := l.Listings(); got != 2*waiters {
		t.Fatalf("%d listings in all, want %d", got, 2*waiters)
	}
}

// A waiter that gives up, at the end of its wait budget or of its ctx,
// deletes its node; the holder's stays.
func TestGivingUpDeletesNode(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const name = "give-up"
	l, admin := newLocker(t, addrs)
	holder, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	held := lockNodes(t, admin, name)
	// Deleted by the time Acquire returns, while its ctx lasts.
	onlyHolder := func() {
		t.Helper()
		if got := lockNodes(t, admin, name); len(got) != 1 || got[0] != held[0] {
			t.Fatalf("nodes %v, want only the holder's %v", got, held)
		}
	}
	if _, err := l.Acquire(ctx, name, fence.Wait(200*time.Millisecond)); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire = %v, want ErrHeld", err)
	}
	onlyHolder()
	if _, err := l.Acquire(ctx, name); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire = %v, want ErrHeld", err)
	}
	onlyHolder()
	// Deleted in the background once its ctx has ended.
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	if _, err := l.Acquire(short, name, fence.Wait(time.Minute)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want context.DeadlineExceeded", err)
	}
	waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == 1 })
	onlyHolder()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Tried once right after a give-up, the free lock is taken.
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("Acquire of the free lock = %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// With the server killed or hung, Acquire fails within the caller's
// deadline, and a held lease ends by its Deadline.
func TestServerDown(t *testing.T) {
	type server = *zkserver.Server
	for _, tc := range []struct {
		what     string
		down, up func(server)
	}{
		{"killed", server.Kill, nil},
		{"hung", server.Stop, server.Cont},
	} {
		t.Run(tc.what, func(t *testing.T) {
			srv := startZK(t)
			l, _ := newLocker(t, []string{srv.Addr})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			lease, err := l.Acquire(ctx, "down")
			if err != nil {
				t.Fatal(err)
			}
			tc.down(srv)
			if tc.up != nil {
				defer tc.up(srv)
			}
			for _, opts := range [][]fence.Option{nil, {fence.Wait(time.Minute)}} {
				short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
				start := time.Now()
				_, err := l.Acquire(short, "other", opts...)
				cancelShort()
				if !errors.Is(err, fence.ErrNotAcquired) {
					t.Fatalf("Acquire = %v, want ErrNotAcquired", err)
				}
				if took := time.Since(start); took > 500*time.Millisecond+time.Second { // under the 2 s session timeout
					t.Fatalf("Acquire returned %v after it began, its ctx ended at 500ms: %v", took, err)
				}
			}
			select {
			case <-lease.Done():
			case <-time.After(2 * sessionTimeout):
				t.Fatalf("lease still held %v after the server went down", 2*sessionTimeout)
			}
			if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
				t.Fatalf("Err() = %v", lease.Err())
			}
		})
	}
}

// Bad input fails before anything is sent.
func TestNewRejectsBadInput(t *testing.T) {
	if _, err := zklock.New(nil, time.Second); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("New(nil) = %v", err)
	}
}
