// Package pgdurable holds the SQL condition with which pglock's grants and
// renewals, and the guard's fences, commit durably on PostgreSQL whatever
// the session's synchronous_commit.
package pgdurable

// Commit is a condition, always true, that makes the transaction it runs in
// commit durably (its WAL flushed before the reply) when the session's
// synchronous_commit is off (a server's, role's or database's tuning): a
// grant, renewal or fence acknowledged and then lost in a crash of the
// server is gone after the recovery, while its holder was told it went
// through, and another holder's lock or older token is then taken
// (pglock's TestGrantSurvivesCrashUnderAsyncCommit, the guard's
// TestFenceSurvivesCrashUnderAsyncCommit). set_config's local setting lasts
// until the transaction ends: the pool's session keeps its own. "local"
// flushes the WAL on this server and waits for no standby; any other
// setting already flushes it and is kept. In a WHERE clause it is
// evaluated for every row the statement changes, as a condition of the
// change.
const Commit = `set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'local' ELSE current_setting('synchronous_commit') END, true) IS NOT NULL`
