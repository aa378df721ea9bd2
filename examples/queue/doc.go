// Package queue is the article's last answer, the single consumer of a
// queue: a work queue on a Redis stream whose one active consumer is chosen
// by fence.Lead, with an idempotent consumer in PostgreSQL behind it.
//
// Each message (fields account and amount) adds amount to the account's
// balance. Its effect is applied in one transaction, guard.Tx, fenced on the
// guard resource queue:<stream>:<message id> with the leader's token: the
// fence first, then the message id is inserted into queue_applied (primary
// key stream and id: the unique constraint that makes a redelivered message
// a no-op), then the balance is updated, then the commit. XACK comes only
// after the commit, or after the constraint found the message applied
// already; a message whose transaction failed stays pending.
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
// behind it: when its transaction fails on delivery MaxDeliveries
// (XPENDING's delivery count), the consumer records it in queue_dead, in a
// transaction fenced like the effect's, and acknowledges it. A message is
// then done once: applied (queue_applied) or given up on (queue_dead, where
// a malformed entry, without an account or an integer amount, goes at once). A
// failure that also stops that write, the database being down, leaves the
// message pending.
//
// A redelivered message is known by the INSERT into queue_applied (ON
// CONFLICT DO NOTHING) affecting no row, not by a driver's error code, so
// any database/sql driver for PostgreSQL will do.
//
// cmd/queued runs a consumer, or produces messages.
package queue
