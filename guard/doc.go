// Package guard is the protected resource's side of fencing: it accepts a
// write carrying token t for a resource only if t is greater than the last
// token it accepted for that resource, and rejects it otherwise. A fencing
// token protects nothing until the resource makes this comparison.
//
// The rule is strict: each token may make one fenced write (or one fenced
// transaction) per resource. A worker that must retry a failed write
// acquires a new lease and so a new token; otherwise two writes with one
// token could not be told apart from a stale writer's. The one exception
// is a resend of the accepted call itself (same token, same call id, see
// WithCall): it is answered ErrReplayed, and nothing is written again. Tokens of zero or
// less, malformed tokens and tokens that overflow int64 are rejected with
// ErrInvalidToken, never coerced.
//
// The guard works without any fence lock: anything that hands out
// increasing numbers per resource can use it.
//
// A nil ctx is bad input, as for fence's Lockers: every call of guard and
// redisstore that takes a ctx and returns an error returns one matching
// fence.ErrInvalidOption for it, naming the call, before it touches the
// database or Redis. CallFrom and TxFrom read a nil ctx as one that
// carries nothing.
//
// # The fenced read-modify-write
//
// The token orders writers; it does not validate what a writer read. A
// worker that read before a newer holder wrote can still act on that stale
// read if it writes first, so the read must come after the fence, inside the
// fenced transaction, where a newer holder's fence waits for it or makes it
// fail:
//
//	err := guard.Tx(ctx, db, "payment:1001", lease.Token(), func(tx *sql.Tx) error {
//		// read through tx, decide, write through tx
//	})
//
// The conditional update alone (UPDATE … WHERE token_column < $token, with
// the row read before), the remedy of the article fence grew out of ("Having
// the lock does not always make you safe"; see the README), does not do
// this: A reads PENDING and pauses, B reads PENDING, A writes first and its
// token is accepted, then B writes and its greater token is accepted too. If a single statement is
// the whole read-modify-write, the conditional update may instead carry the
// precondition it read (… AND status = 'PENDING').
//
// # SQL
//
// Through database/sql, tested on PostgreSQL (pgx's stdlib driver) and
// SQLite (modernc.org/sqlite):
//
//   - Table.Update: the conditional update, for tables that carry a token
//     column: UPDATE … WHERE key = $1 AND token_column < $2, telling a stale
//     token (ErrStale) from a missing row (ErrNoRow).
//   - Tx and Fence: a fenced transaction that needs no new column in
//     business tables. The fence_tokens row of the resource is upserted with
//     the token first in the transaction; if a greater or equal token is
//     already there, nothing is written and the transaction rolls back.
//     The upsert also locks the row, so fenced transactions on one resource
//     run one at a time. The fence commits or rolls back with the work: an
//     attempt that rolls back (its caller gone, ErrRetry, a crash) wrote
//     nothing and retires no token, so an older holder's later write is
//     still accepted if no greater token committed (the DESIGN's rule;
//     the work's own precondition, such as status = 'PENDING', is what
//     keeps it from doing the work twice).
//     On PostgreSQL the fenced transaction commits durably even under
//     synchronous_commit off (local for it), as do Table.Update and
//     Once: a fence lost in a crash after its commit was acknowledged
//     let an older token in. fn must not turn it off again (SET LOCAL
//     synchronous_commit = off): the commit follows the last setting.
//     ErrRetry reports a serialization failure, deadlock, lock timeout or
//     SQLITE_BUSY: nothing was written; retry with a new lease. For SQLite, open the
//     database with SQLiteDSN (WAL, busy timeout, BEGIN IMMEDIATE).
//   - Once: idempotency keys on a unique constraint.
//   - Table.UpdateVersion: an optimistic version check.
//
// # Conditional update, unique constraint or pessimistic lock
//
// When everything the work touches lives in one database, that database can
// hold the state itself, with or without a fence lock in front:
//
//   - A conditional update (UPDATE … WHERE status = 'PENDING', or
//     Table.Update's token column) when one statement is the whole
//     read-modify-write: stock counts, state transitions.
//   - A unique constraint (Once) when the danger is doing a thing twice:
//     creating a duplicate, applying a message again.
//   - An optimistic version check (Table.UpdateVersion) when conflicts are
//     rare and the transaction may be long: the loser retries.
//   - A pessimistic lock, SELECT … FOR UPDATE, when conflicts are frequent
//     and the transaction short: the second writer waits instead of
//     failing.
//
// Inside Tx the pessimistic lock is the plain statement, through tx:
//
//	err := guard.Tx(ctx, db, "payment:1001", lease.Token(), func(tx *sql.Tx) error {
//		var status string
//		if err := tx.QueryRowContext(ctx, `SELECT status FROM payment WHERE id = $1 FOR UPDATE`, 1001).Scan(&status); err != nil {
//			return err
//		}
//		// decide on status, write through tx
//	})
//
// Tx's fence already locks the resource's fence_tokens row, so fenced
// transactions on one resource run one at a time; FOR UPDATE adds the lock
// on the business rows, against writers that do not go through the fence
// (other services, other resources' transactions touching the same rows).
// SQLite has no FOR UPDATE: with SQLiteDSN every transaction begins
// IMMEDIATE and holds the database's write lock, which serializes it anyway.
// guard has no helper for it: one would add nothing to tx.QueryRowContext.
// A fence lock and its token are for work that leaves the database (a
// remote API, a file, another store), or that must not even start twice.
//
// # HTTP
//
// Middleware runs a handler only if the request's Fence-Token is greater
// than the last token accepted for the resource the server chooses from
// the request (HTTPOptions.Resource; the client's Fence-Resource header is
// used only with ResourceFromHeader), and it orders that check with the
// handler's writes: with SQLStore the handler runs inside the fenced
// transaction (TxFrom) and its answer is held until the commit, so a
// request with an older token cannot write after a newer one; with
// MemoryStore one resource's requests run one at a time. It reads the
// request body (up to HTTPOptions.MaxBody, 1 MiB by default) before the
// store's hold begins, so that a client that sends its body slowly cannot
// hold the transaction (on SQLite, the database's write lock) open. It does
// not fence writes the handler makes elsewhere (another database, a remote
// API), and MemoryStore cannot undo a failed handler's writes.
//
// Gate is a gate only: it checks the token when the request arrives
// (redisstore.Store can do no more), and two admitted handlers can still write
// in the wrong order.
//
// Both refuse tokens more than an hour ahead of the clock in microseconds
// (HTTPOptions.MaxAhead), so a forged token cannot block a resource whose
// tokens are clock-floored (redislock's) for more than that hour; against
// counter tokens (memlock's) a forged token near the clock still blocks it
// for good, so only trusted clients should send tokens. They keep their
// tokens under the "http:" namespace, apart from Tx's.
// They answer 400 (invalid), 409 (stale) or 503 (store failed), and
// Middleware 413 (body too large), with a generic application/problem+json
// body and log the cause with log/slog. Two 503s have a type of their own,
// and ask the client to acquire a new lease and send the request again
// with its token: ProblemStoreLost, a token issued before the store's
// state began (ErrStoreLost: redisstore.Store with ClockTokens, after its
// Redis lost its records), and ProblemNotReplicated, a token the store
// recorded on its primary but could not confirm on its replicas
// (fence.ErrNotReplicated: redisstore.Store with Replicas). The token
// stays spent; a resend of that call (same token and call id) never ran,
// and is answered ProblemNotReplicated again, not ProblemAdmitted (see
// redisstore.Store.Replicas for the rare cases where it is answered
// ProblemAdmitted: false, but nothing runs).
//
// Transport attaches a lease's token to outgoing requests, with a random
// call id (the Fence-Call header) that net/http's own resends of the
// request keep. The stores record the call id beside the last accepted
// token (WithCall), so that a resend of a call that was applied (same
// token, same call id, same method, target and body) is answered 200 by
// Middleware with Fence-Replayed: true, the work not done again, instead of
// 409 stale; Gate, which cannot know whether its handler succeeded, answers
// it 409 with Fence-Replayed: admitted (ProblemAdmitted). A different call
// id, or another request under the same id, with the same token is stale,
// as the rule says. A redirect that http.Client follows is part of the
// same call: Transport sends the follow-up with the first request's call
// id and the ids the stores recorded it under (the RecordedCallHeader
// list, to which Middleware adds its id on a committed redirect and Gate
// on an admitted call's answer, one id a layer: Gate in front of
// Middleware, in one process or through a reverse proxy, gives two), so
// that a POST answered 303 after its write, followed by a GET to a page
// fenced on the same resource, returns Middleware's 200 with
// Fence-Replayed: true (Gate's 409 admitted), not 409 stale for a write
// that committed: each layer finds the follow-up the call if its store
// recorded any one of the listed ids with the request's token. To see the
// redirect's page itself, set the Client's CheckRedirect to return
// http.ErrUseLastResponse and send a request of its own. SQLStore keeps the call id in
// fence_tokens' call_id column: CreateTables adds it to a table made
// before (see CreateTables; the README gives the statement for a schema
// managed by hand).
package guard
