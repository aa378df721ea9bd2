package zklock_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// cutter is a zk.Dialer whose connection is closed right after it has
// written a request the test picks: the request reaches the server, its
// reply is lost with the connection.
type cutter struct {
	match atomic.Pointer[func([]byte) bool]
	cuts  atomic.Int64
	// seen, if set, is called with every request written, before match.
	seen atomic.Pointer[func([]byte)]
}

func (c *cutter) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: conn, c: c}, nil
}

type cutConn struct {
	net.Conn
	c *cutter
}

func (cc *cutConn) Write(p []byte) (int, error) {
	n, err := cc.Conn.Write(p)
	if f := cc.c.seen.Load(); f != nil {
		(*f)(p)
	}
	if f := cc.c.match.Load(); f != nil && (*f)(p) {
		cc.c.match.Store(nil)
		cc.c.cuts.Add(1)
		_ = cc.Conn.Close()
	}
	return n, err
}

// isLockCreate reports whether a packet is the create of a lock node:
// length, xid, opcode 1 (create), then the path with its "-lock-" infix.
func isLockCreate(p []byte) bool {
	return len(p) >= 12 && binary.BigEndian.Uint32(p[8:]) == 1 && bytes.Contains(p, []byte("-lock-"))
}

// A create whose reply is lost with the connection is found again by its
// guid after go-zookeeper reconnects: Acquire takes the lock with the node
// it made, and no duplicate is left behind to block the lock for the
// session's life.
func TestCreateReplyLost(t *testing.T) {
	// On the shared (warm) server the cut connection's next request can
	// be written before go-zookeeper sees the cut, and fails with the raw
	// write error: retried as a connection loss (see
	// TestRequestOnCutConnectionRetried).
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var c cutter
	l := newLockerDialer(t, addrs, c.dial)
	_, admin := newLocker(t, addrs)
	const name = "create-reply-lost"
	for round := range 3 {
		f := isLockCreate
		c.match.Store(&f)
		lease, err := l.Acquire(ctx, name)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if c.cuts.Load() != int64(round+1) {
			t.Fatalf("round %d: the connection was not cut", round)
		}
		if nodes := lockNodes(t, admin, name); len(nodes) != 1 {
			t.Fatalf("round %d: nodes %v, want the holder's only", round, nodes)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if nodes := lockNodes(t, admin, name); len(nodes) != 0 {
			t.Fatalf("round %d: nodes %v after Release", round, nodes)
		}
	}
}

// 100 goroutines on four sessions take and release one lock: never two
// holders at once, and tokens strictly increase in the order of the grants.
func TestManyContenders(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var lockers []*zklock.Locker
	for range 4 {
		l, _ := newLocker(t, addrs)
		lockers = append(lockers, l)
	}
	const name, n = "contended", 100
	var (
		holding atomic.Int64
		mu      sync.Mutex
		tokens  []fence.Token
		wg      sync.WaitGroup
		errs    = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			lease, err := lockers[i%len(lockers)].Acquire(ctx, name, fence.Wait(time.Minute))
			if err != nil {
				errs <- err
				return
			}
			if h := holding.Add(1); h != 1 {
				errs <- errors.New("two holders at once")
			}
			mu.Lock()
			tokens = append(tokens, lease.Token())
			mu.Unlock()
			holding.Add(-1)
			if err := lease.Release(ctx); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(tokens) != n {
		t.Fatalf("%d grants, want %d", len(tokens), n)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d: token %#x after %#x", i, tokens[i], tokens[i-1])
		}
	}
}

// Lock names with '/', '%', dots, unicode, or as long as allowed (in bytes
// that escape to three characters each) are distinct locks, held at once.
func TestNamesDistinct(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, admin := newLocker(t, addrs)
	names := []string{"a", "a/", "/a", "a/b", "a%2Fb", "a%252Fb", "ab", ".", "..", "a/../b", "결제/☃",
		strings.Repeat("결", fence.MaxNameLen/3), strings.Repeat("/", fence.MaxNameLen)}
	var leases []fence.Lease
	for _, n := range names {
		ls, err := l.Acquire(ctx, n)
		if err != nil {
			t.Fatalf("Acquire(%q) with %d others held: %v", n, len(leases), err)
		}
		leases = append(leases, ls)
	}
	for i, n := range names {
		if nodes := lockNodes(t, admin, n); len(nodes) != 1 {
			t.Errorf("%q: nodes %v, want 1", n, nodes)
		}
		if err := leases[i].Release(ctx); err != nil {
			t.Errorf("Release(%q) = %v", n, err)
		}
	}
}

// A user who closes the connection while a lease is held and another
// Acquire waits: the lease ends, Release says it was lost, the waiter
// fails; no panic, and no goroutine outlives the test (goleak).
func TestConnClosedWhileHeld(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connect(t, addrs, nil)
	l, err := zklock.New(conn, sessionTimeout)
	if err != nil {
		t.Fatal(err)
	}
	const name = "conn-closed"
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, name, fence.Wait(time.Minute))
		waited <- err
	}()
	_, admin := newLocker(t, addrs)
	waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == 2 })
	conn.Close()
	select {
	case <-lease.Done():
	case <-time.After(sessionTimeout):
		t.Fatalf("lease still held %v after its connection was closed", sessionTimeout)
	}
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
	select {
	case err := <-waited:
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("waiter = %v, want ErrNotAcquired", err)
		}
		t.Logf("waiter: %v", err)
	case <-time.After(sessionTimeout):
		t.Fatalf("waiter still waiting %v after its connection was closed", sessionTimeout)
	}
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
	if _, err := l.Acquire(ctx, name); !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire on a closed connection = %v, want ErrNotAcquired", err)
	}
	// The session closed with the connection: its nodes are gone.
	waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == 0 })
}

// A waiter whose session is closed behind its back gets an error, not the
// lock, although go-zookeeper opens a new session at once.
func TestSessionClosedWhileWaiting(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holderLocker, admin := newLocker(t, addrs)
	const name = "waiter-session-closed"
	holder, err := holderLocker.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var s session
	l := newLockerDialer(t, addrs, s.dial)
	type result struct {
		lease fence.Lease
		err   error
	}
	waited := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, fence.Wait(time.Minute))
		waited <- result{lease, err}
	}()
	waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == 2 })
	s.kill(t, srv.Addr)
	select {
	case r := <-waited:
		if r.err == nil {
			t.Fatalf("waiter whose session was closed got the lock: %v", r.lease)
		}
		t.Logf("waiter: %v", r.err)
	case <-time.After(2 * sessionTimeout):
		t.Fatalf("waiter still waiting %v after its session was closed", 2*sessionTimeout)
	}
	if holder.Err() != nil {
		t.Fatal(holder.Err())
	}
	if nodes := lockNodes(t, admin, name); len(nodes) != 1 {
		t.Fatalf("nodes %v, want the holder's only", nodes)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// before is a zk.Dialer that calls f with each packet its connections are
// about to write.
type before struct {
	f atomic.Pointer[func([]byte)]
}

func (b *before) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &beforeConn{Conn: conn, b: b}, nil
}

type beforeConn struct {
	net.Conn
	b *before
}

func (bc *beforeConn) Write(p []byte) (int, error) {
	if f := bc.b.f.Load(); f != nil {
		(*f)(p)
	}
	return bc.Conn.Write(p)
}

// totalWatches is the number of watches the server holds (wchs).
func totalWatches(t testing.TB, srv interface{ Command(string) (string, error) }) string {
	t.Helper()
	out, err := srv.Command("wchs")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(out, "\n") {
		if n, ok := strings.CutPrefix(line, "Total watches:"); ok {
			return strings.TrimSpace(n)
		}
	}
	t.Fatalf("wchs: %q", out)
	return ""
}

// A waiter whose predecessor goes away just before the waiter sets its
// watch on it takes the lock, and leaves no watch behind: an exists-watch
// set on a node that no longer exists would stay, on the server and in
// go-zookeeper, for the session's life (it waits for a creation that never
// comes, sequential names being unique), one more at each such race, all
// set again at each reconnection.
func TestPredecessorGoneBeforeWatch(t *testing.T) {
	srv := startZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holderLocker, admin := newLocker(t, addrs)
	const name = "pred-gone"
	holder, err := holderLocker.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var b before
	l := newLockerDialer(t, addrs, b.dial)
	// When the waiter asks about its predecessor (an exists or a get
	// request naming the holder's node), the holder releases first.
	holderNode := lockNodes(t, admin, name)[0]
	var released atomic.Bool
	f := func(p []byte) {
		if len(p) < 12 || !bytes.Contains(p, []byte(holderNode)) || released.Load() {
			return
		}
		if op := binary.BigEndian.Uint32(p[8:]); op == 3 || op == 4 {
			released.Store(true)
			if err := holder.Release(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	b.f.Store(&f)
	lease, err := l.Acquire(ctx, name, fence.Wait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !released.Load() {
		t.Fatal("the waiter did not ask about its predecessor")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if nodes := lockNodes(t, admin, name); len(nodes) != 0 {
		t.Fatalf("nodes %v after Release", nodes)
	}
	if n := totalWatches(t, srv); n != "0" {
		t.Fatalf("%s watches left on the server with no lock held, want 0", n)
	}
}

// A Release that cannot delete the node (its ctx already ended, as in a
// deferred Release after a deadline) ends the lease locally, as redislock
// does, whose key then expires with its TTL. A ZooKeeper node does not
// expire while its session lives: it must still be deleted, or the lock
// is taken for as long as the holder's process runs.
func TestReleaseWithEndedCtxFreesLock(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, admin := newLocker(t, addrs)
	other, _ := newLocker(t, addrs)
	const name = "release-ended-ctx"
	for _, opts := range [][]fence.Option{nil, {fence.TTL(time.Second)}} {
		lease, err := l.Acquire(ctx, name, opts...)
		if err != nil {
			t.Fatal(err)
		}
		ended, cancelEnded := context.WithCancel(ctx)
		cancelEnded()
		err = lease.Release(ended)
		t.Logf("Release with an ended ctx = %v; Err() = %v", err, lease.Err())
		if err == nil {
			continue
		}
		// The lease reports itself ended: the lock must come free, within
		// a session timeout or two, though the session lives on.
		if lease.Err() != nil {
			next, err := other.Acquire(ctx, name, fence.Wait(2*sessionTimeout))
			if err != nil {
				t.Fatalf("lease ended by a failed Release (%v), but the lock is still taken: %v; nodes %v",
					lease.Err(), err, lockNodes(t, admin, name))
			}
			if err := next.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// An Acquire whose ctx ends just as each of its requests is sent (create,
// list, watch) leaves no node behind once its background cleanup is done.
func TestAcquireCancelledAtEachStep(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holderLocker, admin := newLocker(t, addrs)
	const name = "cancelled-steps"
	holder, err := holderLocker.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	var b before
	l := newLockerDialer(t, addrs, b.dial)
	var sent, cancelAt atomic.Int64
	var cancelCall atomic.Pointer[context.CancelFunc]
	f := func(p []byte) {
		if len(p) < 12 || !bytes.Contains(p, []byte(name)) {
			return
		}
		switch binary.BigEndian.Uint32(p[8:]) {
		case 1, 4, 12: // create, getData, getChildren2
			if sent.Add(1) == cancelAt.Load() {
				(*cancelCall.Load())()
			}
		}
	}
	b.f.Store(&f)
	// Without cancelling: the requests of an Acquire that waits out its
	// budget (its delete on giving up is not counted).
	if _, err := l.Acquire(ctx, name, fence.Wait(200*time.Millisecond)); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire = %v, want ErrHeld", err)
	}
	total := sent.Load()
	for step := int64(1); step <= total; step++ {
		sent.Store(0)
		cancelAt.Store(step)
		actx, acancel := context.WithCancel(ctx)
		cancelCall.Store(&acancel)
		_, err := l.Acquire(actx, name, fence.Wait(time.Minute))
		acancel()
		t.Logf("step %d of %d: %v", step, total, err)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("step %d: Acquire = %v, want context.Canceled", step, err)
		}
		waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == 1 })
	}
	if holder.Err() != nil {
		t.Fatal(holder.Err())
	}
}

// A create whose reply was lost, retried after find missed its node (a
// server of the ensemble that had not applied it yet answered the list),
// leaves two nodes of one attempt: the earlier one, a duplicate no one
// holds, would be the lowest and block the lock for the session's life.
// Acquire must delete a duplicate of its own guid. The test makes the
// duplicate from another session, just before the create is sent.
func TestDuplicateNodeOfOwnAttempt(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, admin := newLocker(t, addrs)
	var b before
	l := newLockerDialer(t, addrs, b.dial)
	const name = "duplicate"
	var made atomic.Bool
	f := func(p []byte) {
		if !isLockCreate(p) || made.Load() {
			return
		}
		// The path follows the header (12 bytes) as a length and bytes.
		n := binary.BigEndian.Uint32(p[12:])
		path := string(p[16 : 16+n])
		_, err := admin.Create(path, nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		switch {
		case err == nil:
			made.Store(true)
		case !errors.Is(err, zk.ErrNoNode): // the first create makes the directory
			t.Error(err)
		}
	}
	b.f.Store(&f)
	lease, err := l.Acquire(ctx, name, fence.Wait(2*sessionTimeout))
	if !made.Load() {
		t.Fatal("no duplicate made")
	}
	if err != nil {
		t.Fatalf("Acquire behind a duplicate of its own node = %v; nodes %v", err, lockNodes(t, admin, name))
	}
	if nodes := lockNodes(t, admin, name); len(nodes) != 1 {
		t.Fatalf("nodes %v, want the holder's only", nodes)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Extends given no deadline, with the server hung (the first one sent,
// the next ones queued while go-zookeeper reconnects), give up by the
// lease's own deadline, when the lease has ended anyway.
func TestExtendBoundedByLeaseDeadline(t *testing.T) {
	srv := startZK(t)
	l, _ := newLocker(t, []string{srv.Addr})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, err := l.Acquire(ctx, "extend-hung")
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	t.Cleanup(srv.Cont)
	extended := make(chan error, 1)
	go func() {
		for {
			err := lease.Extend(context.Background(), time.Minute)
			if err == nil || errors.Is(err, fence.ErrLeaseLost) {
				extended <- err
				return
			}
			t.Logf("Extend = %v", err)
		}
	}()
	limit := time.Until(lease.Deadline()) + time.Second
	select {
	case err := <-extended:
		t.Logf("Extend = %v, %v after the deadline", err, time.Since(lease.Deadline()))
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Extend = %v, want ErrLeaseLost", err)
		}
	case <-time.After(limit):
		srv.Cont()
		<-extended
		t.Fatalf("Extend still waiting on the hung server %v after the lease's deadline", time.Since(lease.Deadline()))
	}
}

// Two goroutines release the same lease at once (a deferred Release and an
// explicit one): one deletes the node, and neither may report the lease
// lost; both get the result of the one conclusive Release.
func TestConcurrentRelease(t *testing.T) {
	srv := sharedZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, _ := newLocker(t, []string{srv.Addr})
	for round := range 20 {
		lease, err := l.Acquire(ctx, "concurrent-release")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { errs[i] = lease.Release(ctx) })
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("round %d: concurrent Releases = %v, %v; Err() = %v", round, errs[0], errs[1], lease.Err())
		}
	}
}

// A connection loss is not an expiry: a waiter whose list request is cut
// off with its connection (the reply lost) lists again once go-zookeeper
// has reconnected, and takes the lock when it comes free, rather than
// failing the Acquire on a blip.
func TestWaiterSurvivesConnectionLoss(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holderLocker, admin := newLocker(t, addrs)
	const name = "waiter-conn-loss"
	holder, err := holderLocker.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var c cutter
	// The waiter watches the holder once it has sent its read of the
	// holder's node (GetW, opcode 4): it has listed, and its list's reply
	// showed the holder. Seeing the waiter's node is not enough: its list
	// may still be on its way, and ZooKeeper may serve it after the
	// holder's delete (another session's request), so that the waiter
	// finds itself first and takes the lock without listing again: the
	// cut below then never comes (0 cuts, in a loaded run).
	nodes := lockNodes(t, admin, name)
	if len(nodes) != 1 {
		t.Fatalf("lock nodes %v, want the holder's alone", nodes)
	}
	holderNode := []byte(nodes[0][strings.LastIndex(nodes[0], "/")+1:])
	watching := make(chan struct{})
	var once sync.Once
	seen := func(p []byte) {
		if len(p) >= 12 && binary.BigEndian.Uint32(p[8:]) == 4 && bytes.Contains(p, holderNode) {
			once.Do(func() { close(watching) })
		}
	}
	c.seen.Store(&seen)
	l := newLockerDialer(t, addrs, c.dial)
	type result struct {
		lease fence.Lease
		err   error
	}
	waited := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, fence.Wait(30*time.Second))
		waited <- result{lease, err}
	}()
	select {
	case <-watching:
	case r := <-waited:
		t.Fatalf("the waiter returned (%v, %v) before it watched the holder", r.lease, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not read the holder's node within 10 s")
	}
	// Cut the waiter's next list: the one the holder's release makes it
	// send (the watch fires, or the read finds the node gone).
	f := func(p []byte) bool {
		return len(p) >= 12 && binary.BigEndian.Uint32(p[8:]) == 12 && bytes.Contains(p, []byte(name))
	}
	c.match.Store(&f)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatalf("waiter failed on a connection loss (%d cuts): %v", c.cuts.Load(), r.err)
	}
	if c.cuts.Load() != 1 {
		t.Fatalf("%d cuts, want 1", c.cuts.Load())
	}
	if r.lease.Token() <= holder.Token() {
		t.Fatalf("token %#x after %#x", r.lease.Token(), holder.Token())
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
