package fenceprom_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceprom"
	"github.com/prometheus/client_golang/prometheus"
)

// TestAcquireDoneAllocatesNothing: counting an Acquire of a backend seen
// before allocates nothing (the backends' set boxed its key on every event,
// one allocation per Acquire, when it was a sync.Map).
func TestAcquireDoneAllocatesNothing(t *testing.T) {
	o, err := fenceprom.New(prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := fence.AcquireEvent{Backend: "redis", Name: "n", Result: fence.Acquired, Wait: time.Millisecond}
	o.AcquireDone(ev)
	if n := testing.AllocsPerRun(1000, func() { o.AcquireDone(ev) }); n != 0 {
		t.Errorf("AcquireDone: %v allocations, want 0", n)
	}
}
