package fencerueidis_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencerueidis"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// tracedClient is a user's wrapper of a rueidis client with a field of its
// own named stop (here: stop tracing), written without atomics.
type tracedClient struct {
	rueidis.Client
	stop uint32
}

// TestWrappedClientWithStopField: the adapter read a field named stop of
// any struct it was given as rueidis's closed flag. A user's wrapper with
// its own stop field (set: "stop tracing") made every Acquire fail with
// fence.ErrClosed on an open client, and its plain writes raced with the
// adapter's atomic loads. Only rueidis's own client types are read now.
func TestWrappedClientWithStopField(t *testing.T) {
	srv := redistest.Start(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	w := &tracedClient{Client: c, stop: 1}
	l, err := fencerueidis.New(w, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx(t), "wrapped", fence.TTL(time.Second))
	if err != nil {
		t.Fatalf("Acquire through an open wrapped client: %v", err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// The wrapper's own writes race with nothing.
	var wg sync.WaitGroup
	wg.Go(func() { w.stop = 0 })
	lease, err = l.Acquire(ctx(t), "wrapped", fence.TTL(time.Second))
	wg.Wait()
	if err != nil {
		t.Fatalf("Acquire through an open wrapped client: %v", err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

// TestCloseRacesCalls (held): Close while Acquires, Releases and a
// waiting Acquire run, under -race: every call ends with nil or an error,
// and the waiter, whose Wait is 30 s, ends with fence.ErrClosed within a
// few seconds of Close; an Acquire after Close fails with fence.ErrClosed
// at once. The closed flag is read with atomic.LoadUint32, as rueidis
// stores it (atomic.StoreUint32 / CompareAndSwapUint32).
func TestCloseRacesCalls(t *testing.T) {
	for _, what := range []string{"single", "sentinel"} {
		t.Run(what, func(t *testing.T) {
			srv := redistest.Start(t)
			o := rueidis.ClientOption{InitAddress: []string{srv.Addr}}
			if what == "sentinel" {
				s := redistest.StartSentinels(t, srv, 1)
				redistest.WaitSentinelsReady(t, s, 0)
				o = rueidis.ClientOption{InitAddress: s.Addrs(), Sentinel: rueidis.SentinelOption{MasterSet: s.Master}}
			}
			c, err := rueidis.NewClient(o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			l := newLocker(t, c, redislock.Options{})
			held, err := l.Acquire(ctx(t), "held", fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			_ = held
			waiterErr := make(chan error, 1)
			go func() {
				_, err := l.Acquire(ctx(t), "held", fence.Wait(30*time.Second), fence.TTL(time.Minute))
				waiterErr <- err
			}()
			var wg sync.WaitGroup
			var done atomic.Int64
			stop := make(chan struct{})
			for i := range 4 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						lease, err := l.Acquire(cctx, "busy"+string(rune('a'+i)), fence.TTL(time.Second))
						if err == nil {
							_ = lease.Release(cctx)
							done.Add(1)
						}
						cancel()
					}
				})
			}
			waitFor(t, func() bool { return done.Load() >= 20 }) // Close lands amid the calls
			c.Close()
			start := time.Now()
			select {
			case err := <-waiterErr:
				if !errors.Is(err, fence.ErrClosed) {
					t.Errorf("waiter after Close: %v, want fence.ErrClosed", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("waiter still waiting %v after Close", time.Since(start))
			}
			close(stop)
			wg.Wait()
			start = time.Now()
			actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = l.Acquire(actx, "after", fence.Wait(3*time.Second))
			if took := time.Since(start); !errors.Is(err, fence.ErrClosed) || took > time.Second {
				t.Errorf("Acquire after Close: %v after %v, want fence.ErrClosed at once", err, took)
			}
		})
	}
}
