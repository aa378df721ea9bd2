package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// closeWithin calls Close with a context of d and returns how long it took
// and its error.
func closeWithin(l *redlock.Locker, d time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := l.Close(ctx)
	return time.Since(start), err
}

// Release returns at a majority with one node paused; the delete to that
// node is still in flight. Close waits for it: the node is woken while
// Close waits, and the moment Close returns nil nothing is locked on any
// node. (Without Close, a process exiting there leaves the paused node
// locked for the lease time: see the CLI's TestExecRedlockSlowNode.)
func TestCloseWaitsForReleaseAtMajority(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "close-release", 30 * time.Second
	l := lateLocker(t, srvs, name)
	lease := acquireFast(t, l, name, ttl)
	resume := pause(t, srvs[2:])
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if on := lockedOn(t, srvs[:2], name); len(on) != 0 {
		t.Fatalf("locked on running nodes %v after Release", on)
	}
	done := make(chan error, 1)
	go func() { _, err := closeWithin(l, 10*time.Second); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("Close returned %v with the last delete stuck in a paused node", err)
	case <-time.After(200 * time.Millisecond): // Close is given time to return early, wrongly
	}
	resume()
	if err := <-done; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("Close returned nil while still locked on %v", on)
	}
}

// A node hung for longer than Close's deadline: Close returns at its
// deadline with a *CloseError naming that node (and matching
// context.DeadlineExceeded), not after the node timeout; the retries are
// stopped, a second Close waits for the requests in flight and, the
// retry of the one that failed having been stopped, names node 1 again
// (not nil: node 1 may keep the lock), and no goroutine is left (TestMain's
// goleak).
func TestCloseDeadlineWithHungNode(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "close-hung", 30 * time.Second
	l := lateLocker(t, srvs, name)
	lease := acquireFast(t, l, name, ttl)
	resume := pause(t, srvs[1:2])
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	const budget = 300 * time.Millisecond
	took, err := closeWithin(l, budget)
	var ce *redlock.CloseError
	if !errors.As(err, &ce) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with node 1 hung = %v, want a *CloseError matching DeadlineExceeded", err)
	}
	if fmt.Sprint(ce.Nodes) != "[1]" || ce.Addrs[0] != srvs[1].Addr || ce.Left < 1 {
		t.Fatalf("CloseError names nodes %v (%v), %d left; want node 1 (%s)", ce.Nodes, ce.Addrs, ce.Left, srvs[1].Addr)
	}
	if took > budget+lateNodeTimeout/4 {
		t.Fatalf("Close with a %v deadline took %v (node timeout %v)", budget, took, lateNodeTimeout)
	}
	t.Logf("Close: %v after %v", err, took)
	// The request in flight ends when the client gives up on it (its read
	// timeout, 10 s: go-redis does not take socket deadlines from the
	// context by default); its retry, which Close stopped, does not start.
	took, err = closeWithin(l, 20*time.Second)
	if !errors.As(err, &ce) || !errors.Is(err, context.DeadlineExceeded) || fmt.Sprint(ce.Nodes) != "[1]" {
		t.Fatalf("second Close (after %v) = %v, want the *CloseError naming node 1, whose retry was stopped", took, err)
	}
	if took >= 15*time.Second {
		t.Fatalf("second Close took %v: it waited for its own context, not the request in flight", took)
	}
	resume()
	// Acquire is refused; the lease's Release says what it said.
	if _, err := l.Acquire(ctxFor(t), name); !errors.Is(err, redlock.ErrClosed) || !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire after Close = %v, want ErrClosed and ErrNotAcquired", err)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release after Close: %v, want the first call's nil", err)
	}
}

// Close with a lease still held releases it (as etcd's Session.Close
// revokes its lease): nothing stays locked, the lease ends as released,
// its Release returns nil, Acquire after Close sends nothing and fails
// with ErrClosed, Close again returns nil at once. A node paused during the
// Acquire grants it late while Close runs: Close waits for that grant to
// be given back, and leaves nothing locked.
func TestCloseReleasesHeldLeasesAndLateGrant(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "close-held", 30 * time.Second
	l := lateLocker(t, srvs, name)
	resume := pause(t, srvs[2:])
	lease := acquireFast(t, l, name, ttl)
	watched, err := l.Acquire(ctxFor(t), name+"-watchdog") // a watchdog lease, its goroutine running
	if err != nil {
		t.Fatalf("Acquire with the watchdog: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := closeWithin(l, 10*time.Second); done <- err }()
	wake := time.AfterFunc(200*time.Millisecond, resume) // the late grant comes while Close waits
	if err := <-done; err != nil {
		t.Fatalf("Close: %v", err)
	}
	<-timeAfter(wake, resume)
	for _, n := range []string{name, name + "-watchdog"} {
		if on := lockedOn(t, srvs, n); len(on) != 0 {
			t.Fatalf("%s still locked on %v after Close", n, on)
		}
	}
	for _, ls := range []fence.Lease{lease, watched} {
		if !errors.Is(ls.Err(), fence.ErrReleased) {
			t.Fatalf("lease %v after Close: Err %v, want ErrReleased", ls, ls.Err())
		}
		if err := ls.Release(ctxFor(t)); err != nil {
			t.Fatalf("Release after Close: %v", err)
		}
		if err := ls.Extend(ctxFor(t), ttl); !errors.Is(err, fence.ErrReleased) {
			t.Fatalf("Extend after Close: %v, want ErrReleased", err)
		}
	}
	before := scriptCalls(t, srvs[0])
	if _, err := l.Acquire(ctxFor(t), name, fence.Wait(time.Second)); !errors.Is(err, redlock.ErrClosed) || !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire after Close = %v, want ErrClosed and ErrNotAcquired", err)
	}
	if after := scriptCalls(t, srvs[0]); after != before {
		t.Fatalf("Acquire after Close ran %d scripts", after-before)
	}
	if took, err := closeWithin(l, time.Second); err != nil || took > 500*time.Millisecond {
		t.Fatalf("Close again: %v after %v, want nil at once", err, took)
	}
}

// Close called (twice, at once) while goroutines acquire and release other
// names in a loop and a node is paused (each Release leaves a delete in
// flight): every Acquire returns a lease or ErrClosed, never hangs; both
// Closes return nil once the node is woken, and then nothing is locked
// anywhere, whichever Acquires won the race.
func TestCloseConcurrentWithAcquireRelease(t *testing.T) {
	srvs := nodes(t, 3)
	l := lateLocker(t, srvs, "close-race-0")
	resume := pause(t, srvs[2:])
	var (
		wg      sync.WaitGroup
		granted atomic.Int32
		mu      sync.Mutex
		names   []string
		errs    = make(chan error, 64)
	)
	for g := range 6 {
		wg.Go(func() {
			for k := 0; ; k++ {
				// Odd goroutines keep their leases, for Close to release.
				name := fmt.Sprintf("close-race-%d-%d", g, k)
				mu.Lock()
				names = append(names, name)
				mu.Unlock()
				lease, err := l.Acquire(ctxFor(t), name, fence.TTL(30*time.Second))
				if errors.Is(err, redlock.ErrClosed) {
					return
				}
				if err != nil {
					errs <- fmt.Errorf("Acquire %s: %w", name, err)
					return
				}
				granted.Add(1)
				if g%2 == 0 {
					_ = lease.Release(ctxFor(t)) // may be Close's to release
				}
			}
		})
	}
	// Close once some leases were granted.
	deadline := time.Now().Add(20 * time.Second)
	for granted.Load() < 12 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	closeErrs := make(chan error, 2)
	for range 2 {
		go func() { _, err := closeWithin(l, 20*time.Second); closeErrs <- err }()
	}
	wake := time.AfterFunc(300*time.Millisecond, resume)
	for range 2 {
		if err := <-closeErrs; err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	<-timeAfter(wake, resume)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, name := range names {
		if on := lockedOn(t, srvs, name); len(on) != 0 {
			t.Errorf("%s locked on %v after Close returned nil", name, on)
		}
	}
	t.Logf("%d leases granted before Close", granted.Load())
}

// cutRelease is a hook that fails the next release script calls (cut > 0)
// without sending them, as a connection cut before the request left, and
// records when the first acquisition call has returned and when a release
// call went through.
type cutRelease struct {
	acqHash, relHash string
	cut              atomic.Int32
	acqOnce          sync.Once
	acqDone          chan struct{}
	relSent          chan struct{}
}

func (h *cutRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cutRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *cutRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		sha := ""
		if len(a) > 1 {
			sha = fmt.Sprint(a[1])
		}
		if sha == h.relHash {
			if h.cut.Add(-1) >= 0 {
				err := errors.New("test: connection cut")
				cmd.SetErr(err)
				return err
			}
			select {
			case h.relSent <- struct{}{}:
			default:
			}
		}
		err := next(ctx, cmd)
		if sha == h.acqHash {
			h.acqOnce.Do(func() { close(h.acqDone) })
		}
		return err
	}
}

// Node 2 is paused while a lease is acquired on nodes 0 and 1, whose token
// records are an hour ahead: node 2's acquisition sits in its socket, and
// when it runs it issues node 2's own, smaller token, whose reply is never
// read (the node timeout passes first). Release's revocation of node 2 is
// cut before it leaves; its background retry is what reaches the node. The
// retry must carry the lease's token, as the revocation did: node 2's
// record must end at least at the lease's token, or a later majority of
// node 2 and a node that lost its record issues a token below the lease's.
func TestBackgroundReleaseRetryCarriesToken(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "retry-token", 30 * time.Second
	acq, rel := redlock.ScriptHashes()
	h := &cutRelease{acqHash: acq, relHash: rel, acqDone: make(chan struct{}), relSent: make(chan struct{}, 1)}
	cs := clientsWith(t, srvs, lateOptions)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	warmUp(t, l, srvs, name, ttl)
	cs[2].AddHook(h)
	ahead := time.Now().Add(time.Hour).UnixMicro()
	for _, s := range srvs[:2] {
		if err := s.Client(t).Set(ctxFor(t), lockKey(name)+":token", ahead, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	resume := pause(t, srvs[2:])
	h.cut.Store(1)
	lease := acquireFast(t, l, name, ttl)
	if lease.Token() <= fence.Token(ahead) {
		t.Fatalf("token %d, want > the records %d", lease.Token(), ahead)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// The grant is never read: its request times out. The retry goes out
	// (to the paused node's socket, behind the acquisition).
	for what, c := range map[string]chan struct{}{"node 2's acquisition did not time out": h.acqDone, "the release was not retried": h.relSent} {
		select {
		case <-c:
		case <-time.After(20 * time.Second): // the client's read timeout is 10 s
			t.Fatal(what)
		}
	}
	resume()
	waitUnlocked(t, srvs, name, 5*time.Second)
	var rec int64
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, err = srvs[2].Client(t).Get(ctxFor(t), lockKey(name)+":token").Int64()
		if err == nil && rec >= int64(lease.Token()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 2's token record %d (%v), want >= the lease's %d", rec, err, lease.Token())
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	if _, err := closeWithin(l, 5*time.Second); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// A failed Acquire (the lock held by another owner on nodes 0 and 1) with
// node 2 paused: its try is in node 2's socket, with the revocation behind
// it, when Close is called. Close waits for both; woken while Close waits,
// node 2 runs them, and the moment Close returns nil node 2 holds nothing
// of this Locker's.
func TestCloseWaitsForFailedTryOnPausedNode(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "close-failed-try"
	l := lateLocker(t, srvs, name)
	for _, s := range srvs[:2] {
		if err := s.Client(t).Set(ctxFor(t), lockKey(name), "someone-else", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	resume := pause(t, srvs[2:])
	if _, err := l.Acquire(ctxFor(t), name, fence.TTL(30*time.Second)); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire of a lock held on a majority = %v, want ErrHeld", err)
	}
	done := make(chan error, 1)
	go func() { _, err := closeWithin(l, 10*time.Second); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("Close returned %v with the try and its revocation stuck in a paused node", err)
	case <-time.After(200 * time.Millisecond): // Close is given time to return early, wrongly
	}
	resume()
	if err := <-done; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if on := lockedOn(t, srvs[2:], name); len(on) != 0 {
		t.Fatalf("node 2 locked by the failed try when Close returned nil")
	}
}

// fence.Lead on a closed Locker returns at once with an error matching
// fence.ErrClosed, not after campaigning with back-off until its context
// ends (ErrClosed matches fence.ErrNotAcquired, which Lead retries), and
// never runs fn.
func TestLeadStopsOnClosedLocker(t *testing.T) {
	l := newLocker(t, nodes(t, 3), nil)
	if _, err := closeWithin(l, 10*time.Second); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := fence.Lead(ctx, l, "lead-closed", func(context.Context, fence.Lease) error {
		t.Error("fn ran on a closed Locker")
		return nil
	})
	if !errors.Is(err, fence.ErrClosed) || !errors.Is(err, redlock.ErrClosed) || ctx.Err() != nil {
		t.Fatalf("Lead on a closed Locker = %v (ctx %v), want fence.ErrClosed at once", err, ctx.Err())
	}
}
