package guard_test

import (
	"slices"
	"sync"
	"testing"

	"github.com/fencekit/fence"
)

type decisions struct {
	fence.NopObserver
	mu     sync.Mutex
	events []fence.GuardEvent
}

func (d *decisions) GuardDecided(e fence.GuardEvent) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.events = append(d.events, e)
}

// TestTableUpdateObserved: Table.Update reports an accepted and a stale
// token, and nothing for a missing row or an invalid token.
func TestTableUpdateObserved(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			d := &decisions{}
			tbl := payments
			tbl.Observer = d
			for _, tc := range []struct {
				key   int64
				token fence.Token
			}{{1001, 5}, {1001, 3}, {9999, 7}, {1001, 0}} {
				_ = tbl.Update(ctx(t), db, tc.key, tc.token, "status = $3", "APPROVED")
			}
			want := []fence.GuardEvent{
				{Resource: "payment 1001", Token: 5, Decision: fence.GuardAccept},
				{Resource: "payment 1001", Token: 3, Decision: fence.GuardReject},
			}
			if !slices.Equal(d.events, want) {
				t.Fatalf("events %+v, want %+v", d.events, want)
			}
		})
	}
}
