package memlock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// Many goroutines take one name with short budgets and TTLs, extend,
// release (some with a done ctx), and remove it behind holders' backs. A
// lease Acquire returns must have a token above every token returned before
// for the name, and every lease returned before it must have ended (Done
// closed) by then: two live leases of one lock never coexist. (Returned is
// when the test records it, after Acquire: a lease recorded after one with
// a higher token was granted first, and must have ended already.)
func TestNoOverlapUnderChurn(t *testing.T) {
	l, err := memlock.New(&memlock.Options{WatchdogTTL: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		leases []fence.Lease
		last   fence.Token
	)
	done := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	stop := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for time.Now().Before(stop) {
				if r.IntN(20) == 0 {
					l.Remove("x")
					continue
				}
				opts := []fence.Option{fence.Wait(time.Duration(r.IntN(20)) * time.Millisecond)}
				if r.IntN(2) == 0 {
					opts = append(opts, fence.TTL(fence.MinTTL+time.Duration(r.IntN(20))*time.Millisecond))
				}
				lease, err := l.Acquire(done, "x", opts...)
				if err != nil {
					if !errors.Is(err, fence.ErrNotAcquired) {
						t.Errorf("Acquire: %v", err)
					}
					continue
				}
				mu.Lock()
				if lease.Token() <= last {
					// Recorded after a later lease: this goroutine lost
					// its CPU between Acquire and here (ci48: token 2322
					// recorded after 2391). That is sound only if this
					// lease was granted first, so it must have ended (run
					// out, been removed) before the later one was granted.
					select {
					case <-lease.Done():
					default:
						t.Errorf("token %d, live, after %d", lease.Token(), last)
					}
				} else {
					last = lease.Token()
					for _, p := range leases {
						select {
						case <-p.Done():
						default:
							t.Errorf("lease %d still live when %d was granted", p.Token(), lease.Token())
						}
					}
					leases = append(leases[:0], lease)
				}
				mu.Unlock()
				if r.IntN(2) == 0 {
					_ = lease.Extend(done, fence.MinTTL+time.Duration(r.IntN(20))*time.Millisecond)
				}
				if r.IntN(3) == 0 {
					_ = lease.Release(cancelled)
				}
				_ = lease.Release(done)
			}
		})
	}
	wg.Wait()
}
