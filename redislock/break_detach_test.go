package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// A Release that failed (here: a done ctx) has ended the lease, and
// cancelled its Context with ErrReleased; calling Release again retries,
// also with that Context: its end must not cut the retry short.
func TestReleaseRetryWithLeaseContext(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := lockerWith(t, srv.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	name := "detach-retry"
	ls := acquire(t, l, name, fence.TTL(time.Minute))
	lctx := ls.Context()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ls.Release(done); err == nil {
		t.Fatal("Release with a done ctx = nil")
	}
	if context.Cause(lctx) != fence.ErrReleased {
		t.Fatalf("Context's cause %v", context.Cause(lctx))
	}
	if err := ls.Release(lctx); err != nil {
		t.Errorf("Release retried with the lease's Context = %v", err)
	}
	if n := admin.Exists(ctx(t), lockKey(name)).Val(); n != 0 {
		t.Errorf("lock still held after the retry")
	}
}
