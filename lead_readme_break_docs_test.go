package fence_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// TestREADMELeadSnippet runs the README's fence.Lead snippet on a real Redis
// and checks what its comments promise: the leader's fn is cancelled with a
// cause matching ErrLeaseLost when its lock is deleted, and OnDeposed gets
// an error matching it; a candidate waiting in its campaign's Acquire (a
// 10 s wait) returns context.Cause(ctx) soon after ctx is cancelled, not at
// the end of its wait; the leader's Lead returns context.Cause(ctx) too.
func TestREADMELeadSnippet(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	type result struct {
		who string
		err error
	}
	var mu sync.Mutex
	var causes []error
	var deposed []error
	elected := make(chan string, 10)
	returned := make(chan result, 2)
	stopped := errors.New("shutting down")
	cancels := map[string]context.CancelCauseFunc{}
	for _, who := range []string{"a", "b"} {
		// 3 s: a term must not end by itself (renewals a loaded machine
		// delayed), which would add a cause to those checked below.
		locker, err := redislock.New(srv.Client(t), &redislock.Options{WatchdogTTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancelCause(t.Context())
		cancels[who] = cancel
		consume := func(ctx context.Context, _ fence.Token) error {
			elected <- who
			<-ctx.Done()
			mu.Lock()
			causes = append(causes, context.Cause(ctx))
			mu.Unlock()
			return nil
		}
		go func() {
			// The README's snippet, with consume as above.
			err := fence.Lead(ctx, locker, "leader:billing", func(ctx context.Context, lease fence.Lease) error {
				// Lead until ctx is cancelled: the lease was lost (context.Cause matches
				// fence.ErrLeaseLost) or ctx of Lead ended. Pass lease.Token() with each write.
				return consume(ctx, lease.Token())
			},
				fence.LeaseOptions(fence.Wait(10*time.Second)), // each campaign's Acquire; TTL too
				fence.Backoff(100*time.Millisecond, 10*time.Second),
				fence.OnElected(func(l fence.Lease) { slog.Debug("leading", "token", l.Token()) }),
				fence.OnDeposed(func(l fence.Lease, err error) {
					mu.Lock()
					deposed = append(deposed, err)
					mu.Unlock()
				}))
			returned <- result{who, err}
		}()
	}
	defer func() {
		for _, c := range cancels {
			c(stopped)
		}
	}()
	var first string
	select {
	case first = <-elected:
	case <-time.After(10 * time.Second):
		t.Fatal("nobody elected")
	}
	second := map[string]string{"a": "b", "b": "a"}[first]

	// The lock is deleted behind the leader's back: the other one leads
	// (it was waiting), and the deposed fn's cause matches ErrLeaseLost.
	if err := admin.Del(t.Context(), "fence:{leader:billing}").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case who := <-elected:
		if who != second {
			t.Fatalf("%s elected again, want %s", who, second)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no new leader after the lock was deleted")
	}
	// The old leader learns of its loss at its next renewal (up to a
	// third of its 3 s lease later), which may come after the other's
	// election: wait for its fn and OnDeposed to have run.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		mu.Lock()
		n := min(len(causes), len(deposed))
		mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond) // a poll with a deadline
	}
	mu.Lock()
	if len(causes) != 1 || !errors.Is(causes[0], fence.ErrLeaseLost) {
		t.Errorf("deposed fn's causes %v, want one matching ErrLeaseLost", causes)
	}
	if len(deposed) != 1 || !errors.Is(deposed[0], fence.ErrLeaseLost) {
		t.Errorf("OnDeposed errors %v, want one matching ErrLeaseLost", deposed)
	}
	mu.Unlock()

	// The first one campaigns again and waits (10 s budget) while the
	// second leads: cancelling its ctx ends Lead with the cause, at once.
	start := time.Now()
	cancels[first](stopped)
	select {
	case r := <-returned:
		if r.who != first || !errors.Is(r.err, stopped) {
			t.Fatalf("Lead of %s returned %v, want %s's with the cause %v", r.who, r.err, first, stopped)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("a waiting candidate's Lead returned %v after its ctx was cancelled", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting candidate's Lead did not return 5 s after its ctx was cancelled")
	}
	cancels[second](stopped)
	select {
	case r := <-returned:
		if !errors.Is(r.err, stopped) {
			t.Fatalf("leader's Lead returned %v, want the cause %v", r.err, stopped)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the leader's Lead did not return 5 s after its ctx was cancelled")
	}
}
