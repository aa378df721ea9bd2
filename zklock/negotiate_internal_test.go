package zklock

import (
	"context"
	"testing"
	"time"
)

// Once the negotiated timeout is known, an Acquire's negotiate is one
// atomic load: no allocation, no lock.
func TestNegotiatedIsOneLoad(t *testing.T) {
	l := &Locker{}
	l.negotiated.Store(int64(2 * time.Second))
	ctx := context.Background()
	l.probeMu.Lock() // a negotiate that took the lock would block here
	defer l.probeMu.Unlock()
	if n := testing.AllocsPerRun(1000, func() {
		if err := l.negotiate(ctx, ctx); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per negotiate once negotiated, want 0", n)
	}
}
