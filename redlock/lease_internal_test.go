package redlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestObservedLeaseEndsAtDeadlineBeforeItsTimer: a lease whose deadline has
// passed is lost, whether or not its expiry timer has run yet. An Observer
// (or a Logger, or a call of Done) gives the lease a timer; with one, Err
// and Release used to leave the ending to the timer's goroutine, and in
// the gap before it ran, Err said the lease was held and Release deleted
// the lock and answered nil (reported Released), where the same lease
// without an Observer answers ErrLeaseLost. The gap is made here by moving
// the deadline back while the timer still waits for the old one, a minute
// away. The end is reported once, as an expiry.
func TestObservedLeaseEndsAtDeadlineBeforeItsTimer(t *testing.T) {
	clients := threeNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, first := range []string{"Err", "Release"} {
		t.Run(first, func(t *testing.T) {
			rec := &observetest.Recorder{}
			l, err := New(clients, &Options{Observer: rec})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Close(ctx) }()
			fl, err := l.Acquire(ctx, "lock:payment:1001:"+first, fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			ls := fl.(*lease)
			passDeadline(t, ls)
			if first == "Err" {
				if err := ls.Err(); !errors.Is(err, fence.ErrLeaseLost) {
					t.Fatalf("Err after the deadline, before the timer ran = %v, want ErrLeaseLost", err)
				}
				select {
				case <-ls.Done():
				default:
					t.Fatal("Done not closed once Err said the lease was lost")
				}
			}
			if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Release after the deadline, before the timer ran = %v, want ErrLeaseLost", err)
			}
			ends := rec.Ends()
			if len(ends) != 1 || ends[0].Cause != fence.LostExpired {
				t.Fatalf("reported ends %+v, want one, LostExpired", ends)
			}
		})
	}
}

// threeNodes starts three independent redis-servers and returns a client
// of each.
func threeNodes(t *testing.T) []redis.UniversalClient {
	var clients []redis.UniversalClient
	for range 3 {
		clients = append(clients, redistest.Start(t).Client(t))
	}
	return clients
}
