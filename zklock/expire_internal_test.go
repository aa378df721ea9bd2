package zklock

import (
	"context"
	"testing"
	"time"
)

// The expiry timer's callback can run just as a reply or an Extend moves
// the deadline and resets the timer (a timer that has fired runs its
// callback even so): the lease must not end then, as it did when expire
// did not look at the deadline. The timer fires again at the new one.
// (Its end at the deadline is the expiry tests' to check: it starts the
// node's clean-up, which needs a connection.)
func TestExpireAfterDeadlineMoved(t *testing.T) {
	ls := &lease{l: &Locker{sessionTimeout: time.Second}, a: attempt{name: "lock:moved"}}
	ls.ctx, ls.cancel = context.WithCancelCause(context.Background())
	ls.mu.Lock()
	ls.deadline = time.Now().Add(time.Hour)
	ls.expiry = time.AfterFunc(time.Hour, func() {})
	ls.mu.Unlock()
	defer ls.expiry.Stop()
	ls.expire() // as a callback already running when the deadline moved
	if err := ls.Err(); err != nil {
		t.Fatalf("Err() = %v after the timer's callback ran with the deadline an hour away", err)
	}
}
