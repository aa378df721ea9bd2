package redislock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// TestScriptCacheFlushed: a server that lost its script cache (a restart,
// SCRIPT FLUSH, a failover to a replica that never ran the scripts) answers
// EVALSHA with NOSCRIPT; every script fence runs, alone or pipelined with
// WAIT (replica sync on, with a replica), must then be sent again in full.
func TestScriptCacheFlushed(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := primary.Client(t)
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("sync=%v", sync), func(t *testing.T) {
			l := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !sync}})
			name := fmt.Sprintf("flushed-%v", sync)
			for i := range 3 {
				if err := admin.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				evals := commandCalls(t, admin, "eval")
				lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
				if err != nil {
					t.Fatalf("round %d: Acquire after SCRIPT FLUSH: %v", i, err)
				}
				if err := admin.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if err := lease.Extend(ctx, time.Minute); err != nil {
					t.Fatalf("round %d: Extend after SCRIPT FLUSH: %v", i, err)
				}
				if err := admin.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					t.Fatalf("round %d: Release after SCRIPT FLUSH: %v", i, err)
				}
				if n := commandCalls(t, admin, "eval") - evals; n < 3 {
					t.Fatalf("round %d: %d EVALs after NOSCRIPT, want at least 3", i, n)
				}
			}
			if got := admin.Exists(ctx, "fence:{"+name+"}").Val(); got != 0 {
				t.Fatalf("lock still there after Release")
			}
		})
	}
}
