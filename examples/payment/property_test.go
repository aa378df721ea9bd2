package payment_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/guard"
)

// seeds is how many interleavings each property test runs.
const seeds = 100

// TestApprovalChargesOnce is the property test of issue 10: for each seed,
// 2 to 4 workers approve payment 1001 while a scheduler driven by the seed
// decides, at every pause point (before acquiring, after acquiring, after
// reading, after writing and before committing), which worker goes on next
// and whether the current lease runs out first (its Redis key is deleted).
// With the fenced read-modify-write every run charges exactly once. The
// article's token-only update, run through the same scheduler, charges
// twice for some seeds: the test can fail.
func TestApprovalChargesOnce(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		t.Run(name+"/fenced", func(t *testing.T) {
			staleRuns := 0
			for seed := range uint64(seeds) {
				r := interleave(t, e, db, (*payment.Service).Approve, locked, seed)
				if r.charges != 1 || r.status != "APPROVED" {
					t.Fatalf("seed %d: %d charges, status %s; want one charge\ntrace: %s", seed, r.charges, r.status, r.trace)
				}
				if r.stale > 0 {
					staleRuns++
				}
			}
			t.Logf("%d of %d seeds had a worker rejected as stale", staleRuns, seeds)
			if staleRuns == 0 {
				t.Fatal("no worker was ever stale: the scheduler never overtook a lease")
			}
		})
		t.Run(name+"/token-only", func(t *testing.T) {
			double := 0
			for seed := range uint64(seeds) {
				r := interleave(t, e, db, (*payment.Service).ApproveTokenOnly, read, seed)
				if r.charges > 1 {
					if double == 0 {
						t.Logf("seed %d charges %d times: %s", seed, r.charges, r.trace)
					}
					double++
				}
			}
			t.Logf("%d of %d seeds charged more than once", double, seeds)
			if double == 0 {
				t.Fatal("no seed charged twice with the token-only update: the scheduler does not reach the hazard")
			}
		})
	}
}

type approveFunc func(*payment.Service, context.Context, int64, string) (fence.Token, error)

// stop is where a worker waits for the scheduler.
type stop int

const (
	start   stop = iota // before acquiring the lock
	locked              // payment.Locked
	read                // payment.Read
	written             // payment.Written
	done                // the approval returned
)

func (s stop) String() string { return [...]string{"start", "locked", "read", "written", "done"}[s] }

type event struct {
	w   int
	at  stop
	err error
}

type run struct {
	charges int
	stale   int // workers rejected with guard.ErrStale
	status  string
	trace   string
}

// interleave runs one seeded interleaving and returns its outcome; enterTx
// is the stop after which approve begins its transaction. Only one
// worker runs at a time between pauses. A worker about to enter its
// transaction (fenced: after acquiring; token-only: after reading) is not
// released while another worker is inside one, because it would wait for
// that worker's row or write lock and the scheduler would wait for it.
func interleave(t *testing.T, e env, db *sql.DB, approve approveFunc, enterTx stop, seed uint64) run {
	t.Helper()
	reset(t, e, db)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	n := 2 + rng.IntN(3)
	events := make(chan event)
	resume := make([]chan struct{}, n)
	park := func(w int, at stop) {
		events <- event{w: w, at: at}
		<-resume[w]
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for w := range n {
		resume[w] = make(chan struct{})
		svc := &payment.Service{Locker: e.locker, DB: db, LockOptions: []fence.Option{fence.Wait(0)},
			Pause: func(_ context.Context, step payment.Step, _ int64, _ fence.Token) { park(w, stop(step)+locked) }}
		wg.Go(func() {
			var err error
			for attempt := 0; attempt < 3; attempt++ {
				park(w, start)
				if _, err = approve(svc, ctx(t), 1001, fmt.Sprintf("w%d", w)); !errors.Is(err, fence.ErrHeld) {
					break
				}
			}
			events <- event{w: w, at: done, err: err}
		})
	}
	at := make([]stop, n)
	inTx, running, live := -1, n, n
	var trace []string
	stale := 0
	for {
		for ; running > 0; running-- {
			select {
			case ev := <-events:
				at[ev.w] = ev.at
				if ev.at == done {
					live--
					if inTx == ev.w {
						inTx = -1
					}
					checkResult(t, seed, ev)
					if errors.Is(ev.err, guard.ErrStale) {
						stale++
					}
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("seed %d: a worker is blocked; trace: %s", seed, strings.Join(trace, " "))
			}
		}
		if live == 0 {
			break
		}
		var ready []int
		for w := range n {
			if at[w] != done && (at[w] != enterTx || inTx == -1) {
				ready = append(ready, w)
			}
		}
		if rng.IntN(3) == 0 {
			if err := e.redis.Del(ctx(t), lockKey).Err(); err != nil {
				t.Fatal(err)
			}
			trace = append(trace, "expire")
		}
		w := ready[rng.IntN(len(ready))]
		if at[w] == enterTx {
			inTx = w
		}
		trace = append(trace, fmt.Sprintf("w%d@%s", w, at[w]))
		running = 1
		resume[w] <- struct{}{}
	}
	charges, err := payment.Charges(ctx(t), db, 1001)
	if err != nil {
		t.Fatal(err)
	}
	p, err := payment.Get(ctx(t), db, 1001)
	if err != nil {
		t.Fatal(err)
	}
	return run{charges: len(charges), stale: stale, status: p.Status, trace: strings.Join(trace, " ")}
}

// checkResult fails the test for an approval error that is none of the
// expected outcomes of a race.
func checkResult(t *testing.T, seed uint64, ev event) {
	t.Helper()
	if ev.err == nil {
		return
	}
	for _, ok := range []error{payment.ErrAlreadyApproved, guard.ErrStale, fence.ErrHeld, fence.ErrLeaseLost} {
		if errors.Is(ev.err, ok) {
			return
		}
	}
	t.Errorf("seed %d: worker %d: %v", seed, ev.w, ev.err)
}
