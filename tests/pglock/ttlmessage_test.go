package pglock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// TestFixedTTLExpiryMessage: a lease acquired with fence.TTL that reaches
// its deadline says that its lease time ran out, not that it "was not
// renewed before its deadline", which is what a watchdog lease whose
// renewals failed says (and what this one said before).
func TestFixedTTLExpiryMessage(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.Acquire(ctx, "fixed-ttl", fence.TTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
	case <-ctx.Done():
		t.Fatal("the lease did not end at its deadline")
	}
	if err := lease.Err(); err == nil || !strings.Contains(err.Error(), "lease time ran out") || strings.Contains(err.Error(), "not renewed") {
		t.Errorf("Err() = %v, want one saying its lease time ran out", err)
	}
}
