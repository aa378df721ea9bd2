package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
	"go.uber.org/goleak"
)

// nilListener confirms every LISTEN and returns a nil channel, as a
// careless stub does ("return nil, nil" to turn notifications off).
type nilListener struct{}

func (nilListener) Listen(context.Context, string) (<-chan string, error) { return nil, nil }

// A Listener that returns a nil channel and no error never delivers
// anything, and never closes: the Locker's reader must not range over it
// for ever. Each wait would leave one goroutine behind, for good. The
// waiters still wake at the holder's expiry, as without a Listener.
func TestListenerReturnsNilChannel(t *testing.T) {
	d := newDatabase(t, pg)
	l, err := pglock.New(d.db, &pglock.Options{WatchdogTTL: watchdogTTL, Listener: nilListener{}})
	if err != nil {
		t.Fatal(err)
	}
	holder, err := l.Acquire(ctxFor(t, 10*time.Second), "nil", fence.TTL(800*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	for range 3 {
		if _, err := l.Acquire(ctxFor(t, 10*time.Second), "nil", fence.Wait(50*time.Millisecond)); !errors.Is(err, fence.ErrHeld) {
			t.Fatalf("Acquire = %v, want ErrHeld", err)
		}
	}
	var leaked error
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) { // polling with a deadline
		if leaked = goleak.Find(before); leaked == nil {
			break
		}
	}
	if leaked != nil {
		t.Fatalf("waits on a Listener with a nil channel left goroutines behind: %v", leaked)
	}
	// The waiter takes the lock at the holder's expiry.
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "nil", fence.TTL(time.Minute), fence.Wait(5*time.Second))
	if err != nil {
		t.Fatalf("waiter at the holder's expiry: %v", err)
	}
	if lease.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", lease.Token(), holder.Token())
	}
	_ = lease.Release(ctxFor(t, 10*time.Second))
}
