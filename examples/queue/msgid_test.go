package queue_test

import (
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/redis/go-redis/v9"
)

// TestSameIDProducedTwiceAppliedOnce: a caller that retries ProduceID
// after an error (it cannot tell whether the first call appended) with
// the same id of its own leaves two entries in the stream; the consumer
// keys on the id, not on the entries, and applies the message once.
func TestSameIDProducedTwiceAppliedOnce(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	const key = "payment:1001:approve"
	var entries []string
	for range 2 {
		e, err := queue.ProduceID(ctx, rdb, "s", key, "a", 5)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
	}
	if entries[0] == entries[1] {
		t.Fatalf("two ProduceID calls, one entry %s: the test needs two", entries[0])
	}
	after, err := queue.ProduceID(ctx, rdb, "s", "payment:1002:approve", "a", 100)
	if err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)
	until(t, 10*time.Second, "the message after the two applied, nothing pending", func() (bool, error) {
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE entry_id = $1`, after)
		if err != nil || n != 1 {
			return false, err
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || n != 105 {
		t.Fatalf("balance %d (%v), want 105: %s applied twice", n, err, key)
	}
	var entry string
	if err := db.QueryRowContext(ctx, `SELECT entry_id FROM queue_applied WHERE stream = 's' AND msg_id = $1`, key).Scan(&entry); err != nil {
		t.Fatal(err)
	}
	if entry != entries[0] || logs.get(queue.LogApplied) != 2 || logs.get(queue.LogDuplicate) != 1 {
		t.Fatalf("%s applied from entry %s (want %s); %d applied, %d duplicates logged, want 2 and 1",
			key, entry, entries[0], logs.get(queue.LogApplied), logs.get(queue.LogDuplicate))
	}
}

// TestEntryWithoutIDAppliedOnce: an entry without the message id field
// (an older producer, or XADD by hand) is keyed by its stream entry id, as
// before the field: applied once, and a redelivery is a no-op.
func TestEntryWithoutIDAppliedOnce(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	old, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"account", "a", "amount", 5}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.Produce(ctx, rdb, "s", "a", 7); err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{KeepEntries: true, Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)
	settled := func(dups int) func() (bool, error) {
		return func() (bool, error) {
			if logs.get(queue.LogApplied) != 2 || logs.get(queue.LogDuplicate) != dups {
				return false, nil
			}
			p, err := pending(ctx, rdb, "s", "g")
			return p == 0, err
		}
	}
	until(t, 10*time.Second, "both applied", settled(0))
	if err := rdb.XGroupSetID(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "both redelivered and found applied", settled(2))
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || n != 12 {
		t.Fatalf("balance %d (%v), want 12", n, err)
	}
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE stream = 's' AND msg_id = $1 AND entry_id = $1`, old); err != nil || n != 1 {
		t.Fatalf("%d rows keyed by the entry id %s (%v), want 1", n, old, err)
	}
	if logs.get(queue.LogDead) != 0 {
		t.Fatalf("%d dead: the entry without an id was taken for malformed", logs.get(queue.LogDead))
	}
}

// TestProduceIDRefusesInvalidIDs: an id that is empty, too long, not
// UTF-8, holds a NUL, another control character or a brace, leaves the
// guard resource too long, or has the form of a stream entry id is refused
// with ErrInvalidID, and nothing is appended (nor recorded).
func TestProduceIDRefusesInvalidIDs(t *testing.T) {
	ctx, rdb, _ := servers(t, 30*time.Second)
	long := strings.Repeat("s", fence.MaxNameLen-len(queue.Resource("", ""))-queue.MaxIDLen+1)
	for _, tc := range []struct{ stream, id string }{
		{"s", ""},
		{"s", strings.Repeat("x", queue.MaxIDLen+1)},
		{"s", strings.Repeat("é", queue.MaxIDLen/2) + "x"}, // 129 bytes, 65 runes
		{"s", "caf\xe9"},
		{"s", "a\x00b"},
		{"s", "a\nb"},
		{"s", "a\x7fb"},
		{"s", "a{b}"},
		{"s", "1-1"},
		{"s", "1700000000000-0"},
		{long, strings.Repeat("x", queue.MaxIDLen)}, // the resource, 257 bytes
	} {
		_, err := queue.ProduceID(ctx, rdb, tc.stream, tc.id, "a", 1)
		if !errors.Is(err, queue.ErrInvalidID) {
			t.Errorf("id %.40q (%d bytes), stream of %d bytes: %v, want ErrInvalidID", tc.id, len(tc.id), len(tc.stream), err)
		}
	}
	if keys, err := rdb.Keys(ctx, "*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("refused ids left keys %q (%v), want none", keys, err)
	}
	// The longest id the long stream leaves room for, and ids that look
	// like entry ids only at a glance, are accepted.
	for _, tc := range []struct{ stream, id string }{
		{long, strings.Repeat("x", queue.MaxIDLen-1)},
		{"s", strings.Repeat("é", queue.MaxIDLen/2)},
		{"s", "2024-10-01"},
		{"s", "-1"},
		{"s", "1-"},
		{"s", "payment:1001:approve"},
	} {
		if _, err := queue.ProduceID(ctx, rdb, tc.stream, tc.id, "a", 1); err != nil {
			t.Errorf("id %.40q, stream of %d bytes: %v", tc.id, len(tc.stream), err)
		}
	}
}

// TestProduceWritesRandomID: Produce gives each message an id of its own,
// 16 random bytes in hex, in the entry's field queue.IDField.
func TestProduceWritesRandomID(t *testing.T) {
	ctx, rdb, _ := servers(t, 30*time.Second)
	seen := map[string]bool{}
	for range 3 {
		entry, err := queue.Produce(ctx, rdb, "s", "a", 1)
		if err != nil {
			t.Fatal(err)
		}
		e, err := rdb.XRange(ctx, "s", entry, entry).Result()
		if err != nil || len(e) != 1 {
			t.Fatalf("entry %s: %v %v", entry, e, err)
		}
		id, _ := e[0].Values[queue.IDField].(string)
		if b, err := hex.DecodeString(id); err != nil || len(b) != 16 || seen[id] {
			t.Fatalf("entry %s: message id %q; want 16 new random bytes in hex", entry, id)
		}
		seen[id] = true
	}
}

// TestInvalidIDInEntryIsDeadLettered: an entry written by hand whose id
// field is not a valid message id (unstorable bytes, too long for the
// guard resource, an entry id's form) is malformed: recorded in
// queue_dead under its entry id and acknowledged, and the messages behind
// it are applied, rather than every term failing on it.
func TestInvalidIDInEntryIsDeadLettered(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	var bad []string
	for _, id := range []string{"a\x00b", "caf\xe9", strings.Repeat("x", 300), "1-1", ""} {
		e, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{queue.IDField, id, "account", "a", "amount", 1}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		bad = append(bad, e)
	}
	after, err := queue.Produce(ctx, rdb, "s", "a", 10)
	if err != nil {
		t.Fatal(err)
	}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(&counter{})}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	until(t, 10*time.Second, "the message behind the bad ids applied, nothing pending", func() (bool, error) {
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE entry_id = $1`, after)
		if err != nil || n != 1 {
			return false, err
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	for _, e := range bad {
		var why string
		err := db.QueryRowContext(ctx, `SELECT error FROM queue_dead WHERE stream = 's' AND msg_id = $1 AND entry_id = $1`, e).Scan(&why)
		if errors.Is(err, sql.ErrNoRows) {
			t.Errorf("entry %s acknowledged but not in queue_dead under its entry id", e)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(why, queue.IDField) {
			t.Errorf("dead letter %s: error %q does not name the field", e, why)
		}
	}
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || n != 10 {
		t.Fatalf("balance %d (%v), want 10", n, err)
	}
}

// oldSchema is queue.Schema before the message ids: queue_applied and
// queue_dead keyed by (stream, msg_id), msg_id the stream entry id, and no
// entry_id.
const oldSchema = `
CREATE TABLE queue_applied (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY,
	stream     TEXT   NOT NULL,
	msg_id     TEXT   NOT NULL,
	account    TEXT   NOT NULL,
	amount     BIGINT NOT NULL,
	token      BIGINT NOT NULL,
	consumer   TEXT   NOT NULL,
	applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (stream, msg_id)
);
CREATE TABLE queue_balance (
	account TEXT   PRIMARY KEY,
	balance BIGINT NOT NULL
);
CREATE TABLE queue_dead (
	stream     TEXT   NOT NULL,
	msg_id     TEXT   NOT NULL,
	fields     TEXT   NOT NULL,
	deliveries BIGINT NOT NULL,
	error      TEXT   NOT NULL,
	token      BIGINT NOT NULL,
	consumer   TEXT   NOT NULL,
	dead_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (stream, msg_id)
)`

// TestCreateSchemaUpgradesOldDatabase: a database created by the old
// schema, with an entry applied under its entry id, is upgraded by
// CreateSchema (twice: it stays idempotent); then that entry, redelivered,
// is still found applied, and new messages are applied.
func TestCreateSchemaUpgradesOldDatabase(t *testing.T) {
	ctx, rdb, _ := servers(t, 30*time.Second)
	db := pg.NewDB(t)
	if _, err := db.ExecContext(ctx, oldSchema); err != nil {
		t.Fatal(err)
	}
	old, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"account", "a", "amount", 5}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The old consumer applied it, and died before XACK.
	if _, err := db.ExecContext(ctx, `INSERT INTO queue_applied (stream, msg_id, account, amount, token, consumer) VALUES ('s', $1, 'a', 5, 1, 'old')`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO queue_balance VALUES ('a', 5)`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := queue.CreateSchema(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := queue.Produce(ctx, rdb, "s", "a", 7); err != nil {
		t.Fatal(err)
	}
	// And one for queue_dead, which gained entry_id too.
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{queue.IDField, "bad:1", "account", "a", "amount", "ten"}}).Err(); err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	var state string
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	until(t, 10*time.Second, "the old entry found applied, the new one applied, the bad one dead", func() (bool, error) {
		state = fmt.Sprintf("%d applied, %d duplicate, %d dead, %d failed", logs.get(queue.LogApplied), logs.get(queue.LogDuplicate), logs.get(queue.LogDead), logs.get(queue.LogFailed))
		if logs.get(queue.LogApplied) != 1 || logs.get(queue.LogDuplicate) != 1 || logs.get(queue.LogDead) != 1 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || n != 12 {
		t.Fatalf("balance %d (%v), want 12", n, err)
	}
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_dead WHERE stream = 's' AND msg_id = 'bad:1' AND entry_id IS NOT NULL`); err != nil || n != 1 {
		t.Fatalf("%d dead letters for bad:1 (%v), want 1", n, err)
	}
}

// TestProduceRefusesUnstorableAccount: an account that is empty, holds a
// NUL or is not UTF-8 can never be applied (the consumer finds the entry
// malformed, or PostgreSQL refuses the bytes, and gives it up, in
// queue_dead). Produce appended it and returned no error: the message was
// lost to the caller. It must refuse it with ErrInvalidAccount and append
// nothing.
func TestProduceRefusesUnstorableAccount(t *testing.T) {
	ctx, rdb, _ := servers(t, 30*time.Second)
	for _, account := range []string{"", "a\x00b", "caf\xe9"} {
		if _, err := queue.Produce(ctx, rdb, "s", account, 1); !errors.Is(err, queue.ErrInvalidAccount) {
			t.Errorf("Produce, account %q: %v, want ErrInvalidAccount", account, err)
		}
		if _, err := queue.ProduceID(ctx, rdb, "s", "k", account, 1); !errors.Is(err, queue.ErrInvalidAccount) {
			t.Errorf("ProduceID, account %q: %v, want ErrInvalidAccount", account, err)
		}
	}
	if keys, err := rdb.Keys(ctx, "*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("refused accounts left keys %q (%v), want none", keys, err)
	}
}
