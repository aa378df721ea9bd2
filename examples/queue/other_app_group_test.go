package queue_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/redis/go-redis/v9"
)

// TestOtherApplicationsGroupNotAnError: a second application reads the
// same stream through a group of its own (an audit log, say: fan-out is
// what consumer groups are for, and the consumer's trim keeps what such a
// group still needs, TestTrimKeepsWhatOtherGroupsNeed). It runs no
// queue.Consumer and fences nothing, so no leader refuses another's
// writes; yet every consumer logs "other groups" at ERROR, saying that
// "their leaders and this one refuse each other's writes" (seen: 1
// record naming [audit], each time a consumer starts). The consumers now
// record their groups beside the stream, and tell only those.
func TestOtherApplicationsGroupNotAnError(t *testing.T) {
	const n = 5
	ctx, rdb, db := servers(t, 30*time.Second)
	if err := rdb.XGroupCreateMkStream(ctx, "s", "audit", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		if _, err := queue.Produce(ctx, rdb, "s", "a", int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	// The other application reads and acknowledges everything.
	read, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "audit", Consumer: "auditor", Streams: []string{"s", ">"}, Count: n}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range read[0].Messages {
		if err := rdb.XAck(ctx, "s", "audit", e.ID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	until(t, 10*time.Second, "all applied", func() (bool, error) {
		state = fmt.Sprintf("%d applied", logs.get(queue.LogApplied))
		return logs.get(queue.LogApplied) == n, nil
	}, &state)
	if k := logs.get(queue.LogOtherGroups); k != 0 {
		t.Fatalf("%q logged %d times at ERROR for another application's group, which refuses no write", queue.LogOtherGroups, k)
	}
}
