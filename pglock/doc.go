// Package pglock implements fence.Locker on PostgreSQL, for teams that have
// a database and no Redis. It talks to the database through the caller's
// *sql.DB (any driver: pgx's stdlib, lib/pq), so that the fence module
// requires no PostgreSQL driver.
//
// # Schema
//
// One lease table (default "fence_leases", Options.Table) and one sequence,
// created by Locker.EnsureSchema or by a migration running Schema's SQL:
//
//	CREATE SEQUENCE IF NOT EXISTS fence_leases_token AS bigint MINVALUE 1 NO CYCLE;
//	CREATE TABLE IF NOT EXISTS fence_leases (
//		name       text PRIMARY KEY,
//		owner      text NOT NULL,
//		token      bigint NOT NULL,
//		expires_at timestamptz NOT NULL
//	);
//
// A lock is one row, kept for good once created: a release frees the row
// (empty owner, expired) rather than delete it, so one row per lock name
// ever used stays in the table.
//
// # Tokens
//
// A token is the greatest of three: the next value of the sequence, which
// never cycles (at its end, acquisitions fail rather than repeat a token)
// and is shared by every name; the database's clock in microseconds; and
// the row's last token plus one. It is drawn as the row is updated under
// its row lock, so the tokens of one name increase in the order the lock
// was granted, even if the clock steps back or the sequence was given a
// CACHE (each session then draws from a block of its own, so nextval alone
// does not increase across sessions in time order). The clock keeps them
// increasing when the counters are lost: a sequence restarted, or dropped
// and created again with the table (a migration rerun), or the table
// emptied, as long as the database's clock has not gone back past the last
// token issued. A crash does not lose a grant or a renewal that was
// acknowledged: their transactions commit durably even where
// synchronous_commit is off (it becomes local for them, at the cost of a
// WAL flush each), since a grant lost so would let the lock be granted
// again inside its holder's lease. Tokens are so about the
// Unix time in microseconds, as redislock's are, rather than small counts,
// and two names may be granted the same token; ordered is only each
// name's. A name whose last token is the bigint maximum fails with
// ErrTokensExhausted.
//
// # Time
//
// Whether a lease has expired is judged by the database's clock
// (clock_timestamp()), never by a client's: a lease is granted, renewed and
// taken over by comparing expires_at with the database's time in the same
// statement. A holder considers its lease valid until a local deadline
// measured from before its request was sent, less 1% and 2 ms for the two
// clocks' rates, as redislock does. A try that took the lock but whose
// reply came after that deadline (a stalled backend, a statement that
// waited on the row's lock) gives no lease, which would be over before
// anyone used it: the row is given back (owner-checked) and Acquire tries
// again as a new owner within its wait budget, or fails with
// fence.ErrNotAcquired saying the reply came too late.
//
// # Waiting
//
// A caller that finds the lock held and has a wait budget sends no query
// while the holder's lease lives: the database tells it how long the lease
// has left, and it tries again when that time is up or when a release's
// NOTIFY arrives, whichever is first. Release notifies on the channel named
// after the table, with the lock's name as payload. database/sql cannot
// LISTEN, so notifications come through Options.Listener, which the caller
// implements on its driver. A Locker listens on one connection while any of
// its Acquires waits, and shares it among them; with pgx:
//
//	type pgxListener struct{ dsn string }
//
//	func (p pgxListener) Listen(ctx context.Context, channel string) (<-chan string, error) {
//		conn, err := pgx.Connect(ctx, p.dsn)
//		if err != nil {
//			return nil, err
//		}
//		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
//			conn.Close(context.Background())
//			return nil, err
//		}
//		ch := make(chan string)
//		go func() {
//			defer close(ch)
//			defer conn.Close(context.Background())
//			for {
//				n, err := conn.WaitForNotification(ctx)
//				if err != nil {
//					return
//				}
//				select {
//				case ch <- n.Payload:
//				case <-ctx.Done():
//					return
//				}
//			}
//		}()
//		return ch, nil
//	}
//
// Listen on a connection of its own, as above, not one taken from the
// Locker's *sql.DB: that connection is held as long as anyone waits, and in
// a pool bounded by SetMaxOpenConns it would starve the watchdogs, whose
// leases would then be lost. A Listener that stops at once each time is
// listened to again after a growing back-off; one that never returns is
// left behind when the waiter's budget ends.
//
// Without a Listener a waiter still sends nothing while the holder lives,
// but it learns of a release only when the released lease would have
// expired. A lock deleted by hand (DELETE FROM fence_leases …) notifies
// nobody either; its waiters take it at the old holder's expiry.
//
// A try is one statement on the lock's row, which waits for the row's lock
// like any UPDATE. pglock's own statements hold it for one statement, but
// a transaction left open on the row (someone's SELECT … FOR UPDATE on the
// table, a session stopped mid-transaction) holds it until it ends. An
// Acquire with a wait budget gives up its try when the budget ends
// (ErrNotAcquired); one without (try once) waits for that transaction as
// long as its ctx allows, and then fails with ctx's error: give it a
// deadline (TestTryOnceBlockedOnRowLock). A statement_timeout or
// lock_timeout on the role bounds it too. (Skipping a locked row, FOR
// UPDATE SKIP LOCKED, would answer at once, but made Releases fail with
// serialization errors under SERIALIZABLE.)
//
// # Leases
//
// A lease without fence.TTL is renewed by a watchdog every third of
// Options.WatchdogTTL; one that could not be renewed before its deadline,
// or whose row was taken over, removed or had expired, ends with an error
// matching fence.ErrLeaseLost, and so does one whose renewal found the
// *sql.DB closed, at once (matching fence.ErrClosed too, on which
// fence.Lead stops at once). Neither a renewal nor an acquisition of a
// row the attempt already owns moves a live row's expiry earlier (greatest):
// one held up on its way, or resent, after an Extend with a longer lease
// would cut it below the holder's Deadline. Release frees the row only if this lease
// still owns it and it has not expired; a Release that fails ends the lease
// locally all the same (its watchdog stops, the row expires within its
// TTL), and calling it again retries. When the token sequence is
// exhausted, Acquire fails at once with ErrTokensExhausted. Every call sends its statements
// with the caller's context, so a database that is down or unreachable
// fails the call by the caller's deadline; so does a Release or an Extend
// that waits for a renewal under way (an Extend with a farther deadline, or
// the watchdog's, hung on the database): a Release that gives up so ends
// the lease all the same and frees the row in the background, bounded by
// two seconds, once that renewal is done, or after two seconds without it
// (a driver that does not give up the renewal's statement): that
// background work ends within four seconds whatever the database does. A
// renewal's statement ends with the lease, whatever its ctx: an Extend
// under way when the lease ends (a Release, its deadline) returns then
// with the lease's end, so a Release that gave up is not held up for as
// long as the database hangs. An Acquire whose statement's outcome is
// unknown (the connection broke, ctx ended) frees its row, if it was
// granted after all, in the background, with a statement bounded to two
// seconds; a later try of the same Acquire is granted a row it already
// owns. The abandoned statement may yet run after that free: a stalled
// backend reads it from its socket once it resumes (the driver's cancel,
// reaching it idle, is ignored), a blocked one runs it once the row lock
// is released; it would hold the lock, for an Acquire that returned an
// error, until its lease expired. With pgx's stdlib driver (or a wrapper
// embedding its *stdlib.Conn), whose connections know their backend's PID,
// each try runs on a connection taken for it (sql.DB.Conn), and when the
// driver has closed that connection, the background work first terminates
// its backend (pg_terminate_backend, run as the session user, so that a
// session that set another role still may: allowed on backends of one's
// own login role; only a client backend of this database whose client
// port is the connection's, so that a backend behind a proxy such as
// pgbouncer, whose PID the proxy made up, is left alone, and that started
// before the connection was known open, so that one that took the PID
// since, over a Unix socket where every port is -1, is left alone too)
// and waits, two seconds at most, for
// it to go, then frees the row: what the backend committed before it went
// is freed, and a backend told to terminate runs no statement further, even
// one it reads as it resumes (a statement it was committing as it stalled,
// if it stays stalled past the wait, is the exception). That background
// work ends within four seconds. Without the right to terminate, behind a proxy, with other
// drivers (lib/pq does not tell the PID without a round trip), and on
// PostgreSQL before 14 for a statement caught committing (the backend is
// signalled, not waited for), only the free runs, as it did before; when
// no new connection can be had within the bound (a role at its connection
// limit, whose slot the stalled backend still holds; a pool kept busy),
// neither does. The backends of an Acquire's
// earlier tries, when a later one takes the lock, are signalled the same
// way, not waited for, before Acquire returns the lease, so that none of
// them can take the row back after the lease's Release; if they cannot be
// signalled within the Acquire's ctx (and two seconds), no lease is
// returned: the row is given back as above, and the Acquire goes on as a
// new owner within its Wait budget, or fails. Likewise a renewal whose outcome is unknown may have moved the
// row's expiry and not the lease's Deadline (so may one whose answer came
// after the lease had ended): if the lease then ends unreleased, or by a
// Release that failed, its row, if still its own, is freed in the
// background. A Release after the lease ended frees the row if it is still
// the lease's, with a statement bounded to two seconds, and returns the
// lease's error.
//
// Locker methods and leases are safe for concurrent use.
package pglock
