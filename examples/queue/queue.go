package queue

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/bound"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/redis/go-redis/v9"
)

// Schema creates the effect tables (PostgreSQL): queue_applied, one row per
// applied message in the order they were applied (seq), with the token and
// consumer that applied it, queue_balance, what the messages add up to,
// queue_dead, the entries given up on (malformed, or see
// Consumer.MaxDeliveries), with their fields (quoted as Go's %q prints
// them, so that any bytes a producer sent can be stored) and the last
// error, and queue_failures, how many tries of each message not yet done
// have failed (see Consumer.MaxDeliveries; its row goes when the message is
// applied or given up on). A
// message is done once it has a row in queue_applied or in queue_dead,
// never both. A message whose id was applied with another account or
// amount is another message under a reused id: its dead letter's key is
// the id followed by "{reused:", a hash of its account and amount, and
// "}" (see the package documentation), and the applied one keeps the id.
// An entry trimmed from the stream while pending, its fields gone, is
// recorded under its entry id, with empty fields and deliveries 0 (unknown).
//
// Both tables are keyed by (stream, msg_id), msg_id being the message's
// key (see Message.Key): the producer's message id, or the stream entry id
// for an entry without one. entry_id is the stream entry that carried the
// message, for the record. A database created before the message ids has
// msg_id alone, which was the entry id: Schema adds entry_id to it (ALTER
// TABLE … ADD COLUMN, run only if the column is missing: ALTER TABLE takes
// the table's exclusive lock even when it has nothing to do, and every
// consumer runs Schema as it starts, queueing behind the leader's
// transactions and holding the leader's next ones up), and its rows keep
// entry_id NULL, their msg_id being the entry id. The tables keep their
// primary key, so an entry applied before the upgrade and redelivered
// after it is still found applied (its key is still its entry id); a
// separate table for the new keys would have made every message look in
// two places for good.
//
// queue_applied_entry_id indexes queue_applied by entry id, for the
// entries trimmed from the stream while pending, which the consumer looks
// up by entry id alone (see Consumer.Run). Schema creates it if it is
// missing, under the same check as the columns (CREATE INDEX IF NOT
// EXISTS takes the table's lock first); on a database upgraded from
// before it, that build holds the consumers' writes for as long as it
// takes: on a large queue_applied, create it beforehand with CREATE INDEX
// CONCURRENTLY queue_applied_entry_id ON queue_applied (stream, entry_id).
//
// Schema looks each table up where the consumer's unqualified statements
// find it: in the first schema of the session's search_path that has it
// (to_regclass), not in current_schema() alone, where CREATE TABLE IF NOT
// EXISTS looks, and creates only the tables found nowhere on the path. A
// consumer role owning a schema of its own name, first on PostgreSQL's
// default path ("$user", public), so uses the tables made in public rather
// than get empty ones of its own (TestCreateSchemaWithOwnSchemaFirstOnPath),
// as guard.CreateTables does with its own.
const Schema = `
DO $$
BEGIN
	IF to_regclass('queue_applied') IS NULL THEN
		CREATE TABLE IF NOT EXISTS queue_applied (
			seq        BIGINT GENERATED ALWAYS AS IDENTITY,
			stream     TEXT   NOT NULL,
			msg_id     TEXT   NOT NULL,
			entry_id   TEXT,
			account    TEXT   NOT NULL,
			amount     BIGINT NOT NULL,
			token      BIGINT NOT NULL,
			consumer   TEXT   NOT NULL,
			applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
			PRIMARY KEY (stream, msg_id)
		);
	END IF;
	IF to_regclass('queue_balance') IS NULL THEN
		CREATE TABLE IF NOT EXISTS queue_balance (
			account TEXT   PRIMARY KEY,
			balance BIGINT NOT NULL
		);
	END IF;
	IF to_regclass('queue_dead') IS NULL THEN
		CREATE TABLE IF NOT EXISTS queue_dead (
			stream     TEXT   NOT NULL,
			msg_id     TEXT   NOT NULL,
			entry_id   TEXT,
			fields     TEXT   NOT NULL,
			deliveries BIGINT NOT NULL,
			error      TEXT   NOT NULL,
			token      BIGINT NOT NULL,
			consumer   TEXT   NOT NULL,
			dead_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
			PRIMARY KEY (stream, msg_id)
		);
	END IF;
	IF to_regclass('queue_failures') IS NULL THEN
		CREATE TABLE IF NOT EXISTS queue_failures (
			stream   TEXT   NOT NULL,
			msg_id   TEXT   NOT NULL,
			failures BIGINT NOT NULL,
			PRIMARY KEY (stream, msg_id)
		);
	END IF;
	IF NOT ` + appliedHasEntryID + ` THEN
		ALTER TABLE queue_applied ADD COLUMN IF NOT EXISTS entry_id TEXT;
	END IF;
	IF NOT ` + deadHasEntryID + ` THEN
		ALTER TABLE queue_dead ADD COLUMN IF NOT EXISTS entry_id TEXT;
	END IF;
	IF NOT ` + hasEntryIndex + ` AND ` + ownsApplied + ` THEN
		CREATE INDEX IF NOT EXISTS queue_applied_entry_id ON queue_applied (stream, entry_id);
	END IF;
END
$$`

// appliedHasEntryID and deadHasEntryID are true when queue_applied and
// queue_dead, as the path finds them, have entry_id.
const (
	appliedHasEntryID = `EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
		WHERE attrelid = to_regclass('queue_applied') AND attname = 'entry_id' AND NOT attisdropped)`
	deadHasEntryID = `EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
		WHERE attrelid = to_regclass('queue_dead') AND attname = 'entry_id' AND NOT attisdropped)`
)

// hasEntryIndex is true when queue_applied_entry_id is in queue_applied's
// schema, where CREATE INDEX makes it (and where its IF NOT EXISTS looks,
// after it has taken the table's lock).
const hasEntryIndex = `EXISTS (SELECT 1 FROM pg_catalog.pg_class
		WHERE relname = 'queue_applied_entry_id' AND relnamespace =
			(SELECT relnamespace FROM pg_catalog.pg_class WHERE oid = to_regclass('queue_applied')))`

// ownsApplied is true when the session's role may create an index on
// queue_applied (it owns the table, or inherits from its owner), and for a
// table not made yet (Schema's CREATE TABLE makes it the role's).
const ownsApplied = `COALESCE((SELECT pg_has_role(relowner, 'USAGE') FROM pg_catalog.pg_class
		WHERE oid = to_regclass('queue_applied')), true)`

// CreateSchema creates the tables, the guard's included. Consumers that
// start at once may call it together (guard.CreateIfNotExists). Once the
// tables, their entry_id columns and queue_applied_entry_id are there it
// creates nothing, so that a consumer starts as a role granted the tables'
// rows and not CREATE on the schema (PostgreSQL checks that privilege
// before it looks whether a CREATE TABLE IF NOT EXISTS's table exists:
// TestCreateSchemaWithoutCreateOnSchema). Upgrading a database made before
// the entry_id columns takes a role that may: the tables' owner. The index
// only speeds up the look-up of entries trimmed while pending: a role that
// does not own queue_applied goes on without it
// (TestCreateSchemaNotOwnerIndexMissing), and the owner's next CreateSchema
// makes it.
func CreateSchema(ctx context.Context, db *sql.DB) error {
	if ctx == nil {
		return nilctx.Err("queue", "CreateSchema")
	}
	var done bool
	// Looked up as Schema looks them up. If the look-up fails, Schema
	// runs, and says what is wrong.
	err := db.QueryRowContext(ctx, `SELECT to_regclass('queue_applied') IS NOT NULL
	AND to_regclass('queue_balance') IS NOT NULL
	AND to_regclass('queue_dead') IS NOT NULL
	AND to_regclass('queue_failures') IS NOT NULL
	AND `+appliedHasEntryID+` AND `+deadHasEntryID+`
	AND (`+hasEntryIndex+` OR NOT `+ownsApplied+`)`).Scan(&done)
	if err != nil || !done {
		if err := guard.CreateIfNotExists(ctx, db, Schema); err != nil {
			return err
		}
	}
	return guard.CreateTables(ctx, db)
}

// Defaults of Consumer.
const (
	DefaultMinIdle   = 30 * time.Second // redislock's default lease time
	DefaultBatch     = 10
	DefaultBlock     = time.Second
	DefaultTxTimeout = 10 * time.Second
	// DefaultMaxDeliveries: a message whose transaction failed for the
	// fifth time is dead.
	DefaultMaxDeliveries = 5
)

// Message is one unit of work: add Amount to Account's balance.
type Message struct {
	ID string // the stream entry's id
	// Key is what makes a redelivery a no-op: the message's id, the
	// entry's field IDField, as Produce or ProduceID wrote it; for an
	// entry without that field (appended by an older Produce, or by hand
	// with XADD), ID. See IDField.
	Key     string
	Account string
	Amount  int64

	fields string // the entry's fields, quoted, as a dead letter keeps them (see deadAs)
}

// IDField is the stream entry's field that holds the message's id, which
// the consumer keys queue_applied and queue_dead by (with the stream), and
// fences the message's transaction on (Resource). Produce gives every
// message a random one, ProduceID the caller's.
//
// An entry without the field (written by a Produce that predates it, or by
// hand with XADD) falls back to its stream entry id, as every entry did
// before. That id is unique only within one life of the stream: a stream
// that Redis lost and started over (deleted, a restart without
// persistence, a failover to a replica whose machine's clock is behind,
// XADD's ids following the server's clock) can give a new entry the id of
// an old applied one, and a new message without the field is then taken
// for it if its account and amount are the same, and given up on
// (queue_dead) as a reused id if they are not. A message with the field is
// not. An entry whose field is
// not a valid message id (see ProduceID) is malformed: given up on at once
// (queue_dead), keyed by its entry id.
const IDField = "msg_id"

// MaxIDLen is the longest message id ProduceID accepts, in bytes. The id
// must also leave its guard resource, Resource(stream, id), within
// fence.MaxNameLen.
const MaxIDLen = 128

// ErrInvalidID means a message id was refused: empty, longer than
// MaxIDLen, not valid UTF-8, holding a NUL, another control character or a
// brace (the id names the message's guard resource, whose names refuse
// them), too long for the stream's guard resource, or of the form of a
// stream entry id (digits, '-', digits), which keys the entries without an
// id.
var ErrInvalidID = errors.New("queue: invalid message id")

// ErrInvalidAccount means an account was refused: empty, not valid UTF-8,
// holding a NUL, or longer than MaxAccountLen. The consumer could never
// apply such a message (an entry without an account is malformed,
// PostgreSQL's text holds neither NUL nor bytes that are not UTF-8, and a
// btree entry, queue_balance's key, at most 2704 bytes): it would go to
// queue_dead.
var ErrInvalidAccount = errors.New("queue: invalid account")

// MaxAccountLen is the longest account Produce and ProduceID accept, in
// bytes: well within the 2704 bytes of a PostgreSQL btree entry, which
// queue_balance's primary key makes each account (2,700 random letters
// failed every transaction of their message).
const MaxAccountLen = 1024

// checkID returns an error matching ErrInvalidID if id cannot be the id of
// a message of stream.
func checkID(stream, id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidID)
	case len(id) > MaxIDLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidID, len(id), MaxIDLen)
	case !utf8.ValidString(id) || strings.ContainsRune(id, 0):
		return fmt.Errorf("%w: %q holds a NUL or is not UTF-8", ErrInvalidID, id)
	case entryIDForm(id):
		return fmt.Errorf("%w: %q has the form of a stream entry id, which keys the entries without a message id", ErrInvalidID, id)
	}
	if err := fence.ValidateName(Resource(stream, id)); err != nil {
		return fmt.Errorf("%w: %q, as its guard resource: %w", ErrInvalidID, id, err)
	}
	return nil
}

// checkStream returns an error matching fence.ErrInvalidName if stream
// cannot be a queue's stream: empty, not a valid lock name (a control
// character, bytes that are not UTF-8: the stream names the guard
// resources), holding a brace (Produce's record takes the stream as its
// hash tag) or a ':', or too long for Resource(stream, id) to hold the
// longest entry id. Produce and Consumer.Run refuse the same streams. Resource and LockName join
// the stream and the message id (or group) with ':', and message ids may
// hold ':' ("payment:1001:approve"): with a ':' in stream names too, the
// message "eu:42" of "orders" and the message "42" of "orders:eu" would
// fence on one guard resource, queue:orders:eu:42, with the tokens of two
// unrelated locks. Without it, a resource's stream ends at its first ':'.
func checkStream(stream string) error {
	switch {
	case stream == "":
		return fmt.Errorf("%w: queue: empty stream", fence.ErrInvalidName)
	case strings.ContainsAny(stream, "{}"):
		return fmt.Errorf("%w: queue: stream %q contains a brace", fence.ErrInvalidName, stream)
	case strings.Contains(stream, ":"):
		return fmt.Errorf("%w: queue: stream %q contains ':', which separates the stream from the message id in its guard resources", fence.ErrInvalidName, stream)
	}
	if err := fence.ValidateName(stream); err != nil {
		return fmt.Errorf("queue: stream: %w", err)
	}
	// Every message is fenced on Resource(stream, id): a stream name that
	// leaves no room for the longest entry id would fail every message
	// (the consumer refuses it; Produce appended to it, for no consumer).
	if err := fence.ValidateName(Resource(stream, maxID)); err != nil {
		return fmt.Errorf("queue: stream %d bytes, too long for its messages' guard resource: %w", len(stream), err)
	}
	return nil
}

// entryIDForm reports whether s has the form of a stream entry id: digits,
// '-', digits.
func entryIDForm(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	return ok && digits(ms) && digits(seq)
}

func digits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// Produce appends a message to stream, with a random message id (16 bytes
// from crypto/rand, in hex; see IDField), and returns its stream entry id.
// A client that resends the command after losing its reply (go-redis
// does, MaxRetries times by default) does not append it again: the append
// runs in a script that records the call's random id, for
// produceResendWindow, beside the stream, and a resend finds the entry it
// appended. (A message appended twice under two message ids would be
// applied twice.) Produce returns when ctx ends, even if rdb's reads do
// not heed its deadline (go-redis's ContextTimeoutEnabled off). An error
// other than Redis's answer (a deadline, a lost connection after the last
// resend) leaves unknown whether the message was appended: do not call
// Produce again as if it was not, unless applying the message twice is
// harmless; call ProduceID with an id of your own, and again with the same
// id. A stream that is empty or holds a brace or a ':' (see Resource) is
// refused with an error matching fence.ErrInvalidName, and rdb
// must run the script at once: a client, not a pipeline (where go-redis
// cannot fall back from EVALSHA to EVAL). An account that is empty, holds
// a NUL, is not UTF-8 or is longer than MaxAccountLen is refused with an
// error matching ErrInvalidAccount, and nothing is appended.
func Produce(ctx context.Context, rdb redis.Cmdable, stream, account string, amount int64) (string, error) {
	if ctx == nil {
		return "", nilctx.Err("queue", "Produce")
	}
	var id [16]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand)
	return produce(ctx, rdb, stream, hex.EncodeToString(id[:]), account, amount)
}

// ProduceID is Produce with the caller's message id: an idempotency key of
// its own, such as "payment:1001:approve". Messages with one id are applied
// once, however many entries carry them: a caller that got an error from
// ProduceID (and cannot tell whether the message was appended) may call it
// again with the same id. The consumer knows the ids it applied for good
// (queue_applied). An id that is empty, longer than MaxIDLen, not valid
// UTF-8, holds a control character (NUL among them) or a brace, leaves
// Resource(stream, id) longer than fence.MaxNameLen, or has the form of a
// stream entry id (digits, '-', digits) is refused with an error matching
// ErrInvalidID, and nothing is appended.
func ProduceID(ctx context.Context, rdb redis.Cmdable, stream, id, account string, amount int64) (string, error) {
	if ctx == nil {
		return "", nilctx.Err("queue", "ProduceID")
	}
	return produce(ctx, rdb, stream, id, account, amount)
}

func produce(ctx context.Context, rdb redis.Cmdable, stream, id, account string, amount int64) (string, error) {
	if err := checkStream(stream); err != nil {
		return "", err
	}
	if err := checkID(stream, id); err != nil {
		return "", err
	}
	if account == "" || !utf8.ValidString(account) || strings.ContainsRune(account, 0) {
		return "", fmt.Errorf("%w: %q is empty, holds a NUL or is not UTF-8", ErrInvalidAccount, account)
	}
	if len(account) > MaxAccountLen {
		return "", fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidAccount, len(account), MaxAccountLen)
	}
	var call [16]byte
	_, _ = rand.Read(call[:]) // never fails (crypto/rand)
	// The record's hash tag is the stream's name: the same Redis Cluster
	// slot as the stream itself.
	record := "{" + stream + "}:produce:" + hex.EncodeToString(call[:])
	// A client whose reads ignore ctx's deadline (go-redis's default,
	// ContextTimeoutEnabled false) would hold the caller for its own
	// timeouts: return when ctx ends, the call finishing in the
	// background (whether it appended is then unknown, as after any
	// error that is not Redis's answer).
	return bound.Call(ctx, func() (string, error) {
		return produceScript.Run(ctx, rdb, []string{stream, record},
			produceResendWindow.Milliseconds(), id, account, amount).Text()
	}, nil)
}

// produceResendWindow is how long Produce's record of a call lives: longer
// than a client takes to resend it.
const produceResendWindow = time.Minute

// produceScript appends the message (id ARGV[2], account ARGV[3], amount
// ARGV[4]) to the stream KEYS[1] unless KEYS[2] records the entry id this
// call appended before, and records it for ARGV[1] ms.
var produceScript = redis.NewScript(`
local id = redis.call('GET', KEYS[2])
if id then
  return id
end
id = redis.call('XADD', KEYS[1], '*', '` + IDField + `', ARGV[2], 'account', ARGV[3], 'amount', ARGV[4])
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return id
`)

// Point is a place in the handling of a message where Consumer.Pause is
// called.
type Point int

// The points, in order.
const (
	// BeforeFence: the lease was found valid, the transaction has not
	// begun. A consumer paused here and deposed meanwhile is rejected by
	// the fence when it wakes, if the new leader applied the message.
	BeforeFence Point = iota
	// BeforeCommit: inside the transaction, after the fence and the
	// effect, before the commit.
	BeforeCommit
)

func (p Point) String() string {
	switch p {
	case BeforeFence:
		return "before-fence"
	case BeforeCommit:
		return "before-commit"
	}
	return fmt.Sprintf("Point(%d)", int(p))
}

// Consumer applies the messages of a stream through a consumer group while
// it leads.
type Consumer struct {
	// Redis holds the stream: a client, not a pipeline (Run refuses
	// one, also behind a wrapper: it asks with a PING). The lock may live elsewhere (the Locker given to Run). Run
	// returns when its context ends even if Redis's reads do not heed it
	// (go-redis's ContextTimeoutEnabled off, the default): a command
	// given up on finishes in the background. The consumer's user needs
	// the stream's commands, and should have EVALSHA and EVAL (the claim
	// and the trim are scripts) and SADD, SMEMBERS and SREM on the key
	// {<Stream>}:trimmed:<Group>, and XINFO, GET and SET on
	// {<Stream>}:unread:<Group> (see the package documentation). A user
	// refused those is still served: the claim falls back to a plain
	// XAUTOCLAIM, and pending entries trimmed by others are then lost
	// without a record, as is logged (LogUnrecorded, at ERROR, once per
	// Consumer); unread ones deleted are then not told of, as is logged too
	// (LogUnreadUnchecked, once); a refused trim is logged and the stream
	// keeps its entries.
	Redis redis.Cmdable
	// DB is the PostgreSQL database of the effects, with Schema created.
	DB *sql.DB
	// Stream is the stream's key, without braces or ':' (see Resource);
	// Group the consumer group, created at the stream's start if missing.
	Stream string
	Group  string
	// Name is the consumer's name in the group; each process needs its own.
	Name string
	// MinIdle is how long a pending entry must have been idle before the
	// leader claims it with XAUTOCLAIM during its term; at the start of a
	// term it claims every pending entry at once. See the package
	// documentation. Default DefaultMinIdle; set it to the lease time.
	MinIdle time.Duration
	// Batch is how many entries each XREADGROUP or XAUTOCLAIM asks for.
	// Default DefaultBatch.
	Batch int
	// Block is how long XREADGROUP waits for new entries. Default
	// DefaultBlock.
	Block time.Duration
	// KeepEntries leaves the entries that no group needs any more in the
	// stream (for an operator's replay, XGROUP SETID, or a group created
	// later from its start). By default Run trims them after each batch,
	// so that the stream does not grow for ever.
	KeepEntries bool
	// TxTimeout bounds each message's transaction, also after the lease
	// was lost: the fence, not the lease's context, must stop a write
	// that is under way. It bounds each XACK too. The context given to
	// Run bounds them as well, so that Run returns when it ends even if
	// the database does not answer. Default DefaultTxTimeout.
	TxTimeout time.Duration
	// MaxDeliveries is how many deliveries of a message may fail before it
	// is given up on: recorded in queue_dead (in a transaction fenced like
	// the effect's) and acknowledged, so that a message that can never be
	// applied does not end every term and starve the messages behind it.
	// The failed tries are counted in queue_failures, not by the stream's
	// delivery count: a message is delivered again, untried, each time a
	// term claims its batch and a message before it fails, and a message
	// behind a poison one would otherwise be given up on at its first
	// failure. A failure that also stops the write to queue_failures or
	// queue_dead (the database is down), or that came while another
	// session held a lock on queue_applied or queue_balance that the
	// message's transaction needs (maintenance), is not counted and leaves
	// the message pending. Default DefaultMaxDeliveries.
	MaxDeliveries int
	// Pause, if set, is called at each Point of each message: a place for
	// tests to stop the process.
	Pause func(p Point, m Message, token fence.Token)
	// Log receives what happens to each message and term; nil means
	// slog.Default().
	Log *slog.Logger
	// Tx runs the transaction that applies a message, fenced on resource
	// with token; nil means guard.Tx. A consumer has no reason to set it:
	// it is the seam through which the fault lab (fence lab, scenario 13)
	// runs the same consumer without the fence (its control) or with the
	// fence's comparison weakened (its mutation test).
	Tx func(ctx context.Context, db *sql.DB, resource string, token fence.Token, fn func(*sql.Tx) error) error

	plainClaim atomic.Bool // the claim script was refused (see claim)
	noUnread   atomic.Bool // the unread script was refused (see noticeUnread)
	toldGroups atomic.Bool // other groups of the stream were logged (see noticeGroups)
}

// LockName is the lock the consumers of stream's group campaign for.
func LockName(stream, group string) string { return "queue:" + stream + ":" + group }

// Resource is the guard resource that applying the message of stream with
// key id (Message.Key) fences. Message ids may hold ':', stream names may
// not (Produce, ProduceID and Consumer.Run refuse them): the stream is
// what lies between "queue:" and the next ':', so two streams' messages
// never fence on one resource.
func Resource(stream, id string) string { return "queue:" + stream + ":" + id }

// maxID is the longest stream entry id: two uint64s.
const maxID = "18446744073709551615-18446744073709551615"

// Outcomes of a message, as logged ("msg" of the log record).
const (
	LogApplied         = "applied"                    // committed, then acknowledged
	LogDuplicate       = "duplicate"                  // applied before, with the same account and amount (or given up on before): acknowledged
	LogRejected        = "rejected"                   // the fence found a greater token: a newer leader had it
	LogFailed          = "failed"                     // the transaction failed otherwise: the entry stays pending
	LogDead            = "dead"                       // malformed, failed on delivery MaxDeliveries, its id applied with another account or amount, or trimmed from the stream while pending: recorded in queue_dead, acknowledged
	LogElected         = "elected"                    // a term began
	LogTermEnded       = "term ended"                 // a term ended on an error (the lease lost, Redis or the database failing): the next election retries
	LogClaimed         = "claimed"                    // XAUTOCLAIM took pending entries
	LogUnrecorded      = "trimmed entries unrecorded" // the claim script was refused (ACL): claims go on with a plain XAUTOCLAIM, and pending entries trimmed by others are lost without a record
	LogTrimFailed      = "trim failed"                // the entries no group needs could not be trimmed from the stream (see Run): the next batch tries again
	LogUnread          = "trimmed unread"             // entries were deleted from the stream before the group read them (XADD MAXLEN, XTRIM, XDEL by others): which, and their content, is unknown; logged at ERROR with the ids that bound them
	LogUnreadUnchecked = "unread deletions unchecked" // the look for entries deleted unread was refused (ACL: EVAL, XINFO, or GET and SET on its key): such deletions go untold; logged at ERROR, once per Consumer
	LogOtherGroups     = "other groups"               // other groups of the stream run this consumer, named in the record (see noticeGroups): their leaders and this one refuse each other's writes; logged at ERROR, once per Consumer
)

var errDuplicate = errors.New("queue: message applied (or given up on) before")

// Run campaigns for the stream's lock on locker with fence.Lead and, while
// it leads, claims idle pending entries and reads new ones, applying each.
// Each term creates the group (and the stream) if missing. After each
// batch it trims the stream of the entries that no group of it needs any
// more (applied, or given up on, and acknowledged by every group; see
// trim), so that the stream does not grow for ever, unless KeepEntries.
// A pending entry trimmed from the stream by others (XADD MAXLEN or
// MINID, XTRIM, XDEL) before it was applied is recorded in queue_dead by
// its entry id (see the package documentation); its fields are lost.
// It returns when
// ctx ends, or at once, with an error matching fence.ErrInvalidOption or
// ErrInvalidName, for a nil ctx (as every call here that takes a ctx
// returns), for a Consumer without Redis, DB, Stream, Group or Name,
// whose Redis is a pipeline, with a Stream holding a brace or a ':' (see
// Resource), with a Name that is not UTF-8 or holds a NUL, with a
// negative duration or count, with a MinIdle, Block or TxTimeout under a
// millisecond (most likely a duration without its unit: Block: 50 is 50
// ns), or whose lock name, or the guard resource of its longest message
// id, is not valid.
// opts are passed to Lead.
func (c *Consumer) Run(ctx context.Context, locker fence.Locker, opts ...fence.LeadOption) error {
	if ctx == nil {
		return nilctx.Err("queue", "Consumer.Run")
	}
	if err := c.check(); err != nil {
		return err
	}
	// A pipeline queues each command and answers it at once, empty: the
	// consumer would spin on reads that never wait, filling the pipeline.
	// Asked, not told by its type: behind a wrapper that embeds
	// redis.Cmdable a pipeline is no redis.Pipeliner
	// (TestRunOnWrappedPipelineRefused). A Redis that fails the PING is the
	// terms' to wait for.
	pong, err := bound.Call(ctx, func() (string, error) { return c.Redis.Ping(ctx).Result() }, nil)
	if err == nil && pong != "PONG" {
		return fmt.Errorf("%w: queue: Redis answered PING with %q: a pipeline, which runs no command until Exec? give a client", fence.ErrInvalidOption, pong)
	}
	// The term's context ends with the lease; what must outlive the lease
	// (a transaction under way, its XACK) is bounded by ctx, the caller's.
	return fence.Lead(ctx, locker, LockName(c.Stream, c.Group), func(lctx context.Context, lease fence.Lease) error {
		// Logged here, not from an OnElected of Run's own: a caller's
		// OnElected among opts replaced it, and terms began unlogged.
		c.log().Info(LogElected, "consumer", c.Name, "token", int64(lease.Token()))
		// A term ends only on an error. Lead campaigns again and returns
		// nothing of it: without this record, a term that fails every time
		// (the stream's key holds another type, the tables are missing)
		// showed nothing but elections.
		err := c.term(lctx, ctx, lease)
		if ctx.Err() == nil {
			c.log().Warn(LogTermEnded, "consumer", c.Name, "token", int64(lease.Token()), "err", err)
		}
		return err
	}, opts...)
}

// check returns an error matching fence.ErrInvalidName or ErrInvalidOption
// if c cannot run: Run would otherwise panic on a nil Redis or DB, or fail
// each term (a negative MinIdle or TxTimeout) or poll Redis without pause
// (a negative Block).
func (c *Consumer) check() error {
	if c.Stream == "" || c.Group == "" || c.Name == "" {
		return fmt.Errorf("%w: queue: Stream, Group and Name must be set", fence.ErrInvalidOption)
	}
	if err := checkStream(c.Stream); err != nil {
		return err
	}
	if err := fence.ValidateName(LockName(c.Stream, c.Group)); err != nil {
		return err
	}
	// Every effect and dead letter records the name: one PostgreSQL's
	// text cannot hold would fail them all, and stall the queue.
	if !utf8.ValidString(c.Name) || strings.ContainsRune(c.Name, 0) {
		return fmt.Errorf("%w: queue: Name %q holds a NUL or is not UTF-8", fence.ErrInvalidOption, c.Name)
	}
	if c.Redis == nil || c.DB == nil {
		return fmt.Errorf("%w: queue: Redis and DB must be set", fence.ErrInvalidOption)
	}
	if c.MinIdle < 0 || c.Block < 0 || c.TxTimeout < 0 || c.Batch < 0 || c.MaxDeliveries < 0 {
		return fmt.Errorf("%w: queue: MinIdle %v, Block %v, TxTimeout %v, Batch %d, MaxDeliveries %d: want none negative",
			fence.ErrInvalidOption, c.MinIdle, c.Block, c.TxTimeout, c.Batch, c.MaxDeliveries)
	}
	// A duration under a millisecond is most likely one without its unit
	// (Block: 50 for 50 ms), as fence.Backoff's: Block went out as
	// XREADGROUP's BLOCK 0, which waits for a new entry for good (no idle
	// entry claimed meanwhile, the term ended by the read timeout), and
	// such a TxTimeout fails every transaction and dead letter.
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"MinIdle", c.MinIdle}, {"Block", c.Block}, {"TxTimeout", c.TxTimeout}} {
		if d.d > 0 && d.d < time.Millisecond {
			return fmt.Errorf("%w: queue: %s %v, under %v: a duration without its unit?", fence.ErrInvalidOption, d.name, d.d, time.Millisecond)
		}
	}
	return nil
}

func isBusyGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "BUSYGROUP")
}

// term is one term of leadership: claim, read, apply, until the lease ends
// (ctx, the lease's context). run is Run's: see apply.
func (c *Consumer) term(ctx, run context.Context, lease fence.Lease) error {
	// Each term creates the group if it is missing (the stream may have
	// gone with a Redis that restarted empty), with its count of entries
	// read known (see createGroupScript); where the script is refused
	// (ACL) or fails otherwise (Redis before 7.0), without.
	_, err := bound.Call(ctx, func() (struct{}, error) {
		err := createGroupScript.Run(ctx, c.Redis, []string{c.Stream}, c.Group).Err()
		if err != nil && !isBusyGroup(err) {
			err = c.Redis.XGroupCreateMkStream(ctx, c.Stream, c.Group, "0").Err()
		}
		return struct{}{}, err
	}, nil)
	if err != nil && !isBusyGroup(err) {
		return fmt.Errorf("queue: create group: %w", err)
	}
	c.noticeGroups(ctx)
	// First everything pending, whatever its idle time, in the stream's
	// order: whoever read it no longer leads. Then new entries, and each
	// round the pending ones idle for MinIdle.
	for cursor := "0-0"; ; {
		claimed, next, err := c.claim(ctx, run, lease, 0, cursor)
		if err != nil {
			return err
		}
		if next == "0-0" || (len(claimed) == 0 && next == cursor) {
			break // the whole pending list was scanned
		}
		cursor = next
	}
	cursor := "0-0"
	for {
		claimed, next, err := c.claim(ctx, run, lease, cmp.Or(c.MinIdle, DefaultMinIdle), cursor)
		if err != nil {
			return err
		}
		cursor = next
		if err := valid(ctx, lease); err != nil {
			return err
		}
		block := cmp.Or(c.Block, DefaultBlock)
		if len(claimed) > 0 {
			block = -1 // more may be pending: do not wait for new entries
		}
		if err := c.noticeUnread(ctx); err != nil {
			return err
		}
		// An XREADGROUP given up on may still deliver entries to this
		// consumer: they stay pending, and a leader claims them once idle
		// for MinIdle.
		streams, err := bound.Call(ctx, func() ([]redis.XStream, error) {
			return c.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{
				Group: c.Group, Consumer: c.Name, Streams: []string{c.Stream, ">"},
				Count: int64(c.batch()), Block: block,
			}).Result()
		}, nil)
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("queue: XREADGROUP: %w", err)
		}
		for _, s := range streams {
			if err := c.apply(ctx, run, lease, s.Messages); err != nil {
				return err
			}
		}
		if !c.KeepEntries && (len(claimed) > 0 || len(streams) > 0) {
			c.trim(ctx)
		}
	}
}

// trim removes from the stream the entries that no group of it needs any
// more, so that acknowledged messages do not fill Redis
// (TestAppliedEntriesLeaveTheStream: XLEN 50 after 50 applied): see
// trimScript. The script reads the groups and trims in one step: a group
// created or moved back (XGROUP CREATE, SETID) between a read of the
// groups and the XTRIM lost the entries it was created to read
// (TestTrimKeepsGroupCreatedMeanwhile). A group created later from an id
// already trimmed does not get those entries. Trimming is housekeeping:
// its failure is logged and the term goes on; the next batch trims again.
// ctx is the lease's: unlike a transaction under way (see apply), a trim
// has nothing to finish once the lease is lost, and one hung on Redis
// held the term, and the next election, for its TxTimeout
// (TestHungTrimEndsWithLease).
func (c *Consumer) trim(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(c.TxTimeout, DefaultTxTimeout))
	defer cancel()
	_, err := bound.Call(ctx, func() (struct{}, error) {
		err := trimScript.Run(ctx, c.Redis, []string{c.Stream}).Err()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		return struct{}{}, err
	}, nil)
	if err != nil {
		c.log().Warn(LogTrimFailed, "consumer", c.Name, "err", err)
	}
}

// lessLua defines less(a, b): whether stream entry id a comes before b.
// Ids are compared as the decimal strings Redis writes (no leading
// zeros): a Lua number cannot hold every uint64.
const lessLua = `
local function less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
`

// trimScript trims the stream KEYS[1] below the least, over its groups, of
// the first entry each group needs: its first pending one or, with none
// pending, the first after its last delivered. A group that needs none of
// the stream's entries bounds nothing (nor does one whose last delivered
// is maxID: no id follows it, and XRANGE refuses to look after it);
// with no group, nothing is trimmed.
var trimScript = redis.NewScript(lessLua + `
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then
  return false
end
local min
for _, g in ipairs(groups) do
  local f = {}
  for i = 1, #g, 2 do
    f[g[i]] = g[i + 1]
  end
  local need
  if f['pending'] > 0 then
    need = redis.call('XPENDING', KEYS[1], f['name'])[2]
  elseif f['last-delivered-id'] ~= '` + maxID + `' then
    local e = redis.call('XRANGE', KEYS[1], '(' .. f['last-delivered-id'], '+', 'COUNT', 1)
    if #e == 0 then
      need = nil
    else
      need = e[1][1]
    end
  end
  if need and (not min or less(need, min)) then
    min = need
  end
end
if min then
  return redis.call('XTRIM', KEYS[1], 'MINID', min)
end
return redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
`)

// claim takes, with XAUTOCLAIM from cursor, the pending entries idle for
// minIdle, records those trimmed from the stream meanwhile (see
// claimScript), applies the others, and returns them and the next cursor.
func (c *Consumer) claim(ctx, run context.Context, lease fence.Lease, minIdle time.Duration, cursor string) ([]redis.XMessage, string, error) {
	if err := valid(ctx, lease); err != nil {
		return nil, "", err
	}
	r, err := bound.Call(ctx, func() (claimReply, error) {
		if !c.plainClaim.Load() {
			v, err := claimScript.Run(ctx, c.Redis, []string{c.Stream, c.trimmedKey()},
				c.Group, c.Name, minIdle.Milliseconds(), cursor, c.batch()).Result()
			if !refused(err) {
				if err != nil {
					return claimReply{}, err
				}
				return parseClaim(v)
			}
			if !c.plainClaim.Swap(true) {
				c.log().Error(LogUnrecorded, "consumer", c.Name, "err", err)
			}
		}
		claimed, next, err := c.Redis.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: c.Stream, Group: c.Group, Consumer: c.Name,
			MinIdle: minIdle, Start: cursor, Count: int64(c.batch()),
		}).Result()
		return claimReply{claimed: claimed, next: next}, err
	}, nil)
	if err != nil {
		return nil, "", fmt.Errorf("queue: XAUTOCLAIM: %w", err)
	}
	for _, id := range r.trimmed {
		if err := c.recordTrimmed(ctx, run, lease, id); err != nil {
			return nil, "", err
		}
	}
	if len(r.claimed) > 0 {
		c.log().Info(LogClaimed, "consumer", c.Name, "token", int64(lease.Token()), "n", len(r.claimed), "min_idle", minIdle)
	}
	return r.claimed, r.next, c.apply(ctx, run, lease, r.claimed)
}

// valid returns an error if the lease is known to have ended: its context
// is done, or its deadline has passed (a consumer that was paused sees the
// latter at once, before the watchdog tells it).
func valid(ctx context.Context, lease fence.Lease) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if !time.Now().Before(lease.Deadline()) {
		return fmt.Errorf("%w: queue: past the lease's deadline", fence.ErrLeaseLost)
	}
	return nil
}

// apply applies the entries in order. It returns an error, ending the term,
// when the lease ended, the fence rejected the token, or the database or
// Redis failed; the entries not acknowledged stay pending. A message's
// transaction and its XACK run on run, Run's context, bounded by
// TxTimeout: the lease's end (ctx) does not cut them, the caller's does,
// so that Run returns within the caller's deadline even when the database
// does not answer (a transaction cut so rolls back, and its entry stays
// pending).
func (c *Consumer) apply(ctx, run context.Context, lease fence.Lease, entries []redis.XMessage) error {
	token := lease.Token()
	for _, e := range entries {
		if err := valid(ctx, lease); err != nil {
			return err
		}
		m, err := parse(c.Stream, e)
		if err != nil {
			// A malformed entry can never be applied: it is dead at once.
			if _, derr := c.giveUp(run, e, m, token, err, true); derr != nil {
				c.log().Warn(LogFailed, "consumer", c.Name, "id", e.ID, "token", int64(token), "err", err)
				if errors.Is(derr, guard.ErrStale) {
					return fmt.Errorf("%w: queue: a newer leader had %s: %w", fence.ErrLeaseLost, e.ID, derr)
				}
				return fmt.Errorf("queue: malformed %s: %w", e.ID, errors.Join(err, derr))
			}
			if err := c.ack(run, e.ID); err != nil {
				return err
			}
			continue
		}
		c.pause(BeforeFence, m, token)
		err = c.applyOne(run, m, token)
		if done := c.doneBefore(run, m, token, err); done != nil {
			err = done
		}
		var reused *reusedError
		switch {
		case err == nil:
			c.log().Info(LogApplied, "consumer", c.Name, "id", m.ID, "msg_id", m.Key, "token", int64(token))
		case errors.As(err, &reused):
			if err := c.giveUpReused(run, e, m, reused, token); err != nil {
				c.log().Warn(LogFailed, "consumer", c.Name, "id", m.ID, "msg_id", m.Key, "token", int64(token), "err", err)
				return err
			}
		case errors.Is(err, errDuplicate):
			c.log().Info(LogDuplicate, "consumer", c.Name, "id", m.ID, "msg_id", m.Key, "token", int64(token))
		case errors.Is(err, guard.ErrStale):
			c.log().Warn(LogRejected, "consumer", c.Name, "id", m.ID, "msg_id", m.Key, "token", int64(token), "err", err)
			return fmt.Errorf("%w: queue: a newer leader applied %s: %w", fence.ErrLeaseLost, m.ID, err)
		default:
			dead, derr := c.giveUp(run, e, m, token, err, false)
			if derr != nil {
				c.log().Warn(LogFailed, "consumer", c.Name, "id", m.ID, "msg_id", m.Key, "token", int64(token), "err", err)
				if errors.Is(derr, guard.ErrStale) {
					return fmt.Errorf("%w: queue: a newer leader had %s: %w", fence.ErrLeaseLost, m.ID, derr)
				}
				return fmt.Errorf("queue: apply %s: %w", m.ID, errors.Join(err, derr))
			}
			if !dead {
				c.log().Warn(LogFailed, "consumer", c.Name, "id", m.ID, "msg_id", m.Key, "token", int64(token), "err", err)
				return fmt.Errorf("queue: apply %s: %w", m.ID, err)
			}
		}
		// The commit (or the earlier one the constraint found) is done:
		// only now is the entry acknowledged, even if the lease ended
		// meanwhile. If XACK fails, the entry is claimed again later and
		// found applied.
		if err := c.ack(run, m.ID); err != nil {
			return err
		}
	}
	return nil
}

// doneBefore returns errDuplicate if err is guard's refusal of token
// because token itself was accepted on the resource of message m, and the
// message is done (applied with m's account and amount, or given up on);
// a *reusedError if m's key was applied with another account or amount
// (then m is not done: it is another message under the same id); nil
// otherwise, err then standing. A transaction of this term committed on
// the resource: for another entry with the same message id (a producer's
// retry, a redelivery, or another message reusing the id), or with a
// reply that was lost. guard accepts a token once per resource, and a
// newer leader's is greater: taking the refusal for a newer leader's ended
// the term for nothing. A malformed m (no account; see parse) has no
// content to compare: its key applied is errDuplicate. ctx is Run's (see
// apply).
func (c *Consumer) doneBefore(ctx context.Context, m Message, token fence.Token, err error) error {
	var stale *guard.StaleError
	if !errors.As(err, &stale) || stale.Last != token {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(c.TxTimeout, DefaultTxTimeout))
	defer cancel()
	err = c.appliedAs(ctx, c.DB, m)
	if !errors.Is(err, sql.ErrNoRows) {
		var reused *reusedError
		if errors.Is(err, errDuplicate) || errors.As(err, &reused) {
			return err
		}
		return nil
	}
	err = c.deadAs(ctx, c.DB, m, m.fields)
	var reused *reusedError
	if errors.Is(err, errDuplicate) || errors.As(err, &reused) {
		return err
	}
	return nil
}

// giveUp records entry e, whose message m failed with cause (or, if now,
// which is malformed), in queue_dead if now or if this was its failure
// MaxDeliveries (counted in queue_failures, in the same fenced
// transaction), and reports whether it did (or found it done before, or
// its id applied with another account or amount, which it then records as
// giveUpReused does). Its error, if any, is why it could not tell or
// record; the entry then stays pending, and the failure is not counted.
// ctx is Run's (see apply).
func (c *Consumer) giveUp(ctx context.Context, e redis.XMessage, m Message, token fence.Token, cause error, now bool) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, cmp.Or(c.TxTimeout, DefaultTxTimeout))
	defer cancel()
	p, err := bound.Call(rctx, func() ([]redis.XPendingExt, error) {
		return c.Redis.XPendingExt(rctx, &redis.XPendingExtArgs{
			Stream: c.Stream, Group: c.Group, Start: e.ID, End: e.ID, Count: 1,
		}).Result()
	}, nil)
	if err != nil {
		return false, fmt.Errorf("queue: XPENDING %s: %w", e.ID, err)
	}
	if len(p) == 0 {
		return false, nil
	}
	// The fields are the producer's bytes, and PostgreSQL's text holds
	// neither NUL nor invalid UTF-8: quoted, they are stored, escaped, and
	// the entry leaves the pending list (copied as they are, the dead
	// letter failed as the effect did, and the entry stalled the queue).
	fields := quoted(e.Values)
	dead := false
	err = c.fenced()(rctx, c.DB, Resource(c.Stream, m.Key), token, func(tx *sql.Tx) error {
		// Applied meanwhile (errDuplicate), or with another account or
		// amount (a *reusedError: another message under that id, not a
		// redelivery to count as done).
		if err := c.appliedAs(rctx, tx, m); !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		// Given up on meanwhile, with the same fields or others.
		if err := c.deadAs(rctx, tx, m, fields); !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if !now {
			// A try that failed while someone else holds a lock on the
			// effect's tables (maintenance: ALTER TABLE, VACUUM FULL,
			// CREATE INDEX without CONCURRENTLY; the try waited for it
			// until TxTimeout or the database's lock_timeout) failed for
			// the database, not for the message: like a database that is
			// down, it is not counted, and the message stays pending
			// until the lock is gone (TestLockedTableDoesNotKillMessages:
			// before, the message was given up on, its effect never
			// applied). pg_locks tells whether another session holds or
			// awaits a lock that conflicts with the one a try takes; a
			// lock on the tables giveUp itself reads or writes makes this
			// transaction wait out TxTimeout, uncounted too. A lock on
			// the message's own row does not conflict: a row that stays
			// locked is the message's failure, counted, so that it cannot
			// stall the queue
			// (TestMessageThatAlwaysTimesOutDoesNotStallTheQueue). Not
			// LOCK TABLE ... NOWAIT: it needs a table privilege that a
			// role granted columns lacks, and its refusal was taken for
			// a lock, so that no failure was ever counted
			// (TestPoisonDeadLetteredWithColumnPrivileges).
			var locked sql.NullString
			if err := tx.QueryRowContext(rctx, tablesLockedPG).Scan(&locked); err != nil {
				return err
			}
			if locked.Valid {
				return fmt.Errorf("queue: %s: the failure is not counted", locked.String)
			}
			// The failed tries, not the deliveries (XPENDING's count):
			// a delivery of a batch whose earlier message failed was
			// never tried.
			var failures int64
			if err := tx.QueryRowContext(rctx, `INSERT INTO queue_failures (stream, msg_id, failures) VALUES ($1, $2, 1)
ON CONFLICT (stream, msg_id) DO UPDATE SET failures = queue_failures.failures + 1 RETURNING failures`,
				c.Stream, m.Key).Scan(&failures); err != nil {
				return err
			}
			if failures < int64(c.maxDeliveries()) {
				return nil // commits the count
			}
		}
		dead = true
		if _, err := tx.ExecContext(rctx, `DELETE FROM queue_failures WHERE stream = $1 AND msg_id = $2`, c.Stream, m.Key); err != nil {
			return err
		}
		_, err := tx.ExecContext(rctx, `INSERT INTO queue_dead (stream, msg_id, entry_id, fields, deliveries, error, token, consumer)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (stream, msg_id) DO NOTHING`,
			c.Stream, m.Key, e.ID, fields, p[0].RetryCount, storable(cause.Error()), int64(token), c.Name)
		return err
	})
	// The leader's own token refused: this term applied or gave up on the
	// message (a commit whose reply was lost, another entry with its id).
	if done := c.doneBefore(ctx, m, token, err); done != nil {
		err = done
	}
	var reused *reusedError
	if errors.As(err, &reused) {
		return true, c.giveUpReused(ctx, e, m, reused, token)
	}
	if errors.Is(err, errDuplicate) {
		// Applied meanwhile (a deposed leader's late commit): done, but
		// not dead, and in no dead letter.
		c.log().Info(LogDuplicate, "consumer", c.Name, "id", e.ID, "msg_id", m.Key, "token", int64(token))
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if !dead {
		return false, nil
	}
	c.log().Error(LogDead, "consumer", c.Name, "id", e.ID, "msg_id", m.Key, "token", int64(token), "deliveries", p[0].RetryCount, "err", cause)
	return true, nil
}

// tablesLockedPG names the locks that other sessions (or prepared
// transactions) hold or await on queue_applied or queue_balance in modes
// that conflict with a try's ROW EXCLUSIVE (see giveUp), NULL if none.
const tablesLockedPG = `SELECT string_agg(DISTINCT l.relation::regclass::text || ' ' || l.mode ||
	CASE WHEN l.granted THEN ' held by ' ELSE ' awaited by ' END || coalesce('pid ' || l.pid, 'a prepared transaction'), ', ')
FROM pg_catalog.pg_locks l
WHERE l.locktype = 'relation'
	AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
	AND l.relation IN (to_regclass('queue_applied'), to_regclass('queue_balance'))
	AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
	AND l.pid IS DISTINCT FROM pg_backend_pid()`

func (c *Consumer) maxDeliveries() int {
	if c.MaxDeliveries > 0 {
		return c.MaxDeliveries
	}
	return DefaultMaxDeliveries
}

func (c *Consumer) fenced() func(ctx context.Context, db *sql.DB, resource string, token fence.Token, fn func(*sql.Tx) error) error {
	if c.Tx != nil {
		return c.Tx
	}
	return guard.Tx
}

// ack acknowledges entry id; ctx is Run's (see apply), which the lease's
// end does not cancel.
func (c *Consumer) ack(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(c.TxTimeout, DefaultTxTimeout))
	defer cancel()
	_, err := bound.Call(ctx, func() (int64, error) { return c.Redis.XAck(ctx, c.Stream, c.Group, id).Result() }, nil)
	if err != nil {
		return fmt.Errorf("queue: XACK %s: %w", id, err)
	}
	return nil
}

// applyOne applies m in one transaction fenced with token.
func (c *Consumer) applyOne(ctx context.Context, m Message, token fence.Token) error {
	// The transaction runs even if the lease ends meanwhile (ctx is
	// Run's, see apply): a paused consumer does not know that it paused,
	// and the fence must stop it.
	dbCtx, cancel := context.WithTimeout(ctx, cmp.Or(c.TxTimeout, DefaultTxTimeout))
	defer cancel()
	return c.fenced()(dbCtx, c.DB, Resource(c.Stream, m.Key), token, func(tx *sql.Tx) error {
		// A message given up on before (queue_dead) is done; another
		// message under its id is a reused id (see deadAs).
		if err := c.deadAs(dbCtx, tx, m, m.fields); !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		// So is one applied before: the unique constraint on the key makes
		// the INSERT a no-op, known by the rows it affected, which every
		// driver reports (a unique violation's SQLSTATE is not: not every
		// driver's error has a SQLState method, and a layer between may
		// flatten errors).
		// ON CONFLICT without a target runs on a table whose constraint
		// was dropped too, which the fault lab's control and mutation test
		// do; a concurrent insert of the id is waited for, as with a plain
		// INSERT.
		res, err := tx.ExecContext(dbCtx, `INSERT INTO queue_applied (stream, msg_id, entry_id, account, amount, token, consumer)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`, c.Stream, m.Key, m.ID, m.Account, m.Amount, int64(token), c.Name)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if err != nil {
				return err
			}
			// Rolls back. The message is done if the applied row has its
			// account and amount; with others, it is another message
			// under a reused id (reusedError), which must not be dropped
			// as a redelivery. Read after the INSERT, which waited for a
			// concurrent one of the key: this statement sees its commit.
			return c.appliedAs(dbCtx, tx, m)
		}
		// Its failed tries, if any, are counted no more (see giveUp).
		if _, err := tx.ExecContext(dbCtx, `DELETE FROM queue_failures WHERE stream = $1 AND msg_id = $2`, c.Stream, m.Key); err != nil {
			return err
		}
		if _, err := tx.ExecContext(dbCtx, `INSERT INTO queue_balance (account, balance) VALUES ($1, $2)
ON CONFLICT (account) DO UPDATE SET balance = queue_balance.balance + excluded.balance`, m.Account, m.Amount); err != nil {
			return err
		}
		c.pause(BeforeCommit, m, token)
		return nil
	})
}

// quoted is an entry's fields as a dead letter keeps them: the
// producer's bytes, quoted, since PostgreSQL's text holds neither NUL nor
// invalid UTF-8 (see giveUp). fmt prints a map sorted by key.
func quoted(fields map[string]any) string { return fmt.Sprintf("%q", fields) }

// parse returns the message of entry e of stream. If e is malformed, it
// returns an error and a Message holding ID and Key alone: Key is the
// entry's message id if it is valid, else the entry id.
func parse(stream string, e redis.XMessage) (Message, error) {
	m := Message{ID: e.ID, Key: e.ID, fields: quoted(e.Values)}
	if v, ok := e.Values[IDField]; ok {
		id, _ := v.(string)
		if err := checkID(stream, id); err != nil {
			return m, fmt.Errorf("field %s: %w", IDField, err)
		}
		m.Key = id
	}
	account, _ := e.Values["account"].(string)
	s, _ := e.Values["amount"].(string)
	amount, err := strconv.ParseInt(s, 10, 64)
	if account == "" || err != nil {
		return m, fmt.Errorf("want fields account and amount (an integer), got %q", e.Values)
	}
	m.Account, m.Amount = account, amount
	return m, nil
}

// rowQuerier is a *sql.DB or a *sql.Tx: where a look-up runs.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// storable returns s with what PostgreSQL's text cannot hold, NUL and
// bytes that are not UTF-8, escaped as strconv.Quote escapes them.
func storable(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case r == 0:
			b.WriteString(`\x00`)
		default:
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

func (c *Consumer) pause(p Point, m Message, token fence.Token) {
	if c.Pause != nil {
		c.Pause(p, m, token)
	}
}

func (c *Consumer) batch() int {
	if c.Batch > 0 {
		return c.Batch
	}
	return DefaultBatch
}

func (c *Consumer) log() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.Default()
}
