package fencerueidis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencerueidis"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/rueidis"
)

// TestSentinelReplicaOnlyRefused: rueidis's Sentinel client with
// ReplicaOnly sends every command to a replica, so a Locker on it can
// never take a lock: every script's write is refused READONLY. New must
// refuse such a client with an error matching fence.ErrInvalidOption
// rather than hand back a Locker that fails every call.
//
// It failed: New accepted the client, and an Acquire of a free lock on it
// failed at once ("redislock: READONLY You can't write against a read
// only replica. script: 5f25d61b…", after 8 ms), as every one would.
func TestSentinelReplicaOnlyRefused(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	sentinels := redistest.StartSentinels(t, primary, 1)
	redistest.WaitSentinelsReady(t, sentinels, 1)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: sentinels.Addrs(), Sentinel: rueidis.SentinelOption{MasterSet: sentinels.Master},
		ReplicaOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l, err := fencerueidis.New(c, nil)
	if errors.Is(err, fence.ErrInvalidOption) {
		t.Logf("New: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("New = %v, want an error matching fence.ErrInvalidOption", err)
	}
	actx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, aerr := l.Acquire(actx, "replica-only", fence.TTL(time.Minute))
	t.Errorf("New accepted a ReplicaOnly Sentinel client; an Acquire of a free lock on it then = %v after %v", aerr, time.Since(start).Round(time.Millisecond))
}
