package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

func attack1Locker(t *testing.T, o fence.Observer) *etcdlock.Locker {
	return newLocker(t, []string{exampleEndpoint}, &etcdlock.Options{Observer: o, WatchdogTTL: 3 * time.Second})
}

// attack1Order is an Observer that checks each end is reported while the
// Release that settled it has not returned yet, and exactly once; its
// callback calls Release and Extend back (re-entry of a released lease).
type attack1Order struct {
	fence.NopObserver
	mu       sync.Mutex
	ends     map[fence.Token]int
	returned map[fence.Token]bool
	late     []fence.LeaseEvent
	reentry  map[fence.Token]error
	lease    map[fence.Token]fence.Lease
}

func newAttack1Order() *attack1Order {
	return &attack1Order{ends: map[fence.Token]int{}, returned: map[fence.Token]bool{}, reentry: map[fence.Token]error{}, lease: map[fence.Token]fence.Lease{}}
}

func (o *attack1Order) LeaseEnded(e fence.LeaseEvent) {
	o.mu.Lock()
	o.ends[e.Token]++
	if o.returned[e.Token] {
		o.late = append(o.late, e)
	}
	ls := o.lease[e.Token]
	o.mu.Unlock()
	if ls == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rel := ls.Release(ctx)
	ext := ls.Extend(ctx, time.Minute)
	o.mu.Lock()
	o.reentry[e.Token] = errors.Join(rel, func() error {
		if errors.Is(ext, fence.ErrLeaseLost) {
			return nil
		}
		return fmt.Errorf("Extend from the callback = %v, want ErrLeaseLost", ext)
	}())
	o.mu.Unlock()
}

// TestAttack1ReleaseReportsBeforeReturn: 8f76f84 hands the report of the
// end a Release settles (releasedAs) to that Release alone, made after its
// flush, so that it comes before Release returns even while Extends run
// concurrently (their flush used to take it and make it after). Hammered
// here: each lease (fixed and watchdog) gets Extends in a loop from another
// goroutine while it is released; every end must be reported exactly once,
// before Release returned, and the callback's Release (nil: it returns the
// settled result) and Extend (ErrLeaseLost) must return.
// Guards a risk; passes on HEAD.
func TestAttack1ReleaseReportsBeforeReturn(t *testing.T) {
	o := newAttack1Order()
	l := attack1Locker(t, o)
	ctx := ctxFor(t, 60*time.Second)
	for i := range 60 {
		var opts []fence.Option
		if i%2 == 0 {
			opts = append(opts, fence.TTL(time.Minute))
		}
		ls, err := l.Acquire(ctx, fmt.Sprintf("attack1-order-%d", i), opts...)
		if err != nil {
			t.Fatal(err)
		}
		tok := ls.Token()
		o.mu.Lock()
		o.lease[tok] = ls
		o.mu.Unlock()
		stop := make(chan struct{})
		extended := make(chan struct{})
		go func() {
			defer close(extended)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := ls.Extend(ctx, time.Minute); err != nil {
					return
				}
			}
		}()
		// Let an Extend or two be in flight.
		if err := ls.Extend(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		relDone := make(chan error, 1)
		go func() { relDone <- ls.Release(ctx) }()
		var relErr error
		select {
		case relErr = <-relDone:
		case <-time.After(20 * time.Second):
			t.Fatalf("Release did not return in 20 s:\n%s", attack1Stacks())
		}
		o.mu.Lock()
		o.returned[tok] = true
		n := o.ends[tok]
		re, reDone := o.reentry[tok]
		o.mu.Unlock()
		close(stop)
		<-extended
		if relErr != nil {
			t.Fatalf("lease %d: Release = %v", i, relErr)
		}
		if n != 1 {
			t.Fatalf("lease %d: %d ends reported by the time Release returned, want 1", i, n)
		}
		if !reDone {
			t.Fatalf("lease %d: the callback's calls had not returned when Release did", i)
		}
		if re != nil {
			t.Errorf("lease %d: callback: %v", i, re)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.late) > 0 {
		t.Errorf("ends reported after their Release returned: %+v", o.late)
	}
	for tok, n := range o.ends {
		if n != 1 {
			t.Errorf("token %d: %d ends reported", tok, n)
		}
	}
}

func attack1Stacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}
