package memlock_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// A watchdog lease that Extend shortened below the watchdog's next renewal
// ends at its Deadline, as a fixed lease does: Done closes and Context is
// cancelled then, without anyone calling Err (a fn of Run or Lead watches
// only its context). It used to stay open until the next renewal, a third
// of the watchdog TTL after the last: fn went on working while the lease's
// Deadline had passed, and the first Acquire ended it.
func TestShortenedWatchdogLeaseEndsAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, 30*time.Second)
		lease := mustAcquire(t, l, "n")
		if err := lease.Extend(context.Background(), time.Second); err != nil {
			t.Fatal(err)
		}
		deadline := lease.Deadline()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if !isDone(lease) && time.Now().After(lease.Deadline()) {
			t.Fatalf("the lease's Deadline passed %v ago (set by Extend to %v), and Done is still open", time.Since(lease.Deadline()), deadline.Format(time.StampMilli))
		}
		// Whichever way it went, Err and Done agree.
		if (lease.Err() != nil) != isDone(lease) {
			t.Fatalf("Err %v, Done closed %v", lease.Err(), isDone(lease))
		}
		_ = lease.Release(context.Background())
	})
}
