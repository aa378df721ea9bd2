package redlock_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// held is one lease as its holder saw it: from Acquire's return to the
// earlier of its deadline and the moment Release was called.
type held struct {
	from, to time.Time
	token    fence.Token
	locker   int
	outlived bool // the holder held it past its deadline

	// For the failure message: how the lease was held and what its
	// calls answered.
	watchdog  bool
	extended  bool
	extendErr error
	extendAt  time.Time     // when Extend returned
	deadline0 time.Time     // Deadline() as Acquire returned it
	deadline  time.Time     // Deadline() when to was taken
	errAtTo   error         // Err() when to was taken
	relErr    error         // Release's result
	hold      time.Duration // the hold drawn
}

func (h held) String() string {
	kind := "fixed TTL"
	if h.watchdog {
		kind = "watchdog"
	}
	ext := "no Extend"
	if h.extended {
		ext = fmt.Sprintf("Extend returned %v at +%v", h.extendErr, h.extendAt.Sub(h.from))
	}
	return fmt.Sprintf("token %d, locker %d, %s, %s; held from %s to %s (+%v, drawn hold %v, outlived %v); deadline at Acquire's return %s (+%v), when to was taken %s (+%v); Err then %v; Release %v",
		h.token, h.locker, kind, ext, h.from.Format("15:04:05.000000"), h.to.Format("15:04:05.000000"), h.to.Sub(h.from), h.hold, h.outlived,
		h.deadline0.Format("15:04:05.000000"), h.deadline0.Sub(h.from), h.deadline.Format("15:04:05.000000"), h.deadline.Sub(h.from), h.errAtTo, h.relErr)
}

// Many goroutines on several Lockers (each with its own clients) contend
// for one name with short leases, half of them renewed by the watchdog;
// some hold past their deadline, some extend. No two leases may overlap in time, and tokens must increase in
// the order the leases were granted: two holders at once, a repeated
// token or a token smaller than an earlier holder's is a bug. The test
// runs until a number of leases were granted, not for a time: on a loaded
// machine many tries fail for timing (ErrValidity, no reply in time),
// which is the algorithm being safe, not a fault.
func contend(t *testing.T, n int) {
	srvs := nodes(t, n)
	const (
		lockers   = 3
		perLocker = 4
		ttl       = 200 * time.Millisecond
		want      = 60               // leases to grant
		budget    = 60 * time.Second // to grant them in, on the most loaded machine
		name      = "contended"
	)
	// One Locker's clock is right, one's an hour behind (its token floor
	// never counts: the nodes' clocks and records decide, and differ), one's
	// an hour ahead (its floor is capped at each node's clock plus 2 s).
	ls := make([]*redlock.Locker, lockers)
	for i := range ls {
		ls[i] = newLocker(t, srvs, &redlock.Options{NodeTimeout: generous, RetryDelay: 5 * time.Millisecond, WatchdogTTL: ttl})
		skew := []time.Duration{0, -time.Hour, time.Hour}[i]
		redlock.SetWallClock(ls[i], func() time.Time { return time.Now().Add(skew) })
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	var (
		mu     sync.Mutex
		leases []held
		fails  = map[string]int{}
		wg     sync.WaitGroup
	)
	for i := range lockers * perLocker {
		l := ls[i%lockers]
		wg.Go(func() {
			for ctx.Err() == nil {
				opts := []fence.Option{fence.Wait(time.Second)}
				if i%2 == 0 {
					opts = append(opts, fence.TTL(ttl)) // the others' leases are renewed by the watchdog
				}
				lease, err := l.Acquire(ctx, name, opts...)
				if err != nil {
					mu.Lock()
					switch {
					case errors.Is(err, redlock.ErrValidity):
						fails["validity"]++
					case errors.Is(err, fence.ErrHeld):
						fails["held"]++
					case errors.Is(err, redlock.ErrNoQuorum):
						fails["no quorum"]++
					default:
						fails["other"]++
					}
					mu.Unlock()
					continue
				}
				h := held{from: time.Now(), token: lease.Token(), locker: i % lockers, watchdog: i%2 != 0, deadline0: lease.Deadline()}
				// Hold briefly, mostly; one in five for up to 1.3 lease
				// times, outliving its lease; a few extend it first.
				hold := time.Duration(rand.Int64N(int64(ttl / 4)))
				if rand.N(5) == 0 {
					hold = time.Duration(rand.Int64N(int64(ttl * 13 / 10)))
				}
				h.hold = hold
				if rand.N(4) == 0 {
					h.extended = true
					h.extendErr = lease.Extend(ctx, ttl)
					h.extendAt = time.Now()
				}
				select {
				case <-time.After(hold): // the workload's own pace, not a wait for time to pass
				case <-ctx.Done():
				}
				h.to = time.Now()
				h.deadline, h.errAtTo = lease.Deadline(), lease.Err()
				if h.deadline.Before(h.to) {
					h.to, h.outlived = h.deadline, true
				}
				h.relErr = lease.Release(context.Background())
				mu.Lock()
				if leases = append(leases, h); len(leases) >= want {
					cancel() // enough: the others stop
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	// In token order, each lease must begin after the one before it ended.
	// Ordered by their start instead, a holder descheduled between
	// Acquire's return and reading the clock would look as if it began
	// inside the next holder's lease: a false alarm on a loaded machine.
	// Token order misses neither fault: two holders at once overlap, and a
	// later lease with a smaller token is put before one that began and
	// ended earlier, so the earlier one's start falls before its end.
	slices.SortFunc(leases, func(a, b held) int { return cmp.Compare(a.token, b.token) })
	for i := 1; i < len(leases); i++ {
		a, b := leases[i-1], leases[i]
		if b.from.Before(a.to) {
			t.Errorf("two holders, or tokens out of order: lease %d (token %d, locker %d) held until %v after lease %d (token %d, locker %d) began\n  lease %d: %v\n  lease %d: %v",
				i-1, a.token, a.locker, a.to.Sub(b.from), i, b.token, b.locker, i-1, a, i, b)
		}
		if b.token == a.token {
			t.Errorf("leases %d and %d have the same token %d", i-1, i, b.token)
		}
	}
	if len(leases) < want {
		t.Fatalf("only %d leases of %d granted in %v; failures %v", len(leases), want, took, fails)
	}
	outlived := 0
	for _, h := range leases {
		if h.outlived {
			outlived++
		}
	}
	t.Logf("%d masters, %d goroutines on %d Lockers, TTL %v: %d leases in %v (%d held past their deadline), failed tries %v", n, lockers*perLocker, lockers, ttl, len(leases), took, outlived, fails)
}

func TestContention3(t *testing.T) { contend(t, 3) }
func TestContention5(t *testing.T) { contend(t, 5) }
