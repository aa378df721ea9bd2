package atomictime

import (
	"sync"
	"testing"
	"time"
)

func TestStoreLoad(t *testing.T) {
	var at Time
	if !at.Load().IsZero() {
		t.Fatalf("zero Time loads %v, want the zero time", at.Load())
	}
	now := time.Now()
	for _, v := range []time.Time{now, now.Add(-time.Hour), now.Add(90 * time.Second), base, {}} {
		at.Store(v)
		got := at.Load()
		if !got.Equal(v) || got.Sub(v) != 0 {
			t.Fatalf("Store(%v) then Load = %v", v, got)
		}
	}
	// A time without a monotonic reading (from the wall clock alone).
	wall := now.Round(0).Add(time.Minute)
	at.Store(wall)
	// (its wall reading and the monotonic one drift apart by nanoseconds
	// between base and now)
	if d := at.Load().Sub(now) - time.Minute; d < -time.Millisecond || d > time.Millisecond {
		t.Fatalf("a wall-clock time loads %v off", d)
	}
}

// Loads beside Stores see one of the stored times, never a torn one (and
// -race sees no race).
func TestConcurrent(t *testing.T) {
	var at Time
	a, b := time.Now(), time.Now().Add(time.Hour)
	at.Store(a)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 10000 {
			if i%2 == 0 {
				at.Store(b)
			} else {
				at.Store(a)
			}
		}
	}()
	for range 10000 {
		if got := at.Load(); !got.Equal(a) && !got.Equal(b) {
			t.Fatalf("Load = %v, neither stored time", got)
		}
	}
	wg.Wait()
}
