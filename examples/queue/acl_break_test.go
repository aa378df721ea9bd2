package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestConsumerWithoutSetCommands: the consumer's Redis user is allowed
// every command but the set ones (an ACL written for a stream consumer:
// streams, scripts, the lock's commands). Since the claim keeps the ids
// of trimmed pending entries in a set ({<stream>}:trimmed:<group>), every
// claim's script is refused (NOPERM, on SMEMBERS, whether or not anything
// was trimmed), every term ends at its first claim, and no message is
// applied ("term ended: queue: XAUTOCLAIM: ERR The user executing the
// script can't run this command or subcommand script: ..., on
// @user_script:6"); with 8f84b24's queue.go, before the set, that user
// ran the consumer. Decided: the claim falls back to a plain XAUTOCLAIM,
// trimmed pending entries then unrecorded, and says so once at ERROR.
func TestConsumerWithoutSetCommands(t *testing.T) {
	ctx, admin, db := servers(t, 30*time.Second)
	if err := admin.Do(ctx, "ACL", "SETUSER", "consumer", "on", ">pw", "~*", "&*", "+@all", "-@set").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: "consumer", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	if _, err := queue.Produce(ctx, admin, "s", "a", 5); err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	until(t, 10*time.Second, "the message applied", func() (bool, error) {
		state = logs.String()
		if logs.has(queue.LogTermEnded, "") {
			return false, fmt.Errorf("a term ended: %s", state)
		}
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
		return n == 1, err
	}, &state)
	if !logs.has(queue.LogUnrecorded, "") {
		t.Errorf("the refused claim script was not logged (%s): %s", queue.LogUnrecorded, logs.String())
	}
}

// TestConsumerWithoutScripts: the consumer's Redis user may not run
// scripts (-@scripting), its lock on another server (a Locker of its own
// Redis, etcd, ZooKeeper), and KeepEntries set, the consumer's trim (a
// script) off. Since the claim runs XAUTOCLAIM in a script, every term ends
// at its first claim and no message is applied ("term ended: queue:
// XAUTOCLAIM: NOPERM this user has no permissions to run the 'evalsha'
// command"); with 8f84b24's queue.go,
// before that script, that user ran the consumer (XAUTOCLAIM, XREADGROUP
// and XACK are plain commands). Decided as for the set commands: a plain
// XAUTOCLAIM, logged once.
func TestConsumerWithoutScripts(t *testing.T) {
	ctx, admin, db := servers(t, 30*time.Second)
	if err := admin.Do(ctx, "ACL", "SETUSER", "consumer", "on", ">pw", "~*", "&*", "+@all", "-@scripting").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: "consumer", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	if _, err := queue.Produce(ctx, admin, "s", "a", 5); err != nil {
		t.Fatal(err)
	}
	locker, err := redislock.New(redistest.Start(t).Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	c := &queue.Consumer{KeepEntries: true, Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, locker, fence.Backoff(10*time.Millisecond, 50*time.Millisecond)) }()
	t.Cleanup(func() { stop(); <-done })
	var state string
	until(t, 10*time.Second, "the message applied", func() (bool, error) {
		state = logs.String()
		if logs.has(queue.LogTermEnded, "") {
			return false, fmt.Errorf("a term ended: %s", state)
		}
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
		return n == 1, err
	}, &state)
	if !logs.has(queue.LogUnrecorded, "") {
		t.Errorf("the refused claim script was not logged (%s): %s", queue.LogUnrecorded, logs.String())
	}
}

// TestConsumerWithoutXInfo: the consumer's Redis user may run scripts but
// not XINFO, so the claim script runs (pending entries trimmed by others
// are recorded) and the look for entries deleted unread is refused. That
// refusal was logged as LogUnrecorded, "trimmed entries unrecorded",
// which says the claim script was refused and trimmed pending entries go
// unrecorded: neither was so ("trimmed entries unrecorded: ERR The user
// executing the script can't run this command or subcommand script: …").
// It has its own record now, once.
func TestConsumerWithoutXInfo(t *testing.T) {
	ctx, admin, db := servers(t, 30*time.Second)
	if err := admin.Do(ctx, "ACL", "SETUSER", "consumer", "on", ">pw", "~*", "&*", "+@all", "-xinfo").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: "consumer", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	logs := &records{}
	c := &queue.Consumer{KeepEntries: true, Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 20 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	for i := range 2 {
		if _, err := queue.Produce(ctx, admin, "s", "a", int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	var state string
	until(t, 10*time.Second, "the messages applied", func() (bool, error) {
		state = logs.String()
		if logs.has(queue.LogTermEnded, "") {
			return false, fmt.Errorf("a term ended: %s", state)
		}
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
		return n == 2, err
	}, &state)
	if logs.has(queue.LogUnrecorded, "") {
		t.Errorf("the claim script ran, yet %q was logged: %s", queue.LogUnrecorded, state)
	}
	if n := logs.count(queue.LogUnreadUnchecked); n != 1 {
		t.Errorf("%d %q records, want 1: %s", n, queue.LogUnreadUnchecked, state)
	}
}
