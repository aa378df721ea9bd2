package memlock_test

import (
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// panicOn is an Observer whose LeaseEnded panics once, on the goroutine
// it was armed on (elsewhere, a timer's, the panic would end the test
// binary).
type panicOn struct {
	fence.NopObserver
	armed atomic.Int64 // the goroutine's id; 0: none
}

func (p *panicOn) LeaseEnded(fence.LeaseEvent) {
	if g := goid(); g != 0 && p.armed.CompareAndSwap(g, 0) {
		panic("observer bug")
	}
}

// goid returns the calling goroutine's id, from its stack's header.
func goid() int64 {
	var buf [64]byte
	s := strings.TrimPrefix(string(buf[:runtime.Stack(buf[:], false)]), "goroutine ")
	n, _ := strconv.ParseInt(s[:strings.IndexByte(s, ' ')], 10, 64)
	return n
}

// An Acquire that finds the holder's lease expired (its timer not run
// yet) ends it, takes the lock, and reports the old lease's end once its
// mutex is unlocked. If the Observer panics there, Acquire panics with the
// new lease granted and not returned: nobody can release it. It must not
// be left held for ever by its watchdog (as fence.ReportAcquire releases
// one whose AcquireDone panicked).
func TestObserverPanicReportingExpiryInAcquireFreesTheLock(t *testing.T) {
	// The holder's timer and the Acquire run at the same instant, in
	// either order: tried until Acquire came first (about one try in two).
	for try := range 40 {
		happened := false
		synctest.Test(t, func(t *testing.T) {
			obs := &panicOn{}
			l, err := memlock.New(&memlock.Options{WatchdogTTL: time.Second, Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.Acquire(t.Context(), "n", fence.TTL(time.Second)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second) // the holder's deadline
			obs.armed.Store(goid())
			recovered := func() (r any) {
				defer func() { r = recover() }()
				_, _ = l.Acquire(t.Context(), "n")
				return nil
			}()
			obs.armed.Store(0)
			if recovered == nil {
				return // the holder's timer reported its expiry first
			}
			happened = true
			lease, err := l.Acquire(t.Context(), "n", fence.Wait(10*time.Second))
			if err != nil {
				t.Fatalf("try %d: the lock taken by the Acquire whose report panicked is still held: %v", try, err)
			}
			_ = lease.Release(t.Context())
		})
		if happened {
			return
		}
	}
	t.Skip("the holder's timer reported its expiry before Acquire came in every try")
}
