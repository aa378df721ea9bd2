// Package queue is the article's last answer, the single consumer of a
// queue: a work queue on a Redis stream whose one active consumer is chosen
// by fence.Lead, with an idempotent consumer in PostgreSQL behind it.
//
// Each message (fields msg_id, account and amount) adds amount to the
// account's balance. Its effect is applied in one transaction, guard.Tx,
// fenced on the guard resource queue:<stream>:<message id> with the
// leader's token: the fence first, then the message id is inserted into
// queue_applied (primary key stream and message id: the unique constraint
// that makes a redelivered message a no-op), then the balance is updated,
// then the commit. XACK comes only after the commit, or after the
// constraint found the message applied already; a message whose
// transaction failed stays pending. After each batch the leader trims the
// stream, in one script, below the first entry that any group of it still
// needs (its first pending entry, or the one after its last delivered), so
// that acknowledged messages do not fill Redis; Consumer.KeepEntries keeps
// them for replays.
//
// The consumer's trim never passes a group's first pending entry; others
// can: a producer's XADD with MAXLEN or MINID, an operator's XTRIM or
// XDEL. An entry trimmed while pending, read by a leader that had not
// applied it when it was deposed, loses its content (account, amount and
// message id are its fields) with it. Such entries are not silently lost:
// the next XAUTOCLAIM (which, from Redis 7, reports them apart and takes
// them off the pending list) puts their ids in a set beside the stream,
// {<stream>}:trimmed:<group>, in the same script, and the consumer records
// each in queue_dead under its entry id, with an error saying that it was
// trimmed before it was applied, logs it "dead" at ERROR, and only then
// takes it out of the set. An entry that was applied and trimmed before
// its XACK is found in queue_applied by its entry id, and not recorded. A
// deposed leader that read such an entry before the trim may still apply
// it, under its message id, which the record cannot fence (it is gone):
// before acting on the dead letter of a trimmed entry, look its entry id
// up in queue_applied. Bound a stream with the consumer's trim (the
// default), not MAXLEN. A consumer whose Redis user may not run that
// script (or SADD, SMEMBERS and SREM in it) claims with a plain
// XAUTOCLAIM instead, and logs once, at ERROR, that such entries will be
// lost without a record (LogUnrecorded).
//
// Entries deleted before the group read them were never pending, and no
// XAUTOCLAIM tells of them, nor which ids they were. Before each
// XREADGROUP the consumer compares, in a script, the stream's XINFO with
// the group's (see unreadScript in trimmed.go): an XDEL past the group's
// last delivered entry, or a trim that took entries the group had not
// counted as read, is logged at ERROR (LogUnread) with the ids that bound
// them and, for a trim, how many; once, the id up to which it told kept
// in {<stream>}:unread:<group>. Their messages are lost: Redis kept
// nothing of them. A consumer whose Redis user may not run that script
// (XINFO, or GET and SET on that key) tells of none, and logs so once, at
// ERROR (LogUnreadUnchecked). A deletion between that look and the read goes
// unseen, and a trim's count needs Redis to know the group's entries-read
// and no XDEL ever on the stream. The consumer creates its group with
// ENTRIESREAD 0, so that Redis counts what it reads; Redis does not know
// the count of a group created or moved (XGROUP CREATE or SETID) without
// ENTRIESREAD, by hand or for a replay, until the group reads, and the
// first entry it then reads has Redis count those trimmed before it as
// read: a trim in between is never told (nor is a replay taken for a
// loss: TestReplayFromStartNotTakenForUnread). A group the consumer
// creates on a stream already trimmed (its group destroyed by hand, say)
// tells the entries deleted before it as lost, once. The log is a
// warning, not an account.
//
// # Message ids
//
// The message id is the producer's, written in the entry (IDField): Produce
// makes a random one (16 bytes from crypto/rand, in hex), ProduceID takes
// the caller's own idempotency key ("payment:1001:approve"), so that a
// caller retrying after an error that left unknown whether the message was
// appended enqueues one effect however many entries it made. ProduceID
// refuses, with ErrInvalidID and before appending anything, an id that is
// empty, longer than MaxIDLen, not UTF-8, holds a control character (NUL
// among them) or a brace (the id names the guard resource), leaves the
// resource longer than fence.MaxNameLen, or has the form of a stream entry
// id (see below). Ids may hold ':'; stream names may not: Produce,
// ProduceID and Consumer.Run refuse them with fence.ErrInvalidName, since
// the message "eu:42" of stream "orders" and the message "42" of a stream
// "orders:eu" would otherwise fence on one guard resource with the tokens
// of two unrelated locks. A deployment whose stream's name holds ':'
// renames it (RENAME keeps the group and its pending entries) once the
// stream is drained: queue_applied is keyed by the stream's name, so an
// entry pending across the rename would be applied again, and so would a
// message that a caller's ProduceID retry sends to the new name after it
// was applied under the old one.
//
// The stream entry id is not the key: it is unique only within one life of
// the stream. A stream that Redis lost and started over (deleted, a restart
// without persistence, a failover to a replica whose machine's clock is
// behind, since XADD's ids follow the server's clock) can give a new
// message the id of an old applied one, which would then be taken for it
// (or, with another account or amount, given up on as a reused id; see
// below).
//
// An entry without msg_id (written by an older Produce, or by hand with
// XADD) falls back to its stream entry id as its key, as every entry did
// before message ids, and keeps that risk; the ids of that form are why
// ProduceID refuses ids that look like entry ids (digits, '-', digits): the
// two kinds of key never meet. An entry whose msg_id is not a valid id is
// malformed (below), and given up on under its entry id. queue_applied and
// queue_dead record the entry id beside the key (entry_id); CreateSchema
// adds that column to a database created before message ids, whose rows
// keep it NULL (their msg_id is the entry id, the key they had and still
// have).
//
// One id is one message: a retry carries the same account and amount. A
// message whose id was applied with another account or amount (a producer
// whose counter of ids started over, say) is not a redelivery: the
// consumer, finding the id applied, compares the applied row's account and
// amount with the message's, and if they differ gives the message up on:
// queue_dead, with an error that names both, logged "dead" at ERROR, and
// acknowledged; the applied message keeps the id. Its dead letter's key
// is the id followed by "{reused:", a hash of the account and amount, and
// "}" (braces, which no message key holds), so that each content reusing
// an id has one dead letter: a retry of it, or a replay of the stream,
// finds its dead letter, is logged as a duplicate and acknowledged,
// neither applied nor recorded again. To apply such a message, produce it
// again under an id of its own: under the reused id it is only ever given
// up on (with its dead letter deleted first, recorded again). An id
// given up on (queue_dead) is done as well: a message under it whose
// fields differ from the dead one's (kept quoted in queue_dead.fields) is
// given up on as a reused id the same way, and one with the same fields
// is a retry, a duplicate. Of two
// messages sharing an id, the one applied is the one the consumer reaches
// first: the first produced, unless its transaction failed meanwhile and
// the other came through. queue_applied has held every message's account and amount from
// the start, so every row is compared, old ones included (their entry_id,
// NULL, is their key). A malformed entry whose id was applied has no
// account and amount to compare, and is taken for a redelivery.
//
// Upgrade the consumers before the producers. A consumer from before
// message ids keys every entry by its entry id; one that applied an entry
// carrying msg_id and stopped before XACK leaves a row the new consumer,
// which claims the entry and keys it by msg_id, does not find: the message
// would be applied twice. With the consumers upgraded first, every entry
// without msg_id is keyed by its entry id on both sides of the upgrade, and
// entries with msg_id are only ever seen by new consumers.
//
// # Hand-over
//
// The consumers of a group all run Consumer.Run; fence.Lead lets one of
// them read at a time. A new leader first takes over every entry still
// pending (the deposed leader's unacknowledged messages) with XAUTOCLAIM
// and min-idle 0, in the stream's order, before it reads new ones: whoever
// read them no longer holds the lease, so there is nothing to wait for, and
// waiting would apply them after newer messages.
//
// During its term the leader claims, every round, the entries idle for
// MinIdle (default the lease time): entries that a deposed leader read
// after the term began (it checked its lease, then paused before reading),
// or that another process read from the group without leading. Those, and
// those alone, are applied out of the stream's order. MinIdle gives such a
// reader the time to finish what it started; any value is safe, since the
// fence and the unique constraint apply each message once.
//
// A leader that pauses (a GC, SIGSTOP, a slow disk) does not know it paused:
// when it wakes, its lease may have gone to another consumer, which may have
// claimed the message it was about to apply and applied it with a greater
// token. Its late transaction is then rejected by the fence (guard.ErrStale)
// and it acknowledges nothing. Before each message the consumer also checks
// that its lease is still valid (its context and Deadline), so that it
// stops once it knows it was deposed; the fence covers the moment between
// that check and the commit. Whatever the interleaving, each message is
// applied once: the fence decides between a deposed leader's late
// transaction and the new leader's, and the unique constraint makes the
// other a no-op.
//
// A leader paused inside its transaction, after the fence, holds the
// message's fence row, and a new leader that claimed the message waits for
// that transaction. PostgreSQL ends it after
// idle_in_transaction_session_timeout (cmd/queued sets it to the lease
// time): the new leader then applies the message, and the paused leader's
// commit fails when it wakes. Without that timeout the new leader waits
// until the old one wakes and commits, then finds the message applied: once
// still, but the queue stands still for the pause.
//
// A message whose transaction fails ends the term: the lease is released,
// and the next term, after fence.Lead's back-off (growing with each failure
// in a row), claims it again. A message that always fails (its amount
// overflows the balance) would end every term and hold back every message
// behind it: when its transaction fails for the MaxDeliveries-th time
// (its failures counted in queue_failures, in a transaction fenced like the
// effect's: not XPENDING's delivery count, which also counts the
// deliveries of the messages behind a failing one in its batch, claimed
// again each term without being tried), the consumer records it in
// queue_dead, in that transaction, and acknowledges it. A message is
// then done once: applied (queue_applied) or given up on (queue_dead, where
// a malformed entry, without an account or an integer amount, or with an
// invalid msg_id, goes at once). A
// failure that also stops that write, the database being down, leaves the
// message pending, uncounted; so does one that came while another session
// held a lock on queue_applied or queue_balance that the message's
// transaction needs (maintenance: ALTER TABLE, VACUUM FULL, CREATE INDEX
// without CONCURRENTLY), which the consumer looks for in pg_locks before it
// counts (needing no privilege on the tables): the message is applied once
// the lock is gone.
// A lock on one message's own row (a session idle in its transaction) is
// not the tables' lock: that message's failures count, and it is given up
// on rather than stall the queue.
//
// A redelivered message is known by the INSERT into queue_applied (ON
// CONFLICT DO NOTHING) affecting no row, not by a driver's error code, so
// any database/sql driver for PostgreSQL will do. guard accepts a token
// once per resource: a message done earlier in the same term (another
// entry with its id, a redelivery, a commit whose reply was lost) has its
// fence refused with the leader's own token, and is then found done and
// acknowledged, the term going on; a refusal by a greater token ends it.
//
// cmd/queued runs a consumer, or produces messages.
package queue
