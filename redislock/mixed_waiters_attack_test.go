package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// holdChecker checks the leases of one lock as they are returned: no
// lease is returned while another one still believes itself held (not
// released, not ended, before its deadline), and each token is larger
// than every one returned before.
type holdChecker struct {
	t      *testing.T
	mu     sync.Mutex
	held   map[fence.Lease]bool
	last   fence.Token
	leases int
}

func newHoldChecker(t *testing.T) *holdChecker {
	return &holdChecker{t: t, held: make(map[fence.Lease]bool)}
}

func (c *holdChecker) took(ls fence.Lease) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leases++
	for h := range c.held {
		if h.Err() == nil && now.Before(h.Deadline()) {
			c.t.Errorf("two holders: token %d returned while token %d holds until %v (%v from now)", ls.Token(), h.Token(), h.Deadline().Format("15:04:05.000"), h.Deadline().Sub(now))
		}
	}
	// Tokens grow among leases live when returned. One that ended before
	// its Acquire's caller got it (an Observer's AcquireDone that called
	// Acquire again, the lease lost meanwhile: the inner Acquire's lease,
	// a greater token, is recorded first) holds nothing to order.
	if live := ls.Err() == nil && now.Before(ls.Deadline()); live && ls.Token() <= c.last {
		c.t.Errorf("token %d returned after token %d", ls.Token(), c.last)
	}
	c.last = max(c.last, ls.Token())
	c.held[ls] = true
}

// done: ls is no longer used (about to be released, or left to expire).
func (c *holdChecker) done(ls fence.Lease) {
	c.mu.Lock()
	delete(c.held, ls)
	c.mu.Unlock()
}

// TestMixedWaitersRandomCancel: waiters of three Lockers (three clients,
// as three processes) on one lock, with random budgets, lease times
// (fixed or watchdog) and hold times, a quarter of them cancelled at a
// random moment, and some leases never released (left to expire, as by
// a holder that died). Every Acquire must return within its budget (or
// its cancellation) and a margin; no lease may be returned while another
// is held; tokens increase; and once all is done nothing is left in Redis.
// Meanwhile a client that may publish and subscribe on the release
// channel, but not read the keys, replays the grants it sees and
// publishes forged and malformed ones (see forge). FENCE_SEED replays a
// run (but for the timing).
func TestMixedWaitersRandomCancel(t *testing.T) {
	t.Run("sync-off", func(t *testing.T) {
		srv := redistest.Start(t)
		mixedWaiters(t, srv, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}, WatchdogTTL: 300 * time.Millisecond})
	})
	t.Run("sync-on", func(t *testing.T) {
		primary := redistest.Start(t)
		redistest.StartReplica(t, primary)
		redistest.WaitReplicated(t, primary, 1)
		mixedWaiters(t, primary, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}, WatchdogTTL: 300 * time.Millisecond})
	})
}

// forge, until ctx ends, replays every grant published on channel (at
// once, and again after a random delay), and publishes forged grants to
// the granted owners and to others, and malformed messages: what a client
// that may publish and subscribe on the channel, but not read the keys,
// can do.
func forge(ctx context.Context, t *testing.T, srv *redistest.Server, channel string, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, 7))
	sub := srv.Client(t)
	pub := srv.Client(t)
	ps := sub.Subscribe(ctx, channel)
	defer ps.Close()
	msgs := ps.Channel()
	var seen []string
	tick := time.NewTicker(3 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-msgs:
			if m == nil {
				continue
			}
			f := strings.Fields(m.Payload)
			if len(f) != 7 || f[0] != "g" || f[2] == strconv.FormatInt(int64(1)<<52, 10) || slices.Contains(seen, m.Payload) {
				continue // not a grant, or one of ours
			}
			seen = append(seen, m.Payload)
			pub.Publish(ctx, channel, m.Payload)
			// The same owner, another token and a bad MAC.
			pub.Publish(ctx, channel, "g "+f[1]+" "+strconv.FormatInt(int64(1)<<52, 10)+" "+f[3]+" "+f[4]+" "+f[5]+" "+strings.Repeat("0", 40))
		case <-tick.C:
			var msg string
			switch rnd.IntN(5) {
			case 0:
				if len(seen) > 0 {
					msg = seen[rnd.IntN(len(seen))] // a replay
				}
			case 1:
				msg = forgedGrant(fmt.Sprintf("%032x", rnd.Uint64()), 1+rnd.Int64N(2000))
			case 2:
				msg = forgedGrant(fmt.Sprintf("%032x", rnd.Uint64()), 1e9)
			case 3:
				msg = "g garbage"
			case 4:
				msg = "released"
			}
			if msg != "" {
				pub.Publish(ctx, channel, msg)
			}
		}
	}
}

// dur is a random duration in [0, d).
func dur(rnd *rand.Rand, d time.Duration) time.Duration { return time.Duration(rnd.Int64N(int64(d))) }

func mixedWaiters(t *testing.T, srv *redistest.Server, o redislock.Options) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FENCE_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (FENCE_SEED replays it)", seed)
	rnd := rand.New(rand.NewPCG(seed, seed>>1))
	admin := srv.Client(t)
	const name, n = "lock:mixed", 60
	lock := lockKey(name)
	var lockers []*redislock.Locker
	for range 3 {
		lockers = append(lockers, lockerWith(t, srv.Client(t), o))
	}
	check := newHoldChecker(t)
	const margin = time.Second // -race, two shared CPUs (400 ms was passed by 37 ms at a load average of 11)
	type plan struct {
		l        *redislock.Locker
		delay    time.Duration // before the Acquire
		budget   time.Duration
		ttl      time.Duration // 0: watchdog
		cancelAt time.Duration // -1: never
		hold     time.Duration
		abandon  bool // never released: left to expire
	}
	plans := make([]plan, n)
	for i := range plans {
		p := plan{l: lockers[rnd.IntN(len(lockers))], delay: dur(rnd, time.Second), budget: 20*time.Millisecond + dur(rnd, 1500*time.Millisecond), cancelAt: -1, hold: dur(rnd, 20*time.Millisecond)}
		if rnd.IntN(3) > 0 {
			p.ttl = 100*time.Millisecond + dur(rnd, 400*time.Millisecond)
		}
		if rnd.IntN(4) == 0 {
			p.cancelAt = dur(rnd, p.budget)
		}
		p.abandon = p.ttl > 0 && rnd.IntN(10) == 0
		plans[i] = p
	}
	fctx, stop := context.WithCancel(context.Background())
	forged := make(chan struct{})
	go func() { forge(fctx, t, srv, lock+":released", seed); close(forged) }()
	defer func() { stop(); <-forged }()
	var wg sync.WaitGroup
	for i, p := range plans {
		wg.Go(func() {
			timer := time.NewTimer(p.delay)
			<-timer.C
			c, cancel := context.WithCancel(context.Background())
			defer cancel()
			if p.cancelAt >= 0 {
				time.AfterFunc(p.cancelAt, cancel)
			}
			opts := []fence.Option{fence.Wait(p.budget)}
			if p.ttl > 0 {
				opts = append(opts, fence.TTL(p.ttl))
			}
			start := time.Now()
			ls, err := p.l.Acquire(c, name, opts...)
			took := time.Since(start)
			limit := p.budget
			if p.cancelAt >= 0 {
				limit = min(limit, p.cancelAt)
			}
			if took > limit+margin {
				t.Errorf("waiter %d (budget %v, cancel at %v) returned after %v: %v", i, p.budget, p.cancelAt, took, err)
			}
			switch {
			case err == nil:
				check.took(ls)
				hold := time.NewTimer(p.hold)
				<-hold.C
				if err := ls.Err(); err != nil && p.ttl == 0 {
					t.Errorf("waiter %d: watchdog lease %d ended while held %v: %v", i, ls.Token(), p.hold, err)
				}
				check.done(ls)
				if p.abandon {
					return
				}
				if err := ls.Release(context.Background()); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
					t.Errorf("waiter %d: release %d: %v", i, ls.Token(), err)
				}
			case !errors.Is(err, fence.ErrNotAcquired):
				t.Errorf("waiter %d: %v, not ErrNotAcquired", i, err)
			case p.cancelAt >= 0 && errors.Is(err, context.Canceled):
			case errors.Is(err, fence.ErrHeld):
			default:
				t.Errorf("waiter %d (budget %v): %v", i, p.budget, err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d leases of %d waiters", check.leases, n)
	// Abandoned leases expire (at most 500 ms); withdrawals run in the
	// background. Then nothing is left.
	waitFor(t, func() bool {
		n, err := admin.Exists(context.Background(), lock, lock+":queue", lock+":waiters").Result()
		return err == nil && n == 0
	})
}
