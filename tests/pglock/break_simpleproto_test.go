package pglock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// pgx's simple protocol (default_query_exec_mode=simple_protocol, as
// pgbouncer users set it) interpolates the arguments on the client: hostile
// names, the TTL arithmetic, the remaining time and the release's notify
// work as with the extended protocol.
func TestSimpleProtocol(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, open(t, d.dsn+"&default_query_exec_mode=simple_protocol", nil))
	for _, name := range []string{`'; DROP TABLE fence_leases; --`, `a\'b\\`, "ключ 🔒", strings.Repeat("'", fence.MaxNameLen)} {
		holder, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("Acquire(%.20q): %v", name, err)
		}
		if err := holder.Extend(ctxFor(t, 10*time.Second), 2*time.Minute); err != nil {
			t.Fatalf("Extend(%.20q): %v", name, err)
		}
		got := make(chan error, 1)
		go func() {
			lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute), fence.Wait(5*time.Second))
			if err == nil {
				_ = lease.Release(context.Background())
			}
			got <- err
		}()
		start := time.Now()
		if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatalf("Release(%.20q): %v", name, err)
		}
		if err := <-got; err != nil {
			t.Fatalf("waiter on %.20q: %v", name, err)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("waiter on %.20q took %v", name, took)
		}
	}
}
