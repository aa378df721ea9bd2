package redislock_test

import (
	"context"
	"errors"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
)

// TestQueueOfQuittersStaysSmall: while one holder keeps the lock, waiters
// come with short budgets and give up. Each one's entry leaves the hash
// when it withdraws; its owner id must not stay in the queue list for
// ever either: a lock held for hours under a steady stream of quitters
// would grow the list without bound (and the release that finally comes
// would walk all of it in one script).
func TestQueueOfQuittersStaysSmall(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name, workers, each = "lock:quitters", 8, 40
	lock := lockKey(name)
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	// One patient waiter keeps the queue's keys alive meanwhile.
	patient := make(chan error, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		patient <- err
	}()
	waitFor(t, func() bool { return admin.HLen(ctx(t), lock+":waiters").Val() == 1 })
	var wg sync.WaitGroup
	for range workers {
		l := newLocker(t, srv.Client(t))
		wg.Go(func() {
			for range each {
				if _, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Millisecond), fence.TTL(time.Minute)); err == nil {
					t.Error("acquired a held lock")
				}
			}
		})
	}
	wg.Wait()
	waitFor(t, func() bool { return admin.HLen(ctx(t), lock+":waiters").Val() == 1 })
	// Compaction keeps the list within twice the entries plus 16, plus the
	// one just pushed. The entries at the last enqueue: the patient
	// waiter's and, per worker, its current try's and those of its earlier
	// attempts whose withdrawal has not run yet: a quitter's withdrawal
	// runs on a goroutine of its own (Acquire returns without waiting for
	// it), so a worker's next tries may queue first. Polling HLEN during
	// this test saw up to 18 entries for the 8 workers and the patient
	// waiter; the bound counts three per worker. (One per worker,
	// 2*(workers+1)+17 = 35, failed about 1 run in 30 with 36 or 37 owners,
	// on main as well.) Without compaction the list holds every quitter:
	// 321.
	if n := admin.LLen(ctx(t), lock+":queue").Val(); n > 2*(3*workers+1)+17 {
		t.Errorf("after %d quitters (one waiter left) the queue list holds %d owners", workers*each, n)
	}
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-patient; err != nil {
		t.Fatalf("the patient waiter: %v", err)
	}
}

// gate delays what a client reads while it is shut: a slow reader, a GC
// pause, a subscription's backlog. Data already read is held back too.
type gate struct {
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) shut() { g.mu.Lock(); g.open = make(chan struct{}); g.mu.Unlock() }

func (g *gate) reopen() {
	g.mu.Lock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
	g.mu.Unlock()
}

func (g *gate) wait() {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	<-ch
}

type gatedConn struct {
	net.Conn
	g *gate
}

func (c gatedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.g.wait()
	return n, err
}

// gatedClient is a client of addr whose replies and messages wait at g.
func gatedClient(t testing.TB, addr string, g *gate) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return gatedConn{conn, g}, nil
	}})
	t.Cleanup(func() { g.reopen(); _ = c.Close() })
	return c
}

// TestLateGrantKeepsRenewing: a grant that the waiter reads late (its
// reader paused for 40% of the watchdog TTL: a GC pause, a backlog) is
// still fresh enough to use, and the lease must then last like any other:
// its watchdog's renewals must not be refused as late because the lease
// mapped its deadline to the server's clock from the moment it read the
// grant rather than when the grant was made.
func TestLateGrantKeepsRenewing(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name, ttl = "lock:lategrant", 3 * time.Second
	lock := lockKey(name)
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	g := newGate()
	wl, err := redislock.New(gatedClient(t, srv.Addr, g), &redislock.Options{WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan fence.Lease, 1)
	go func() {
		ls, err := wl.Acquire(ctx(t), name, fence.Wait(20*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	waitFor(t, func() bool { return admin.HLen(ctx(t), lock+":waiters").Val() == 1 && subscribers(t, admin, name) == 1 })
	g.shut()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(ttl*4/10, g.reopen) // the pause under attack
	ls := <-got
	if ls == nil {
		t.FailNow()
	}
	defer ls.Release(ctx(t))
	// The grant set the lock for ttl; the watchdog's first renewal (a
	// third of ttl after the lease began) sets it to ttl again.
	waitFor(t, func() bool {
		return ls.Err() != nil || admin.PTTL(ctx(t), lock).Val() > ttl*9/10
	})
	if err := ls.Err(); err != nil {
		t.Fatalf("the lease from a grant read %v late ended before its deadline: %v", ttl*4/10, err)
	}
}

// TestGrantStorm: 64 waiters over 3 Lockers, with random budgets and
// lease times, a fifth of them cancelled at a random moment, 8 more on a
// fourth Locker whose client dies mid-wait (nothing withdraws them), and a
// first holder that crashes (never releases). Every waiter must either get
// the lock or its budget's error (or its ctx's), no two leases may
// overlap (a shared counter), tokens must increase in the order the
// leases begin, and the queue's keys must be gone at the end.
func TestGrantStorm(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { grantStorm(t, redistest.Start(t)) })
	t.Run("replicated", func(t *testing.T) {
		// Replica sync applies: every grant is confirmed by a try.
		primary := redistest.Start(t)
		redistest.StartReplica(t, primary)
		redistest.WaitReplicated(t, primary, 1)
		grantStorm(t, primary)
	})
}

func grantStorm(t *testing.T, srv *redistest.Server) {
	admin := srv.Client(t)
	const name = "lock:storm"
	lock := lockKey(name)
	crashClient := redis.NewClient(&redis.Options{Addr: srv.Addr})
	acquire(t, newLocker(t, crashClient), name, fence.TTL(time.Second))
	_ = crashClient.Close() // the holder crashed

	lockers := []*redislock.Locker{newLocker(t, srv.Client(t)), newLocker(t, srv.Client(t)), newLocker(t, srv.Client(t))}
	deadClient := redis.NewClient(&redis.Options{Addr: srv.Addr})
	dead := newLocker(t, deadClient)

	var (
		mu      sync.Mutex
		holding fence.Lease // the lease held, nil when none
		last    fence.Token
		got     atomic.Int32
	)
	// A lease of 50–250 ms may run out during the work on a loaded
	// machine: the next holder may then take the lock, once its Deadline
	// has passed, and not before; nor may a lease end before its Deadline.
	hold := func(ls fence.Lease) {
		mu.Lock()
		if holding != nil && time.Now().Before(holding.Deadline()) {
			t.Errorf("two holders: token %d acquired while token %d's lease lasts %v more",
				ls.Token(), holding.Token(), time.Until(holding.Deadline()))
		}
		holding = ls
		if ls.Token() <= last {
			t.Errorf("token %d after %d", ls.Token(), last)
		}
		last = ls.Token()
		mu.Unlock()
		// The work: a few round trips under the lock.
		for range 3 {
			admin.Incr(ctx(t), "storm:work")
		}
		if err := ls.Err(); err != nil && time.Now().Before(ls.Deadline()) {
			t.Errorf("lease %d ended %v before its Deadline: %v", ls.Token(), time.Until(ls.Deadline()), err)
		}
		mu.Lock()
		if holding == ls {
			holding = nil
		}
		mu.Unlock()
		if err := ls.Release(ctx(t)); err != nil && !(errors.Is(err, fence.ErrLeaseLost) && !time.Now().Before(ls.Deadline())) {
			t.Errorf("release %d: %v", ls.Token(), err)
		}
	}
	var wg sync.WaitGroup
	for i := range 64 {
		l := lockers[i%len(lockers)]
		budget := 300*time.Millisecond + rand.N(4*time.Second)
		ttl := 50*time.Millisecond + rand.N(200*time.Millisecond)
		cancelAt := time.Duration(-1)
		if rand.N(5) == 0 {
			cancelAt = rand.N(budget)
		}
		wg.Go(func() {
			c, cancel := context.WithCancel(ctx(t))
			defer cancel()
			if cancelAt >= 0 {
				time.AfterFunc(cancelAt, cancel)
			}
			ls, err := l.Acquire(c, name, fence.Wait(budget), fence.TTL(ttl))
			switch {
			case err == nil:
				got.Add(1)
				hold(ls)
			case !errors.Is(err, fence.ErrNotAcquired):
				t.Errorf("waiter %d: %v, not ErrNotAcquired", i, err)
			case cancelAt >= 0 && errors.Is(err, context.Canceled):
			case !errors.Is(err, fence.ErrHeld):
				t.Errorf("waiter %d (budget %v): %v, want its budget's end", i, budget, err)
			}
		})
	}
	deadDone := make(chan struct{})
	var dwg sync.WaitGroup
	for range 8 {
		dwg.Go(func() {
			if ls, err := dead.Acquire(ctx(t), name, fence.Wait(3*time.Second), fence.TTL(time.Second)); err == nil {
				hold(ls)
			}
		})
	}
	go func() { dwg.Wait(); close(deadDone) }()
	waitFor(t, func() bool { return admin.HLen(ctx(t), lock+":waiters").Val() >= 40 })
	_ = deadClient.Close() // the fourth process dies mid-wait
	wg.Wait()
	<-deadDone
	t.Logf("%d of 64 got the lock", got.Load())
	if got.Load() == 0 {
		t.Error("nobody got the lock")
	}
	waitFor(t, func() bool {
		n, err := admin.Exists(ctx(t), lock, lock+":queue", lock+":waiters").Result()
		return err == nil && n == 0
	})
}

// TestShortGrantNoHerd: a grant for a short lease (to a waiter with a
// short TTL, or one capped by a waiter's budget) moves the other waiters'
// timers to its end, in case nobody releases it. When it is released and
// the lock granted on, for longer, the waiters must not all try at the
// short grant's end anyway: the grant that followed is the lock's state,
// and a release of it will be published too.
func TestShortGrantNoHerd(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name, n = "lock:herd", 10
	lock := lockKey(name)
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	short := make(chan error, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(100*time.Millisecond))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		short <- err
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lock+":queue").Val() == 1 })
	var cmds counter
	c := srv.Client(t)
	c.AddHook(&cmds)
	l, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg     sync.WaitGroup
		first  atomic.Bool
		during atomic.Int64
		before atomic.Int64
	)
	for i := range n {
		wg.Go(func() {
			ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(2*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			if first.CompareAndSwap(false, true) {
				// Hold it until well past the short grant's end.
				waitFor(t, func() bool { return admin.PTTL(ctx(t), lock).Val() < time.Second })
				during.Store(cmds.n.Load() - before.Load())
			}
			if err := ls.Release(ctx(t)); err != nil {
				t.Error(err)
			}
		})
		waitFor(t, func() bool { return admin.LLen(ctx(t), lock+":queue").Val() == int64(i+2) })
	}
	before.Store(cmds.n.Load())
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-short; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if d := during.Load(); d > 0 {
		t.Errorf("%d commands from %d waiters while the lock was granted on for 2s: they tried at the 100ms grant's end", d, n-1)
	}
}

// TestHugeQueueWithHammer: 2000 waiters over 2 Lockers queue behind a
// holder while a caller without a wait budget hammers the lock. Each
// waiter must get the lock in its turn within its budget (the hammer
// may not starve the queue), no two leases overlap, the server runs a
// few commands per try and release (no walk of the queue per release),
// and the queue's keys are gone at the end.
func TestHugeQueueWithHammer(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name, n = "lock:huge", 2000
	lock := lockKey(name)
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	lockers := []*redislock.Locker{newLocker(t, srv.Client(t)), newLocker(t, srv.Client(t))}
	var (
		holders atomic.Int32
		wg      sync.WaitGroup
	)
	hold := func(ls fence.Lease) {
		if holders.Add(1) != 1 {
			t.Error("two holders at once")
		}
		holders.Add(-1)
		if err := ls.Release(ctx(t)); err != nil {
			t.Error(err)
		}
	}
	// The budget is generous: under -race, 2000 handoffs take some 19 s
	// on an idle 2-CPU machine (1.6 s without it), and CI, running other
	// packages beside this one, once took more than 25 s. A hammer that
	// starved the queue would keep waiters out past any budget.
	wctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := range n {
		wg.Go(func() {
			ls, err := lockers[i%2].Acquire(wctx, name, fence.Wait(2*time.Minute), fence.TTL(10*time.Second))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			hold(ls)
		})
	}
	waitFor(t, func() bool { return admin.LLen(ctx(t), lock+":queue").Val() == n })
	// The server's work is counted, not timed (the machine is shared: a
	// command can be descheduled for milliseconds): every command it runs,
	// those called by scripts included, per try made.
	if err := admin.ConfigResetStat(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	hammered := make(chan [2]int)
	hammer := newLocker(t, srv.Client(t))
	go func() {
		got, tries := 0, 0
		for {
			select {
			case <-stop:
				hammered <- [2]int{got, tries}
				return
			default:
			}
			tries++
			if ls, err := hammer.Acquire(ctx(t), name, fence.TTL(10*time.Second)); err == nil {
				got++
				hold(ls)
			}
		}
	}()
	start := time.Now()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(stop)
	took := time.Since(start)
	h := <-hammered
	calls := allCommandCalls(t, admin)
	perTry := float64(calls) / float64(2*n+h[1])
	t.Logf("%d waiters through in %v; the hammer got it %d times in %d tries; %d commands run on the server, %.1f per try or release", n, took, h[0], h[1], calls, perTry)
	// About 4 (each script makes a few calls); a release that walked the
	// queue with one call per waiter made it 116 in a trial.
	if perTry > 20 {
		t.Errorf("%.1f commands run on the server per try or release (%d over %d waiters and %d tries): does a script walk the queue?", perTry, calls, n, h[1])
	}
	waitFor(t, func() bool {
		n, err := admin.Exists(ctx(t), lock+":queue", lock+":waiters").Result()
		return err == nil && n == 0
	})
}
