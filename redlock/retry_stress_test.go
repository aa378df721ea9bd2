package redlock_test

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// Lockers whose clients keep go-redis's retries and lose replies at random
// (after the nodes ran the requests: acquisitions, write-backs, renewals,
// releases run twice) contend for one name: no two holders at once, and
// tokens increase from holder to holder.
func TestStressRetriedRequestsNeverTwoHolders(t *testing.T) {
	srvs := nodes(t, 3)
	acq, rel := redlock.ScriptHashes()
	matches := [][]byte{[]byte(acq), []byte(rel), []byte(redlock.ExtendHash())}
	const lockers, per, name = 3, 25, "retried-stress"
	var (
		mu      sync.Mutex
		holding bool
		last    fence.Token
		granted int
	)
	var wg sync.WaitGroup
	for k := range lockers {
		cs := make([]redis.UniversalClient, len(srvs))
		for i, s := range srvs {
			// Each write containing one of matches has its reply
			// lost with probability 0.2, after the server ran it.
			d := &replyDropper{lose: func(p []byte) bool {
				for _, m := range matches {
					if bytes.Contains(p, m) {
						return rand.Float64() < 0.2
					}
				}
				return false
			}}
			c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true, Dialer: d.Dial})
			t.Cleanup(func() { _ = c.Close() })
			cs[i] = c
		}
		l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous, RetryDelay: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				lease, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second), fence.Wait(20*time.Second))
				if err != nil {
					t.Errorf("locker %d: Acquire: %v", k, err)
					return
				}
				mu.Lock()
				if holding {
					t.Errorf("locker %d: granted token %d while another holder holds the lock", k, lease.Token())
				}
				if lease.Token() <= last {
					t.Errorf("locker %d: token %d after %d", k, lease.Token(), last)
				}
				holding, last = true, lease.Token()
				granted++
				mu.Unlock()
				_ = lease.Extend(ctxFor(t), 10*time.Second)
				mu.Lock()
				if lease.Err() != nil {
					t.Errorf("locker %d: lease ended while held: %v", k, lease.Err())
				}
				holding = false
				mu.Unlock()
				_ = lease.Release(ctxFor(t)) // a delete run twice may say lost: see TestRetriedReleaseCountsItsOwnDelete
			}
		}()
	}
	wg.Wait()
	t.Logf("%d leases granted", granted)
}
