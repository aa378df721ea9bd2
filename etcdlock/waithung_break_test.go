package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/etcdtest"
)

// A waiter in line when the only member is paused, with a ctx that never
// ends: its Wait budget must still bound Acquire (the budget ends the
// watches, the renewals and the checks in flight, all on the paused
// member; the revoke of its etcd lease that follows is bounded too), and
// it must give up with ErrHeld, not hang or report the lock taken.
func TestWaiterBudgetOnPausedMember(t *testing.T) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	ctx := ctxFor(t, 30*time.Second)
	holder, err := newLocker(t, c.Endpoints(), nil).Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, c.Endpoints(), nil)
	admin := newClient(t, c.Endpoints(), nil)
	const wait = 3 * time.Second
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(context.Background(), t.Name(), fence.Wait(wait))
		errc <- err
	}()
	for end := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(t.Name())) < 2; {
		if time.Now().After(end) {
			t.Fatal("no waiter in line after 10 s")
		}
	}
	m.Stop()
	paused := time.Now()
	defer func() {
		m.Cont()
		if err := m.WaitReady(10 * time.Second); err != nil {
			t.Error(err)
		}
		_ = holder.Release(ctxFor(t, 10*time.Second))
	}()
	select {
	case err := <-errc:
		t.Logf("waiter: %v, %v after the start, %v after the pause", err, time.Since(start), time.Since(paused))
		if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrHeld) {
			t.Fatalf("waiter = %v, want ErrNotAcquired and ErrHeld", err)
		}
		if took := time.Since(start); took > wait+2*time.Second {
			t.Fatalf("waiter with a budget of %v returned after %v", wait, took)
		}
	case <-time.After(wait + 10*time.Second):
		t.Fatalf("waiter with a budget of %v still waiting %v after the pause", wait, time.Since(paused))
	}
}
