package queue_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestAppliedEntriesLeaveTheStream: applied and acknowledged messages are
// trimmed from the stream. Nothing removed them before: XLEN 50 after 50
// messages applied, nothing pending, and a queue that ran for long filled
// its Redis (under noeviction Produce then fails; under an allkeys-*
// policy the stream itself can be evicted, unread messages with it).
func TestAppliedEntriesLeaveTheStream(t *testing.T) {
	const n = 50
	ctx, rdb, db := servers(t, 30*time.Second)
	for i := range n {
		if _, err := queue.Produce(ctx, rdb, "s", "a", int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)
	until(t, 10*time.Second, "all applied and acknowledged", func() (bool, error) {
		if logs.get(queue.LogApplied) != n {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	until(t, 10*time.Second, "the applied entries trimmed", func() (bool, error) {
		l, err := rdb.XLen(ctx, "s").Result()
		return l == 0, err
	})
}

// TestTrimKeepsWhatOtherGroupsNeed: the trim spares the entries that
// another group of the stream has not read, and those pending in the
// consumer's own group (a message that keeps failing stays to be tried
// again, and every entry after it with it).
func TestTrimKeepsWhatOtherGroupsNeed(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	var ids []string
	for i := range 10 {
		id, err := queue.Produce(ctx, rdb, "s", "a", int64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// Another group that has read the first 3 entries and acknowledged none.
	if err := rdb.XGroupCreate(ctx, "s", "other", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "other", Consumer: "o", Streams: []string{"s", ">"}, Count: 3}).Err(); err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)
	until(t, 10*time.Second, "all applied", func() (bool, error) { return logs.get(queue.LogApplied) == 10, nil })
	// The consumer has trimmed after its batches; another produced entry
	// makes it trim once more, with all 10 acknowledged by its group.
	if _, err := queue.Produce(ctx, rdb, "s", "a", 1); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "the 11th applied", func() (bool, error) { return logs.get(queue.LogApplied) == 11, nil })
	if l, err := rdb.XLen(ctx, "s").Result(); err != nil || l != 11 {
		t.Fatalf("XLEN %d (%v); want all 11 kept: group other still has its first 3 pending", l, err)
	}
	// The other group acknowledges its 3 and reads 2 more: entries from
	// its pending 4th on are kept.
	if err := rdb.XAck(ctx, "s", "other", ids[0], ids[1], ids[2]).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "other", Consumer: "o", Streams: []string{"s", ">"}, Count: 2}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.Produce(ctx, rdb, "s", "a", 1); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "entries before group other's first pending trimmed", func() (bool, error) {
		first, err := rdb.XRangeN(ctx, "s", "-", "+", 1).Result()
		if err != nil || len(first) == 0 {
			return false, err
		}
		return first[0].ID == ids[3], nil
	})
	if logs.get(queue.LogTrimFailed) != 0 {
		t.Fatalf("%d trims failed", logs.get(queue.LogTrimFailed))
	}
}

// TestTrimmedPendingEntryRecorded: an operator bounds the stream by hand
// (XTRIM MAXLEN, or XADD MAXLEN in a producer of their own) while entries
// are pending: read by a leader that then lost its lease, not applied.
// The next leader's XAUTOCLAIM drops them from the pending list (Redis 7
// returns their ids apart, which go-redis's XAutoClaim discards). Before,
// they were gone with no trace: not applied, not in queue_dead, nothing
// logged (3 pending, then none; 0 of 3 in queue_dead; the log: elected,
// applied, for the message after them). Each must be recorded in
// queue_dead, with an error saying it was trimmed, and logged dead.
func TestTrimmedPendingEntryRecorded(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	trimmed := trimmedPending(t, ctx, rdb, 3)
	after, err := queue.Produce(ctx, rdb, "s", "a", 100)
	if err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	until(t, 10*time.Second, "the message after the trim applied, nothing pending", func() (bool, error) {
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE entry_id = $1`, after)
		if err != nil || n != 1 {
			return false, err
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	trimmedDead(t, ctx, db, logs, trimmed, len(trimmed))
}

// trimmedPending appends n messages to stream s, has consumer "deposed"
// of group g read them (a leader that lost its lease before applying
// them), and trims them all from the stream: n pending entries whose
// fields are gone. It returns their entry ids.
func trimmedPending(t *testing.T, ctx context.Context, rdb *redis.Client, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id, err := queue.Produce(ctx, rdb, "s", "a", int64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rdb.XGroupCreateMkStream(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "deposed", Streams: []string{"s", ">"}, Count: int64(n), Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XTrimMaxLen(ctx, "s", 0).Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// trimmedDead checks that queue_dead holds one dead letter, saying it was
// trimmed, for each of ids, and that logs holds dead lines for wantLogged
// trimmed entries.
func trimmedDead(t *testing.T, ctx context.Context, db *sql.DB, logs *records, ids []string, wantLogged int) {
	t.Helper()
	seen := logs.String()
	logs.mu.Lock()
	logged := 0
	for _, l := range logs.seen {
		if strings.HasPrefix(l, queue.LogDead+": ") && strings.Contains(l, "trimmed") {
			logged++
		}
	}
	logs.mu.Unlock()
	dead, err := count(ctx, db, `SELECT count(*) FROM queue_dead WHERE entry_id = ANY($1) AND error LIKE '%trimmed%'`, ids)
	if err != nil {
		t.Fatal(err)
	}
	if dead != int64(len(ids)) || logged != wantLogged {
		t.Fatalf("%d of the %d trimmed pending entries %v in queue_dead, %d logged dead (want %d); log: %s", dead, len(ids), ids, logged, wantLogged, seen)
	}
}

// TestTrimmedAfterApplyNotDeadLettered: a leader applied a message and
// lost its lease before XACK, and the entry was trimmed meanwhile: the
// next leader is told the entry is gone, and must not record it as lost,
// since queue_applied holds it (by entry id: its message id went with its
// fields); the other trimmed entry, not applied, is recorded. Before,
// neither was recorded nor logged (log: [elected]).
func TestTrimmedAfterApplyNotDeadLettered(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	trimmed := trimmedPending(t, ctx, rdb, 2)
	// The deposed leader's commit of the first.
	if _, err := db.ExecContext(ctx, `INSERT INTO queue_applied (stream, msg_id, entry_id, account, amount, token, consumer)
VALUES ('s', 'the-message-id', $1, 'a', 1, 1, 'deposed')`, trimmed[0]); err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	until(t, 10*time.Second, "nothing pending", func() (bool, error) {
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	var state string
	until(t, 10*time.Second, "the trimmed entries handled", func() (bool, error) {
		state = logs.String()
		return logs.has(queue.LogDead, "trimmed") && strings.Contains(state, queue.LogDuplicate), nil
	}, &state)
	trimmedDead(t, ctx, db, logs, trimmed[1:], 1)
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_dead WHERE entry_id = $1`, trimmed[0]); err != nil || n != 0 {
		t.Fatalf("%d dead letters (%v) for entry %s, applied before it was trimmed", n, err, trimmed[0])
	}
}

// TestTrimmedRecordFailureKeepsID: the database fails the dead letter of a
// trimmed entry. XAUTOCLAIM told the leader of the entry once, and took it
// off the pending list: the consumer must keep its id until it is
// recorded, and record it in a later try. Before, nothing was recorded
// (log: [elected]).
func TestTrimmedRecordFailureKeepsID(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	trimmed := trimmedPending(t, ctx, rdb, 1)
	var failed atomic.Bool
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs),
		Tx: func(ctx context.Context, db *sql.DB, resource string, token fence.Token, fn func(*sql.Tx) error) error {
			if resource == queue.Resource("s", trimmed[0]) && failed.CompareAndSwap(false, true) {
				return errors.New("the database failed")
			}
			return guard.Tx(ctx, db, resource, token, fn)
		}}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	until(t, 10*time.Second, "the trimmed entry recorded", func() (bool, error) {
		state = logs.String()
		n, err := count(ctx, db, `SELECT count(*) FROM queue_dead WHERE entry_id = $1`, trimmed[0])
		return n == 1, err
	}, &state)
	trimmedDead(t, ctx, db, logs, trimmed, 1)
}

// TestTrimmedClaimedByTwoLeaders: two consumers lead at once (their locks
// on two Redis servers: as a deposed leader that has not yet noticed, and
// its successor) and both claim the group's pending entries, trimmed from
// the stream. Each trimmed entry must be recorded once, and logged dead
// once. Before, none was (log: [elected elected]).
func TestTrimmedClaimedByTwoLeaders(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	trimmed := trimmedPending(t, ctx, rdb, 20)
	logs := &records{}
	consumer := func(name string) *queue.Consumer {
		return &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: name,
			MinIdle: time.Second, Batch: 2, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	}
	other, err := redislock.New(redistest.Start(t).Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	otherCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- consumer("c2").Run(otherCtx, other, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	}()
	t.Cleanup(func() { stop(); <-done })
	running(t, ctx, consumer("c1"), fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	until(t, 10*time.Second, "the trimmed entries recorded", func() (bool, error) {
		state = logs.String()
		n, err := count(ctx, db, `SELECT count(*) FROM queue_dead`)
		return n >= int64(len(trimmed)), err
	}, &state)
	trimmedDead(t, ctx, db, logs, trimmed, len(trimmed))
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_dead`); err != nil || n != int64(len(trimmed)) {
		t.Fatalf("%d dead letters (%v), want %d", n, err, len(trimmed))
	}
}

// groupBeforeTrim is a go-redis hook that creates a group of the stream
// from its start just before the first XTRIM goes out, or the first script
// whose one key is the stream (the trim's: Produce's has two keys, the
// lock's scripts other keys): an operator or a second application adding
// its group while the leader trims.
type groupBeforeTrim struct {
	rdb     *redis.Client
	once    sync.Once
	created chan struct{}
}

func (h *groupBeforeTrim) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *groupBeforeTrim) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *groupBeforeTrim) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		script := (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 3 &&
			fmt.Sprint(args[2]) == "1" && fmt.Sprint(args[3]) == "s"
		if cmd.Name() == "xtrim" || script {
			h.once.Do(func() {
				if err := h.rdb.XGroupCreate(ctx, "s", "late", "0").Err(); err == nil {
					close(h.created)
				}
			})
		}
		return next(ctx, cmd)
	}
}

// TestTrimKeepsGroupCreatedMeanwhile: a group created from the stream's
// start while the leader trims (after its XINFO GROUPS, before its XTRIM)
// must find every entry the stream held when it was created. Before, the
// trim's least needed id had been computed without that group, and the
// XTRIM removed the entries the group was created to read.
func TestTrimKeepsGroupCreatedMeanwhile(t *testing.T) {
	const n = 5
	ctx, rdb, db := servers(t, 30*time.Second)
	for i := range n {
		if _, err := queue.Produce(ctx, rdb, "s", "a", int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	h := &groupBeforeTrim{rdb: rdb, created: make(chan struct{})}
	rdb.AddHook(h)
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)
	select {
	case <-h.created:
	case <-ctx.Done():
		t.Fatal("no trim, or group late not created, before the deadline")
	}
	// One more message: once it is applied, the trim that ran when group
	// late was created has ended (the consumer trims after each batch, in
	// turn).
	if _, err := queue.Produce(ctx, rdb, "s", "a", 100); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "all applied", func() (bool, error) { return logs.get(queue.LogApplied) == n+1, nil })
	got, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "late", Consumer: "l", Streams: []string{"s", ">"}, Count: 100, Block: -1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].Messages) != n+1 {
		t.Fatalf("group late, created from 0 with %d entries in the stream, read %v; want those %d and the one produced after", n, got, n)
	}
}

// TestTrimBesideGroupAtLastPossibleID: another group whose last delivered
// id is the greatest a stream id can be (created with it, to read nothing
// of the stream) needs none of its entries, and must not stop the trim.
// Before, the trim asked Redis for the entries after that id, which has
// no successor, and every trim failed ("ERR invalid start ID for the
// interval"; with the earlier Go computation, the id after it wrapped to
// 0-0 and nothing was trimmed): XLEN 5 after 5 applied.
func TestTrimBesideGroupAtLastPossibleID(t *testing.T) {
	const n = 5
	ctx, rdb, db := servers(t, 30*time.Second)
	for i := range n {
		if _, err := queue.Produce(ctx, rdb, "s", "a", int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XGroupCreate(ctx, "s", "other", "18446744073709551615-18446744073709551615").Err(); err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)
	until(t, 10*time.Second, "the applied entries trimmed", func() (bool, error) {
		if logs.has(queue.LogTrimFailed, "") {
			logs.mu.Lock()
			defer logs.mu.Unlock()
			return false, fmt.Errorf("trim failed: %v", logs.seen)
		}
		l, err := rdb.XLen(ctx, "s").Result()
		return l == 0, err
	})
}

// hungTrim is a go-redis hook under which the trim's script (the one
// script whose one key is the stream) never answers: a Redis that hangs
// on it.
type hungTrim struct {
	once sync.Once
	hung chan struct{}
}

func (h *hungTrim) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *hungTrim) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *hungTrim) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 3 &&
			fmt.Sprint(args[2]) == "1" && fmt.Sprint(args[3]) == "s" {
			h.once.Do(func() { close(h.hung) })
			<-ctx.Done()
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}

// TestHungTrimEndsWithLease: a trim that hangs must not keep a term going
// once its lease is lost: the next election waits for the term to end.
// Before, the trim ran on Run's context, bounded by TxTimeout only: with
// the lease lost (its key deleted, WatchdogTTL 1 s) no "term ended" was
// logged within 5 s, the term held by the hung trim for its 20 s.
func TestHungTrimEndsWithLease(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if _, err := queue.Produce(ctx, rdb, "s", "a", 1); err != nil {
		t.Fatal(err)
	}
	h := &hungTrim{hung: make(chan struct{})}
	rdb.AddHook(h)
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1", TxTimeout: 20 * time.Second,
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	locker, err := redislock.New(rdb, &redislock.Options{WatchdogTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, locker) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-h.hung:
	case <-ctx.Done():
		t.Fatal("no trim before the deadline")
	}
	// The lock's key gone (as after a failover to a replica that had not
	// yet got it): the next renewal finds the lease lost.
	if err := rdb.Del(ctx, "fence:{"+queue.LockName("s", "g")+"}").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, 5*time.Second, "the term ended", func() (bool, error) { return logs.has(queue.LogTermEnded, ""), nil })
}
