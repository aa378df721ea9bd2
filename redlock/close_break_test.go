package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// Release with two of three nodes paused, over clients that put the
// context's deadline on the socket: their deletes time out (the node
// timeout) while they sit in the paused nodes' sockets, and Release,
// having deleted on one node only, concludes nothing. The nodes wake and
// run those deletes (this lease's own). A retry then finds the lock gone
// on both: that is no evidence that the lease was lost (it was held until
// the first call, and its own deletes are what removed it), so the retry
// must not report ErrLeaseLost; the lock is released.
func TestReleaseRetryAfterTimedOutDeletes(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "retry-timed-out", 30 * time.Second
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	resume := pause(t, srvs[1:])
	err = lease.Release(ctxFor(t))
	if !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Release with 2 of 3 nodes paused = %v, want ErrNoQuorum", err)
	}
	resume()
	waitUnlocked(t, srvs, name, 10*time.Second)
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release retried once the lease's own deletes ran everywhere: %v, want nil", err)
	}
}

// A fixed-TTL lease left to run out (its holder never looked at it again:
// no Done, no Context, no Observer, so no timer ends it) is not held when
// Close is called: Close has nothing of it to release and returns nil, as
// it does for a lease whose end a timer saw. It returned the lease's
// ErrLeaseLost as though a release had failed.
func TestCloseAfterUnwatchedLeaseRanOut(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "close-ran-out"
	l := newLocker(t, srvs, nil)
	watched, err := l.Acquire(ctxFor(t), name+"-watched", fence.TTL(300*time.Millisecond))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	_ = watched.Done() // its expiry timer ends it
	if _, err := l.Acquire(ctxFor(t), name, fence.TTL(300*time.Millisecond)); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	// Both run out on every node (and so past their local deadlines).
	waitUnlocked(t, srvs, name, 10*time.Second)
	waitUnlocked(t, srvs, name+"-watched", 10*time.Second)
	if _, err := closeWithin(l, 5*time.Second); err != nil {
		t.Fatalf("Close after the leases ran out: %v, want nil", err)
	}
}

// holdReleaseReply holds the replies of the release script, once it has
// run on its node, from its caller until open is closed (when armed): the
// deletes are done, the Release that sent them has not heard of it yet.
type holdReleaseReply struct {
	relHash string
	armed   atomic.Bool
	open    chan struct{}
}

func (h *holdReleaseReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdReleaseReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *holdReleaseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); err == nil && len(a) > 1 && fmt.Sprint(a[1]) == h.relHash && h.armed.Load() {
			<-h.open
		}
		return err
	}
}

// Close releases a lease that the program is still renewing itself (its
// own Extend loop, in another goroutine, at shutdown). A renewal that finds
// the lock gone because Close's release deleted it must not end the lease
// as lost: the lease ends released (Err, the Observer), Release returns
// nil, and the renewal returns ErrReleased (with ErrLeaseLost, as after
// any Release: the lease is no longer the caller's). Here the
// release's replies are held until the renewal has returned, so the
// renewal sees every delete done before the release hears of them.
func TestCloseWhileExtending(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "close-extending"
	_, rel := redlock.ScriptHashes()
	h := &holdReleaseReply{relHash: rel, open: make(chan struct{})}
	cs := clientsWith(t, srvs, lateOptions, h, h, h)
	rec := &recorder{}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(30*time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := lease.Extend(ctxFor(t), 30*time.Second); err != nil { // loads extend.lua
		t.Fatalf("Extend: %v", err)
	}
	warmRelease(t, l, srvs, name, 30*time.Second)
	h.armed.Store(true)
	closed := make(chan error, 1)
	go func() { _, err := closeWithin(l, 10*time.Second); closed <- err }()
	waitUnlocked(t, srvs, name, 5*time.Second) // Close's deletes ran
	extErr := lease.Extend(ctxFor(t), 30*time.Second)
	close(h.open)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
		t.Errorf("lease released by Close while renewed: Err %v, want ErrReleased", err)
	}
	if !errors.Is(extErr, fence.ErrReleased) {
		t.Errorf("renewal during Close's release = %v, want an error matching ErrReleased (the lease is released)", extErr)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, e := range rec.ends {
		if e.Cause != fence.Released {
			t.Errorf("the Observer was told the lease ended as %v (%v), want Released", e.Cause, e.Err)
		}
	}
}

// Close gives up while an Acquire is still at its first contact with a
// paused node (the ping before the acquisition, not counted on any node):
// the *CloseError must still say what was left, not "on " followed by no
// node at all. The Acquire then fails with ErrClosed or returns a lease
// that Close was too early to release: either way nothing stays locked on
// the running nodes once it has returned and the node is woken.
func TestCloseErrorDuringFirstContact(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "close-first-contact"
	cs := clientsWith(t, srvs, lateOptions)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	resume := pause(t, srvs[2:])
	// redistest's readiness check and others called INFO on node 0
	// already: wait for the first contact's INFO server. Each contactCalls
	// is an INFO too, counted by the next one.
	pings := contactCalls(t, srvs[0])
	acquired := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctxFor(t), name, fence.TTL(30*time.Second))
		if err == nil {
			err = lease.Release(ctxFor(t))
		}
		acquired <- err
	}()
	// The first contact waits for the paused node up to DefaultConnectTimeout.
	deadline := time.Now().Add(5 * time.Second)
	for own := 1; ; own++ {
		if contactCalls(t, srvs[0]) > pings+own {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Acquire did not contact node 0")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	_, err = closeWithin(l, 200*time.Millisecond)
	var ce *redlock.CloseError
	if !errors.As(err, &ce) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close during the first contact = %v, want a *CloseError", err)
	}
	if msg := err.Error(); strings.Contains(msg, "on :") || strings.HasSuffix(strings.TrimSuffix(msg, ": "+context.DeadlineExceeded.Error()), "on") {
		t.Errorf("CloseError %q names nothing where it says \"on\"", msg)
	}
	if ce.Left < 1 {
		t.Errorf("CloseError.Left = %d with an Acquire under way", ce.Left)
	}
	resume()
	if err := <-acquired; err != nil && !errors.Is(err, redlock.ErrClosed) {
		t.Fatalf("Acquire overtaken by Close: %v, want a lease or ErrClosed", err)
	}
	took, err := closeWithin(l, 20*time.Second)
	if err != nil {
		// The first Close, giving up, stopped the give-back of the try
		// on node 2 (its revocation or a retry of it): node 2 may keep
		// the lock for its lease time, and the second Close says so.
		// Nothing else may be left.
		if !errors.As(err, &ce) || !slices.Equal(ce.Nodes, []int{2}) {
			t.Fatalf("second Close (after %v): %v, want nil or a *CloseError naming node 2", took, err)
		}
		if on := lockedOn(t, srvs[:2], name); len(on) != 0 {
			t.Fatalf("locked on running nodes %v after the second Close named node 2 only", on)
		}
		return
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("locked on %v after the second Close returned nil", on)
	}
}

// Close gives up (its deadline) while the release of node 2 is being
// retried in the background (every attempt cut before it leaves): the
// retries stop, node 2 keeps the lock, and the *CloseError says so. A later
// Close must not then return nil, as if the Locker's work were done: node 2
// is still locked, and nothing will delete it; it reports the node again.
func TestCloseAfterGivingUpReportsStoppedRetries(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "close-stopped", 30 * time.Second
	acq, rel := redlock.ScriptHashes()
	h := &cutRelease{acqHash: acq, relHash: rel, acqDone: make(chan struct{}), relSent: make(chan struct{}, 1)}
	cs := clientsWith(t, srvs, lateOptions)
	cs[2].AddHook(h)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	h.cut.Store(1 << 30) // every release to node 2, and every retry, is cut
	t.Cleanup(func() { h.cut.Store(0) })
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	_, err = closeWithin(l, 300*time.Millisecond)
	var ce *redlock.CloseError
	if !errors.As(err, &ce) || fmt.Sprint(ce.Nodes) != "[2]" {
		t.Fatalf("Close with node 2's release retried = %v, want a *CloseError naming node 2", err)
	}
	if on := lockedOn(t, srvs, name); fmt.Sprint(on) != "[2]" {
		t.Fatalf("locked on %v after the first Close, want [2]", on)
	}
	took, err := closeWithin(l, 5*time.Second)
	if err == nil {
		if on := lockedOn(t, srvs, name); len(on) != 0 {
			t.Fatalf("second Close returned nil after %v with node 2's release stopped and %s locked on %v", took, name, on)
		}
	}
	if !errors.As(err, &ce) || fmt.Sprint(ce.Nodes) != "[2]" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Close = %v, want the *CloseError naming node 2, matching the first Close's DeadlineExceeded", err)
	}
}

// commands is how many commands the server has processed, less the INFO
// calls that read it.
func commands(t *testing.T, s *redistest.Server, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(ctxFor(t), "stats").Result()
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	_, rest, _ := strings.Cut(info, "total_commands_processed:")
	line, _, _ := strings.Cut(rest, "\r\n")
	n, err := strconv.ParseInt(line, 10, 64)
	if err != nil {
		t.Fatalf("INFO stats: %q: %v", line, err)
	}
	return n
}

// After Close, Acquire (with or without a wait budget, on a Locker that
// never reached its nodes, and on one that did) sends nothing at all to
// any node: no ping of a first contact, no script, no connection. Status
// still works.
func TestAcquireAfterCloseSendsNothing(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "closed-silent"
	readers := make([]*redis.Client, len(srvs))
	for i, s := range srvs {
		readers[i] = s.Client(t)
	}
	for _, used := range []bool{false, true} {
		l := newLocker(t, srvs, nil)
		if used {
			lease, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(ctxFor(t)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := closeWithin(l, 5*time.Second); err != nil {
			t.Fatalf("Close: %v", err)
		}
		before := make([]int64, len(srvs))
		for i, s := range srvs {
			before[i] = commands(t, s, readers[i])
		}
		for _, opts := range [][]fence.Option{nil, {fence.TTL(time.Second)}, {fence.Wait(time.Second)}} {
			if _, err := l.Acquire(ctxFor(t), name, opts...); !errors.Is(err, redlock.ErrClosed) || !errors.Is(err, fence.ErrNotAcquired) {
				t.Fatalf("Acquire%v after Close = %v, want ErrClosed", opts, err)
			}
		}
		for i, s := range srvs {
			// Each INFO counts itself: one more than before.
			if n := commands(t, s, readers[i]) - before[i]; n != 1 {
				t.Fatalf("used=%v: node %d processed %d commands during Acquire after Close", used, i, n-1)
			}
		}
		if _, err := l.Status(ctxFor(t), name); err != nil {
			t.Fatalf("Status after Close: %v", err)
		}
	}
}

// Close overtakes an Acquire between its requests and its replies: the
// acquisition succeeds on the nodes, and the try releases it itself and
// fails with ErrClosed. No lease was granted, so the Observer, told of a
// failed Acquire, must not be told of a lease's end either (LeaseEnded is
// once per granted lease: a hold-time histogram would count a lease that
// nobody held), and nothing stays locked once Close has returned.
func TestCloseOvertakingAcquireReportsNoLease(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "close-overtaken"
	rec := &recorder{}
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: generous, Observer: rec})
	closed := make(chan error, 1)
	var armed atomic.Bool
	armed.Store(true)
	redlock.SetBeforeReplies(l, func() {
		if !armed.CompareAndSwap(true, false) {
			return // the probes' own tries
		}
		go func() { _, err := closeWithin(l, 10*time.Second); closed <- err }()
		waitClosing(t, l, name, 10*time.Second)
	})
	if _, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second)); !errors.Is(err, redlock.ErrClosed) {
		t.Fatalf("Acquire overtaken by Close = %v, want ErrClosed", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("locked on %v after Close returned nil", on)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, e := range rec.ends {
		if e.Name == name {
			t.Errorf("the Observer was told of the end of a lease that no Acquire granted: %+v", e)
		}
	}
}

// As TestCloseWaitsForReleaseAtMajority, over clients that put the
// context's deadline on the socket: node 2's acquisition and then its
// release (a revocation: the grant never came) time out on the client's
// side while they sit, unread, in the paused node's socket, and go-redis
// closes their connections. Close waits for the release's background
// retry; the node is woken while it waits and runs, in some order, the
// acquisition, the first revocation and the retry. The moment Close
// returns nil node 2 holds no lock, and a late grant there was refused or
// deleted, not left.
func TestCloseWithSocketDeadlinesPausedNode(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "close-socket-deadlines", 30 * time.Second
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: 300 * time.Millisecond})
	warm, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl)) // loads the scripts
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	before := scriptCalls(t, srvs[2])
	resume := pause(t, srvs[2:])
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire with node 2 paused: %v", err)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := closeWithin(l, 20*time.Second); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("Close returned %v with node 2 paused", err)
	case <-time.After(time.Second): // past the client-side timeouts of both requests
	}
	resume()
	if err := <-done; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("locked on %v the moment Close returned nil", on)
	}
	if n := scriptCalls(t, srvs[2]) - before; n < 2 {
		t.Fatalf("node 2 ran %d scripts after it was woken, want the acquisition and a release", n)
	}
}

// countRelease counts the release script calls made through a client.
type countRelease struct {
	relHash string
	n       atomic.Int32
}

func (h *countRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *countRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && fmt.Sprint(a[1]) == h.relHash {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// releaseGate holds the release scripts sent while it is armed until open
// is closed (or their context ends).
type releaseGate struct {
	relHash string
	armed   atomic.Bool
	open    chan struct{}
}

func (g *releaseGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *releaseGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *releaseGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); g.armed.Load() && len(a) > 1 && fmt.Sprint(a[1]) == g.relHash {
			select {
			case <-g.open:
			case <-ctx.Done():
			}
		}
		return next(ctx, cmd)
	}
}

// A Release with a cancelled context concludes nothing; node 2 is paused,
// so its delete is still out when the two others have deleted the lock. A
// retry is then decided by those late replies, and must send nothing more:
// node 2's delete is on its way, and a second one (sent on a context the
// decision had already cancelled, so failing at once) set off background
// retries of its own, which a Close that gave up reported as releases it
// had stopped. Once Close returns, node 2 was sent one release, and a Close
// with a cancelled context, called while the node is still paused, names
// only what is really out.
func TestReleaseRetryDecidedSendsNothing(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "retry-decided", 30 * time.Second
	_, rel := redlock.ScriptHashes()
	h := &countRelease{relHash: rel}
	gate := &releaseGate{relHash: rel, open: make(chan struct{})}
	cs := clientsWith(t, srvs, lateOptions, gate, gate)
	cs[2].AddHook(h)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	warm, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl)) // loads the scripts
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	if _, err := closeWithin(l, 5*time.Second); err != nil {
		t.Fatalf("Close after the warm-up: %v", err)
	}
	l, err = redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range srvs {
		// The acquisition ran everywhere: every delete finds the lock.
		waitLocked(t, s, name, 5*time.Second)
	}
	resume := pause(t, srvs[2:])
	h.n.Store(0)
	// Nodes 0 and 1 answer only once the cancelled Release has returned:
	// had they answered first, it could have concluded (deleted on a
	// majority) rather than return its context's error.
	gate.armed.Store(true)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lease.Release(cancelled); err == nil {
		t.Fatal("Release with a cancelled context returned nil at once")
	}
	close(gate.open)
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("retried Release: %v", err)
	}
	if _, err := closeWithin(l, 200*time.Millisecond); err == nil {
		t.Fatal("Close returned nil with node 2's delete in its paused socket")
	}
	resume()
	_, err = closeWithin(l, 20*time.Second)
	if n := h.n.Load(); n != 1 {
		t.Errorf("node 2 was sent %d releases, want the first call's one", n)
	}
	var ce *redlock.CloseError
	if errors.As(err, &ce) {
		t.Errorf("Close after node 2 ran its delete reports releases stopped: %v", err)
	} else if err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
}

// Close gives up while a try is out (node 1's grant held on its way back,
// node 2 paused), then the try fails (its caller gives up): its give-back
// on node 1, a running node, must still be sent. It was not: it ran under
// the context that Close cancelled on giving up, never left, and node 1
// kept the lock for the whole lease time, named by the next Close.
func TestTryGivenBackAfterCloseGaveUp(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "close-then-give-back", 30 * time.Second
	// Only this name's acquisition is held: warm's Release may still be
	// running on node 1 when the hook is armed (a loaded CI run,
	// 2026-12-04: its reply was held, the acquisition went through, and
	// Acquire returned a lease).
	h := &holdAcquireReply{held: make(chan struct{}), release: make(chan struct{}), key: name}
	cs := clientsWith(t, srvs, lateOptions, nil, h, nil)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	warm := func(name string) { // connects to every node before one pauses
		lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := lease.Release(ctxFor(t)); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	warm("warm")
	resume := pause(t, srvs[2:])
	h.armed.Store(true)
	ctx, cancel := context.WithCancel(ctxFor(t))
	acquired := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, name, fence.TTL(ttl))
		acquired <- err
	}()
	select {
	case <-h.held:
	case <-time.After(10 * time.Second):
		t.Fatal("node 1 did not run the acquisition")
	}
	if _, err := closeWithin(l, 100*time.Millisecond); err == nil {
		t.Fatal("Close with a try out returned nil")
	}
	cancel()
	if err := <-acquired; err == nil {
		t.Fatal("Acquire with its context cancelled returned a lease")
	}
	close(h.release)
	resume()
	took, err := closeWithin(l, 20*time.Second)
	var ce *redlock.CloseError
	if err != nil && (!errors.As(err, &ce) || !slices.Equal(ce.Nodes, []int{2})) {
		t.Fatalf("second Close (after %v): %v, want nil or a *CloseError naming node 2", took, err)
	}
	if on := lockedOn(t, srvs[:2], name); len(on) != 0 {
		t.Fatalf("locked on running nodes %v after Close", on)
	}
}

// contactCalls is the number of INFO commands srv has served before this
// one (INFO commandstats): the first contact sends INFO server.
func contactCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	info, err := srv.Client(t).Info(ctxFor(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, found := strings.Cut(info, "cmdstat_info:calls=")
	if !found {
		return 0
	}
	digits, _, _ := strings.Cut(rest, ",")
	n, err := strconv.Atoi(digits)
	if err != nil {
		t.Fatalf("INFO commandstats: cmdstat_info:calls=%s", digits)
	}
	return n
}

// waitClosing probes l with Acquire (name+"-probe", a lease of ttl) until
// Close has been called: a probe then fails at once with ErrClosed,
// sending nothing (one that got in first is released). It reports false,
// with t.Error, if that has not happened within 5 s.
func waitClosing(t *testing.T, l *redlock.Locker, name string, ttl time.Duration) bool {
	deadline := time.Now().Add(5 * time.Second)
	for {
		probe, err := l.Acquire(context.Background(), name+"-probe", fence.TTL(ttl))
		if errors.Is(err, redlock.ErrClosed) {
			return true
		}
		if err == nil {
			_ = probe.Release(context.Background())
		}
		if time.Now().After(deadline) {
			t.Error("Close was not called")
			return false
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
}
