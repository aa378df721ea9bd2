package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// fence.Lead on a Locker whose client the user closed: no campaign can
// ever succeed again (every call fails at once, see TestClosedClientNoHang),
// so Lead must stop campaigning and return an error matching
// fence.ErrClosed, as it does for a closed redlock Locker, instead of
// campaigning, with a back-off, for as long as its ctx lasts (for ever, with
// a ctx that never ends: a goroutine that never returns).
func TestLeadStopsOnClosedClient(t *testing.T) {
	c := newClient(t, shared.Endpoints(), nil)
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The lease's key outlives the closed client until its etcd lease
	// expires: a name of its own per run (-count).
	name := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	elected := make(chan fence.Lease, 1)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- fence.Lead(ctx, l, name, func(ctx context.Context, lease fence.Lease) error {
			select {
			case elected <- lease:
			default:
			}
			<-ctx.Done()
			return nil
		}, fence.Backoff(10*time.Millisecond, 100*time.Millisecond))
	}()
	var lease fence.Lease
	select {
	case lease = <-elected:
	case err := <-done:
		t.Fatalf("Lead = %v before it was elected", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not elected within 10 s")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, lease, 5*time.Second)
	select {
	case err := <-done:
		t.Logf("Lead on a closed client: %v", err)
		if !errors.Is(err, fence.ErrClosed) {
			t.Fatalf("Lead on a closed client = %v, want an error matching fence.ErrClosed", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Lead on a closed client still campaigning 15 s later, its ctx never ending")
	}
}

// fence.Lead on etcdlock: the leader's watch delivers nothing (a member
// that hangs) and an operator deletes its key; another candidate is
// elected. The deposed leader's fn must see its context cancelled (cause
// ErrLeaseLost) within a renewal, not lead on beside the new leader for as
// long as the member hangs; and every term's token is greater than the
// last.
func TestLeadDeposedWhileWatchDeaf(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	const ttl = 3 * time.Second // renewals every second
	deaf, err := etcdlock.New(deafWatchClient(t, endpoints), &etcdlock.Options{WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	type term struct {
		who   string
		token fence.Token
		key   string
		ended chan error // fn's context's cause, when it ends
	}
	terms := make(chan term, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	campaign := func(who string, l fence.Locker) <-chan error {
		out := make(chan error, 1)
		go func() {
			out <- fence.Lead(ctx, l, t.Name(), func(ctx context.Context, lease fence.Lease) error {
				tm := term{who, lease.Token(), lease.(*etcdlock.Lease).Key(), make(chan error, 1)}
				terms <- tm
				<-ctx.Done()
				tm.ended <- context.Cause(ctx)
				return nil
			}, fence.Backoff(10*time.Millisecond, 100*time.Millisecond), fence.LeaseOptions(fence.Wait(time.Minute)))
		}()
		return out
	}
	nextTerm := func() term {
		t.Helper()
		select {
		case tm := <-terms:
			return tm
		case <-time.After(10 * time.Second):
			t.Fatal("no leader elected within 10 s")
			return term{}
		}
	}
	a := campaign("deaf", deaf)
	first := nextTerm()
	if first.who != "deaf" {
		t.Fatalf("%s elected first, want the deaf candidate", first.who)
	}
	b := campaign("other", newLocker(t, endpoints, &etcdlock.Options{WatchdogTTL: ttl}))
	if _, err := admin.Delete(ctxFor(t, 10*time.Second), first.key); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	second := nextTerm()
	if second.who != "other" || second.token <= first.token {
		t.Fatalf("after the delete %s elected with token %d, want the other candidate, token > %d", second.who, second.token, first.token)
	}
	select {
	case cause := <-first.ended:
		t.Logf("deposed leader's fn cancelled %v after the delete: %v", time.Since(deleted), cause)
		if !errors.Is(cause, fence.ErrLeaseLost) {
			t.Fatalf("deposed leader's fn cancelled with %v, want ErrLeaseLost", cause)
		}
	case <-time.After(2 * ttl):
		t.Fatalf("two leaders: the deaf candidate (token %d) still leads %v after its key was deleted and token %d was elected",
			first.token, time.Since(deleted), second.token)
	}
	cancel()
	for _, done := range []<-chan error{a, b} {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Lead = %v, want context.Canceled", err)
		}
	}
	close(terms)
	for tm := range terms {
		if tm.token <= second.token {
			t.Fatalf("a later term of %s has token %d, want > %d", tm.who, tm.token, second.token)
		}
	}
}
