package redlock_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// slowAcquireReply is a hook that holds each acquisition's reply (the
// acquire script has three keys) for a random time up to max after the
// node ran it: network latency on the way back, so that grants are read
// after their try was decided, failed, or overtaken by Close.
type slowAcquireReply struct{ max time.Duration }

func (h slowAcquireReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowAcquireReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h slowAcquireReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); len(a) > 2 && fmt.Sprint(a[2]) == "3" {
			<-time.After(mrand.N(h.max)) // injected latency, not a wait for an event
		}
		return err
	}
}

// Acquisitions (some cancelled mid-way, some with a wait budget) run
// concurrently with a Close whose context ends almost at once, over three
// running nodes whose acquisition replies come back late (past the node
// timeout, often): Close gives up with tries out, whose grants are read
// after it did. Every node is running and answers every give-back, so once
// the acquisitions have returned, a second Close must return nil and no
// node may hold any of the locks: a give-back that was not sent (it ran
// under the context Close cancelled on giving up) leaves a running node
// locked for the lease time. Repeated with fresh Lockers until a deadline.
func TestStressAcquireCloseLeavesNothingOnRunningNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("stress")
	}
	srvs := nodes(t, 3)
	const ttl = 30 * time.Second
	stop := time.Now().Add(5 * time.Second)
	gaveUp := 0
	for iter := 0; time.Now().Before(stop); iter++ {
		l, cs := stressLocker(t, srvs, slowAcquireReply{max: 400 * time.Millisecond})
		names := []string{fmt.Sprintf("stress-%d-a", iter), fmt.Sprintf("stress-%d-b", iter)}
		tried := make(chan struct{}, 1024)
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					actx, cancel := context.WithTimeout(context.Background(), time.Duration(5+mrand.N(300))*time.Millisecond)
					opts := []fence.Option{fence.TTL(ttl)}
					if g%2 == 0 {
						opts = append(opts, fence.Wait(time.Duration(mrand.N(300))*time.Millisecond))
					}
					lease, err := l.Acquire(actx, names[g%len(names)], opts...)
					cancel()
					select {
					case tried <- struct{}{}:
					default:
					}
					if errors.Is(err, redlock.ErrClosed) {
						return
					}
					if err == nil {
						_ = lease.Release(context.Background())
					}
				}
			}()
		}
		// Close once a random number of acquisitions have returned.
		for range 1 + mrand.N(6) {
			select {
			case <-tried:
			case <-time.After(10 * time.Second):
				t.Fatal("no acquisition returned in 10 s")
			}
		}
		_, first := closeWithin(l, time.Duration(mrand.N(50))*time.Millisecond)
		if first != nil {
			gaveUp++
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("acquisitions still running 20 s after Close")
		}
		took, err := closeWithin(l, 20*time.Second)
		on := lockedOn(t, srvs, names[0])
		on = append(on, lockedOn(t, srvs, names[1])...)
		// A first Close that gave up stopped the retries of releases
		// whose first request failed (it outlived the node timeout on a
		// loaded machine): the second one reports them, as CloseError
		// says, and the nodes it names may keep such a lock (see
		// TestStressAcquireRenewCloseLeavesNothing). No other node may.
		stoppedOn := map[int]bool{}
		var ce *redlock.CloseError
		if err != nil && errors.As(err, &ce) && errors.Is(err, context.DeadlineExceeded) && first != nil {
			for _, i := range ce.Nodes {
				stoppedOn[i] = true
			}
		} else if err != nil {
			t.Fatalf("iteration %d: second Close (after %v), every node running: %v; locked on %v", iter, took, err, on)
		}
		for _, i := range on {
			if !stoppedOn[i] {
				t.Fatalf("iteration %d: locked on %v after the second Close returned %v", iter, on, err)
			}
		}
		for _, i := range on { // a stopped release's lock, gone by its lease time
			for _, name := range names {
				if err := srvs[i].Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		closeAll(cs)
		if iter > 0 && iter%10 == 0 {
			t.Logf("%d iterations, %d first Closes gave up", iter+1, gaveUp)
		}
	}
	t.Logf("%d first Closes gave up", gaveUp)
}

// As TestTryGivenBackAfterCloseGaveUp, but node 2 stays paused through the
// second Close, and the try either fails (its caller gives up) or
// succeeds after Close gave up (node 1's grant read then): the try is
// released by releaseTry, or by the Release of a lease Close overtook. The
// second Close must not hang on the paused node past the client's read
// timeout (the requests to it end there, and the retry is not started),
// must leave nothing on the running nodes 0 and 1, and must name exactly
// node 2.
func TestSecondCloseWithNodeStillHung(t *testing.T) {
	for _, succeed := range []bool{false, true} {
		t.Run(fmt.Sprintf("succeed=%v", succeed), func(t *testing.T) {
			srvs := nodes(t, 3)
			const name, ttl = "close-hung", 30 * time.Second
			h := &holdAcquireReply{held: make(chan struct{}), release: make(chan struct{})}
			cs := clientsWith(t, srvs, lateOptions, nil, h, nil)
			l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
			if err != nil {
				t.Fatal(err)
			}
			warmRelease(t, l, srvs, name, ttl)
			pause(t, srvs[2:]) // resumed only when the test ends
			h.armed.Store(true)
			ctx, cancel := context.WithCancel(ctxFor(t))
			defer cancel()
			acquired := make(chan error, 1)
			go func() {
				lease, err := l.Acquire(ctx, name, fence.TTL(ttl))
				if err == nil {
					err = lease.Release(ctxFor(t))
					if err == nil {
						err = errors.New("Acquire overtaken by Close returned a lease")
					}
				}
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
			if !succeed {
				cancel()
				if err := <-acquired; err == nil {
					t.Fatal("Acquire with its context cancelled returned a lease")
				}
			}
			close(h.release)
			if succeed {
				if err := <-acquired; !errors.Is(err, redlock.ErrClosed) {
					t.Fatalf("Acquire overtaken by Close = %v, want ErrClosed", err)
				}
			}
			took, err := closeWithin(l, 30*time.Second)
			var ce *redlock.CloseError
			if !errors.As(err, &ce) || !slices.Equal(ce.Nodes, []int{2}) {
				t.Fatalf("second Close (after %v) with node 2 paused: %v, want a *CloseError naming node 2", took, err)
			}
			if errors.Is(err, context.DeadlineExceeded) && took >= 29*time.Second {
				t.Fatalf("second Close gave up after %v: it hung on node 2", took)
			}
			if limit := lateOptions.ReadTimeout + 5*time.Second; took > limit {
				t.Fatalf("second Close took %v with node 2 paused, more than the read timeout and then some (%v)", took, limit)
			}
			t.Logf("second Close took %v: %v", took, err)
			if on := lockedOn(t, srvs[:2], name); len(on) != 0 {
				t.Fatalf("locked on running nodes %v after the second Close", on)
			}
		})
	}
}

// A renewal (Extend) runs on every node before the lease's deadline, its
// replies slow on their way back; the lease's deadline passes meanwhile,
// and Close is called: the lease is no longer held, so Close has nothing of
// it to release. But the nodes hold the lock, moved 30 s ahead by the
// renewal, until the renewal's replies are read and it gives the lock back
// (the lease has ended): Close, which a program calls before it exits,
// must not return nil before that give-back, or the exit leaves every node
// locked for 30 s.
func TestCloseWaitsForRenewalGiveBack(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "close-renewal-give-back"
	l, gates, extended := renewedPastDeadline(t, srvs, name)
	closed := make(chan error, 1)
	go func() { _, err := closeWithin(l, 10*time.Second); closed <- err }()
	select {
	case err := <-closed:
		if on := lockedOn(t, srvs, name); len(on) != 0 {
			for _, g := range gates {
				close(g.open)
			}
			<-extended
			t.Fatalf("Close returned %v with the lock on %v, moved there by a renewal not yet given back", err, on)
		}
		for _, g := range gates {
			close(g.open)
		}
	case <-time.After(300 * time.Millisecond): // Close is given time to return early, wrongly
		for _, g := range gates {
			close(g.open)
		}
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		if on := lockedOn(t, srvs, name); len(on) != 0 {
			t.Fatalf("Close returned nil with the lock on %v", on)
		}
	}
	if err := <-extended; err == nil {
		t.Fatal("Extend of a lease whose deadline passed returned nil")
	}
}

// slowReplies is slowAcquireReply for the extend script's replies too
// (its hash), each held up to maxExtend, less than the node timeout: a
// renewal's reply is read late, but read.
type slowReplies struct {
	slowAcquireReply
	extendHash string
	maxExtend  time.Duration
}

func (h slowReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	acq := h.slowAcquireReply.ProcessHook(next)
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && fmt.Sprint(a[1]) == h.extendHash {
			err := next(ctx, cmd)
			<-time.After(mrand.N(h.maxExtend)) // injected latency, not a wait for an event
			return err
		}
		return acq(ctx, cmd)
	}
}

// As TestStressAcquireCloseLeavesNothingOnRunningNodes, with short leases
// that their holders renew for 30 s (renewals racing the lease's deadline,
// their replies late but within the node timeout), release, or leave to
// run out. After the second Close returned nil, every lock left must run
// out within the short lease time: none may stay, moved 30 s ahead, on a
// running node.
func TestStressAcquireRenewCloseLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("stress")
	}
	srvs := nodes(t, 3)
	const short, long = 300 * time.Millisecond, 30 * time.Second
	stop := time.Now().Add(5 * time.Second)
	for iter := 0; time.Now().Before(stop); iter++ {
		l, cs := stressLocker(t, srvs, slowReplies{slowAcquireReply{max: 300 * time.Millisecond}, redlock.ExtendHash(), 150 * time.Millisecond})
		names := []string{fmt.Sprintf("stress-renew-%d-a", iter), fmt.Sprintf("stress-renew-%d-b", iter)}
		tried := make(chan struct{}, 1024)
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					actx, cancel := context.WithTimeout(context.Background(), time.Duration(50+mrand.N(300))*time.Millisecond)
					lease, err := l.Acquire(actx, names[g%len(names)], fence.TTL(short), fence.Wait(time.Duration(mrand.N(200))*time.Millisecond))
					cancel()
					select {
					case tried <- struct{}{}:
					default:
					}
					if errors.Is(err, redlock.ErrClosed) {
						return
					}
					if err != nil {
						continue
					}
					// Renew once the lease is close to its deadline, or
					// past it (the renewal then finds it ended).
					<-time.After(time.Duration(150+mrand.N(200)) * time.Millisecond) // the holder's work
					_ = lease.Extend(context.Background(), long)
					if mrand.N(2) == 0 {
						_ = lease.Release(context.Background())
					}
				}
			}()
		}
		for range 1 + mrand.N(10) {
			select {
			case <-tried:
			case <-time.After(10 * time.Second):
				t.Fatal("no acquisition returned in 10 s")
			}
		}
		var first error // a first Close's, if one gave up
		if mrand.N(2) == 0 {
			_, first = closeWithin(l, time.Duration(mrand.N(50))*time.Millisecond)
		}
		// Called while the holders still renew: once it returns nil,
		// no lock may be more than the short lease time ahead (a
		// renewal's, not given back yet), and none may come later.
		took, closeErr := closeWithin(l, 20*time.Second)
		// A first Close that gave up stopped the retries of releases
		// whose first request its own context ended (Close releases
		// the leases still held with it): as CloseError says, a later
		// Close reports them, with the first one's context error,
		// once the rest of the work has finished, and the nodes it
		// names may keep such a lock for its lease time (the long one,
		// after an Extend). In a loaded run: "iteration 7: Close
		// (after 421ms), every node running: redlock: close: 2
		// background requests not finished, on node 1, node 2:
		// context deadline exceeded". The claim then holds on the
		// other nodes; iterations without a first Close that gave up
		// still hold the second Close to nil on every node.
		stoppedOn := map[int]bool{}
		if closeErr != nil {
			var ce *redlock.CloseError
			if first == nil || !errors.As(closeErr, &ce) || !errors.Is(closeErr, context.DeadlineExceeded) || len(ce.Nodes) == 0 {
				t.Fatalf("iteration %d: Close (after %v), every node running: %v (first Close: %v)", iter, took, closeErr, first)
			}
			for _, i := range ce.Nodes {
				stoppedOn[i] = true
			}
		}
		for i, s := range srvs {
			for _, name := range names {
				pttl, err := s.Client(t).PTTL(ctxFor(t), lockKey(name)).Result()
				switch {
				case err != nil:
					t.Fatal(err)
				case pttl > short && stoppedOn[i]:
					// A stopped release's: gone by its lease
					// time, not worth waiting for here.
					if err := s.Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
						t.Fatal(err)
					}
				case pttl > short:
					t.Fatalf("iteration %d: %s locked on node %d for %v more when Close returned %v", iter, name, i, pttl, closeErr)
				}
			}
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("holders still running 20 s after Close")
		}
		for _, name := range names {
			waitUnlocked(t, srvs, name, 3*short) // what runs out by itself
		}
		closeAll(cs)
		if iter > 0 && iter%5 == 0 {
			t.Logf("%d iterations", iter+1)
		}
	}
}

// renewedPastDeadline acquires name on srvs for 600 ms and extends it by
// 30 s, the renewal run on every node with its replies held at the gates
// until the test opens them, and returns once the lease has ended at its
// deadline: every node holds the lock 30 s ahead for a lease that has
// ended. extended gets the Extend's result once the gates open.
func renewedPastDeadline(t *testing.T, srvs []*redistest.Server, name string) (*redlock.Locker, []*gateExtend, <-chan error) {
	t.Helper()
	l, gates := gatedLocker(t, srvs)
	lease := warmLease(t, l, name, 600*time.Millisecond)
	for _, g := range gates {
		g.late.Store(true)
	}
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(ctxFor(t), 30*time.Second) }()
	for i, g := range gates {
		select {
		case <-g.held:
		case <-time.After(5 * time.Second):
			t.Fatalf("node %d did not run the renewal", i)
		}
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	return l, gates, extended
}

// As TestCloseWaitsForRenewalGiveBack, but Close gives up while the
// renewal's replies are held: it reports the renewal under way (no node
// named: none has a release of this Locker's left), and the renewal, read
// afterwards, still gives the lock back on every node; a second Close then
// returns nil, with nothing locked.
func TestRenewalGivenBackAfterCloseGaveUp(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "close-gave-up-renewal"
	l, gates, extended := renewedPastDeadline(t, srvs, name)
	_, err := closeWithin(l, 50*time.Millisecond)
	var ce *redlock.CloseError
	if !errors.As(err, &ce) || ce.Left != 1 || len(ce.Nodes) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close during the renewal = %v, want a *CloseError for one renewal under way, naming no node", err)
	}
	for _, g := range gates {
		close(g.open)
	}
	if err := <-extended; err == nil {
		t.Fatal("Extend of a lease whose deadline passed returned nil")
	}
	if took, err := closeWithin(l, 10*time.Second); err != nil {
		t.Fatalf("second Close (after %v): %v", took, err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("locked on %v after the second Close returned nil", on)
	}
}

// A renewal moves the lock on node 0 only (its reply held until the
// lease's deadline has passed), its requests to nodes 1 and 2 lost on the
// way: it reaches no majority, and the lease ends at its deadline. Node 0's
// lock, moved 30 s ahead by a renewal of a lease that has ended, must be
// given back, as when a majority moved it: once Close has returned nil
// (and Extend has), node 0 holds nothing.
func TestRenewalOnMinorityPastDeadlineGivenBack(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "minority-renewal-past-deadline"
	l, gates := gatedLocker(t, srvs)
	lease := warmLease(t, l, name, 600*time.Millisecond)
	gates[0].late.Store(true)
	gates[1].drop.Store(true)
	gates[2].drop.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(ctxFor(t), 30*time.Second) }()
	select {
	case <-gates[0].held:
	case <-time.After(5 * time.Second):
		t.Fatal("node 0 did not run the renewal")
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	close(gates[0].open)
	if err := <-extended; err == nil {
		t.Fatal("Extend on a minority returned nil")
	}
	if took, err := closeWithin(l, 10*time.Second); err != nil {
		t.Fatalf("Close (after %v): %v", took, err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		pttl, _ := srvs[on[0]].Client(t).PTTL(ctxFor(t), lockKey(name)).Result()
		t.Fatalf("locked on %v (for %v more) after the lease ended and Close returned nil", on, pttl)
	}
}

// A renewal runs on every node, but none of its replies comes within the
// node timeout: Extend fails, the lease keeps its deadline, and runs out
// there, unrenewed. The nodes, which moved the lock 30 s ahead, must be
// given back when the lease ends: once Close has returned nil nothing is
// locked. (Nothing gave them back: Close returned nil at once with every
// node locked for 28 s more.)
func TestUnreadRenewalGivenBackAtLeaseEnd(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "unread-renewal"
	l, gates := gatedLocker(t, srvs)
	lease := warmLease(t, l, name, 5*time.Second)
	for _, g := range gates {
		g.late.Store(true)
	}
	defer func() {
		for _, g := range gates {
			close(g.open)
		}
	}()
	if err := lease.Extend(ctxFor(t), 30*time.Second); err == nil {
		t.Fatal("Extend with no reply returned nil")
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended before its deadline: %v", err)
	}
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	if took, err := closeWithin(l, 10*time.Second); err != nil {
		t.Fatalf("Close (after %v): %v", took, err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		pttl, _ := srvs[on[0]].Client(t).PTTL(ctxFor(t), lockKey(name)).Result()
		t.Fatalf("locked on %v (for %v more) after the lease ran out and Close returned nil", on, pttl)
	}
}

// stressLocker is the stress tests' Locker: a client per server of srvs
// with hook (lateOptions), a 200 ms node timeout and 5 ms between tries.
// The caller closes the clients (closeAll) once the round is checked.
func stressLocker(t *testing.T, srvs []*redistest.Server, hook redis.Hook) (*redlock.Locker, []redis.UniversalClient) {
	t.Helper()
	o := lateOptions
	cs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		o.Addr = s.Addr
		c := redis.NewClient(&o)
		c.AddHook(hook)
		cs[i] = c
	}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: 200 * time.Millisecond, RetryDelay: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return l, cs
}

func closeAll(cs []redis.UniversalClient) {
	for _, c := range cs {
		_ = c.Close()
	}
}
