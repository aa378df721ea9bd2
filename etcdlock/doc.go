// Package etcdlock implements fence.Locker on etcd v3, through the caller's
// go.etcd.io/etcd/client/v3 client. It is a module of its own, so that users
// of the Redis lock do not get gRPC and etcd in their builds.
//
// etcd is the consensus row of the article's table: a lock granted by a
// Raft quorum survives the loss of any minority of members, at the cost of
// running a cluster. Consensus alone does not stop a paused holder from
// writing after its lease has expired, though: Jepsen's analysis of etcd
// 3.4.3 found that locks alone lost about 18% of acknowledged updates under
// process pauses, and recommended the lock key's revision as a fencing
// token. etcdlock makes that the token.
//
// # Keys and tokens
//
// The lock called N under the prefix P (default "fence/") is the set of
// keys P + N + "/" + <etcd lease ID in hexadecimal> ("/" and "%" in N are
// escaped as %2F and %25, so that lock "a" never sees the keys of lock
// "a/b"). A key with a "/" after a lock's prefix is another Locker's, whose
// Prefix nests under it ("app/" and "app/jobs/"), and is no contender. Each Acquire creates its own key, attached to its own etcd lease,
// and holds the lock when its key is the oldest, the one with the smallest
// create revision: etcd's own concurrency.Mutex scheme. The key's create
// revision is the lease's fence.Token. Revisions are etcd's global write
// counter: they only grow, across leader elections and restarts from the
// data dir, and a key created later has a greater one, so each holder's
// token is greater than every earlier holder's.
//
// Revisions do not survive a restore from a backup, which takes them back
// to the backup's revision: restored with etcdutl snapshot restore alone,
// the next holder's token was 4 after 12 had been issued since the
// backup, and a resource refuses the new holder (or, if its record was
// restored too, accepts a stale one). Restore every member with etcdutl
// snapshot restore --bump-revision N --mark-compacted instead, N at least
// the writes made since the backup (the highest revision the cluster
// reached, less the backup's, which etcdutl snapshot status shows): the
// next token is then above every token issued (with N 2 short of that, it
// was 12 again, a token already issued). After a disk loss the highest
// revision is unknown, and the tokens the resources recorded leave out
// those of holders that had not written yet, so take N far above any
// number of writes the cluster can have made since the backup, such as
// 1e9. A large N costs nothing measurable: the restore and start took
// under a second with 1e9 as with none (etcd compacts the revisions the
// snapshot holds, not those skipped), and revisions are 64-bit. What
// --mark-compacted costs is the history: reads and watches at revisions
// from before the restore fail as compacted (etcdlock's holders and
// waiters read again and go on). Locks held when the backup was taken
// come back held: by their holder if it still holds them, else by nobody
// until their etcd lease expires, a lease time after the restore, or
// until the Locker that released them reuses that etcd lease (kept, see
// below), which deletes the key first (it used to take the key for its
// own, with the old revision as its token: 2 after 12, whatever the
// bump; and so did one whose first create Txn failed unapplied, with
// Unavailable, and whose retry found the key: a key on the etcd lease
// created at or before its last key, or its Grant, is not taken). Holders and waiters whose keys were made after the backup lose
// their lease (fence.ErrLeaseLost).
//
// A resource that lives in etcd itself can do better than compare tokens:
// a Txn guarded by IsOwner writes only while the lease's key still exists as
// created, whatever the writer's clock or pauses.
//
// # One etcd lease per fence lease, kept for the next
//
// Each lock is held on an etcd lease of its own rather than on one session
// per Locker, as concurrency.Session does. That buys: fence.TTL and Extend
// map onto the etcd lease of that one lock; a lease that is lost (revoked,
// expired behind a pause, its keep-alives cut off) loses one lock, not
// every lock of the process, and Done stays per lock without a lease loss
// having to be fanned out to every lock on a shared session.
//
// Granting an etcd lease per Acquire and revoking it on Release would cost
// two Raft commits more per lock than the Mutex on a reused session. So a
// Release whose own delete went through keeps the etcd lease, which holds
// no key any more, for the Locker's next Acquire of the same lease time,
// as a pool of concurrency.Sessions would: the lock then takes two commits,
// the key's create and its delete, as the Mutex's does. This is safe
// because the kept etcd lease grants nothing (its key is gone; the next
// key on it gets a new create revision, a greater token; the ended Lease
// never uses it again) and because its age is counted: it is reused only
// while it has nine tenths of its lease time left (granted or renewed less
// than a tenth of it ago), and the new lease's Deadline is measured from
// when that grant or renewal was sent, as for a fresh grant. One revoked
// behind the Locker's back makes the create Txn fail having written
// nothing, and Acquire grants a new one. A Locker keeps at most 64 (one
// per lock it holds at once); one found too old is revoked in the
// background (Close waits for that), and Close revokes those kept. Lost
// leases, failed Releases and failed Acquires still revoke theirs at once,
// so that the next in line moves up. So does a lock whose create Txn had
// an attempt time out: that attempt may yet be applied, late (it sat in a
// member that hung), and once the key is deleted its Compare holds again:
// on a kept etcd lease its Put would leave an orphan key that holds the
// lock for nobody; on a revoked one it fails.
//
// etcd counts lease times in whole seconds and raises short ones to its
// minimum (1.5 × the election timeout: 1.5 s by default), so the etcd lease
// may outlive the fence lease; the Deadline is measured from the time asked
// for, from before the request was sent, less 1% and 2 ms for clock drift.
// At the deadline a lease that was not renewed ends (Done is closed, Err
// matches fence.ErrLeaseLost) and its etcd lease is revoked, so the next in
// line does not wait for etcd's longer expiry. An Acquire whose create
// Txn (or wait in line) answered after that deadline, counted from the etcd
// lease's grant or last renewal (a stalled member, replies lost and sent
// again), gives no lease, which would be over before anyone used it: it
// revokes the etcd lease (the key goes, the lock is free) and tries again
// on a new one, after a back-off, within its wait budget, or fails with
// fence.ErrNotAcquired saying the reply came too late. The wait budget
// bounds that try again, its Grant and create Txn included, and the
// revoke that gives the late take back (as every give-back of an Acquire
// with a budget: see below), though that revoke is waited for, within
// ctx, a quarter second after the late reply at least (as in redislock:
// the key holds the lock for nobody until it is through); only the first
// try runs on ctx alone, so that an uncontended Acquire with a budget
// costs what one without does, and it sends nothing once the budget has
// ended (see Deadlines and hanging members).
//
// Without fence.TTL a watchdog renews the etcd lease (KeepAliveOnce) every
// third of Options.WatchdogTTL, and reads the key with each renewal; a
// renewal that finds the etcd lease or the key gone ends the lease at once,
// others are retried until the deadline. With
// fence.TTL nothing renews it. etcd cannot change a lease's TTL, so Extend
// grants a new etcd lease and moves the key onto it in a Txn that holds
// only while the key is still the one created at the token (the create
// revision, and so the token, does not change), then revokes the old one.
// An Extend that shortens the lease holds its Deadline to the new lease
// time from the Grant's send until the move is settled: applied with its
// reply lost, or late, the move puts the key on the shorter etcd lease,
// which etcd deletes by then, whatever renews the old one meanwhile.
//
// A lease also ends (ErrLeaseLost, and fence.ErrClosed, on which
// fence.Lead stops at once) when the user closes the client: nothing can
// renew its etcd lease or watch its key any more. Its key stays in etcd
// until the etcd lease expires.
//
// The key is watched from its creation: a delete (the etcd lease expired or
// was revoked, an operator ran etcdctl del) ends the lease at once, not at
// the next renewal (which also reads the key, for a watch that sits on a
// member that hangs; a lease of fence.TTL, never renewed, then ends at its
// deadline). The watch, and the goroutine that keeps the lease, start
// 10 ms after the grant (sooner if its deadline or first renewal comes
// first): a lock released within that pays for neither, and a delete in
// its first 10 ms ends the lease when the watch starts, reading from the
// key's creation, so no later than 10 ms after the grant. The token guards
// the resource meanwhile, as it does after any check.
//
// # Waiting
//
// A caller that finds the lock held and has a wait budget keeps its key
// and watches only the key created just before its own (the greatest create
// revision below its own), from the revision it read it at (the Txn that
// creates the key also reads the one before it, in one round trip): a release
// wakes only the next in line, with no herd. When that key goes it checks
// again, in one Txn that also confirms its own key still exists; a waiter
// whose own etcd lease expires or is revoked while it waits gets an error
// matching fence.ErrLeaseLost, not the lock. The waiter's etcd lease is
// kept alive while it waits, every third of the TTL etcd granted it (not
// of a shorter fence.TTL, which etcd raises to its minimum). A waiter that
// gives up (budget, ctx) revokes its etcd lease, which deletes its key, and
// the one behind it moves up. A call of an Acquire with a budget (its
// Grant, its create Txn, a check) that fails with gRPC's Unavailable (the
// connection lost under it: a member killed or restarted; etcd without a
// leader), or that a leader handing its leadership over dropped ("raft
// proposal dropped", unapplied), is sent again after a back-off, within
// the budget, as one that timed out: the create Txn may have been applied
// with its reply lost, and its retry finds the key, so the waiter keeps
// its place (it gave up at once, its place in line lost, when its only
// member was killed between the apply and the reply, or when its Grant
// reached a leader handing over). An Acquire without a budget returns the
// error, and so does any call on a ctx that asks for a leader
// (clientv3.WithRequireLeader) given etcd's "no leader". Release's delete
// and Extend's Grant and move are sent again so too, within ctx and until
// the lease's Deadline, past which the lease is over anyway (each failed at once before, with 9 s of a 10 s lease
// left, when a leader handing over dropped it); a member that stays down
// fails them at ctx's end or the Deadline. The watchdog rides such a
// failure out as it does any other: its renewal is tried again until the
// deadline.
//
// # Release
//
// Release deletes the key, then keeps the etcd lease for reuse (see
// above), or revokes it if it is too old or the Locker keeps 64 already.
// The lease ends (Err, Done, Context) before the delete is sent, as the
// next Acquire may take the lock the moment it is applied; the end is
// reported once the reply tells whether the key was still there. A
// plain delete, as the Mutex's Unlock, without a Compare: it never deletes
// another's key, because the key's name ends in the ID of the etcd lease it
// was created on, only an Acquire on that etcd lease makes it, and the etcd
// lease is the Lease's alone until its Release's delete has gone through.
// A delete that took more than one attempt (the first timed out, or
// failed with Unavailable) may have that attempt applied late, after the next Acquire made the same key on
// the same etcd lease: such an etcd lease is revoked, never kept. A lease whose key is already gone gets an error matching
// fence.ErrLeaseLost and deletes nothing. A Release that fails (its ctx
// done, the cluster unreachable) ends the lease all the same, as released,
// as in every backend, and revokes the etcd lease within the caller's
// deadline (such an etcd lease is never kept for reuse); if that fails
// too, the revoke is tried again in the background (see below). Calling Release
// again retries the delete.
//
// The create Txn and Release's delete are sent as gRPC requests built by
// hand, in one allocation, through the client's own connection (and so its
// interceptors, balancer and credentials), not through clientv3's Txn
// builder: some 60 allocations less per lock. A client whose KV is not
// clientv3's own (etcd's namespace package, say, which rewrites keys) gets
// them through client.KV as before; so does one whose KV was wrapped after
// New, from the next call on (each call compares client.KV with the one
// New saw), since every other call goes through the wrapper.
//
// # Deadlines and hanging members
//
// Every call takes the caller's ctx; with the cluster unreachable, Acquire
// returns when ctx ends. A member that hangs (paused, or cut off behind an
// open connection) answers nothing, and clientv3 waits on it for ever, so
// each call of Acquire, of the watchdog, of Extend and of Release gets a
// sixth of the lease time per attempt (at least half a second: a timer
// cancels the attempt, which costs less than a deadline sent with the
// request) and is tried again, within ctx, on the next member (clientv3
// balances round robin). An Acquire with a wait budget sends no attempt
// once the budget has ended: one under way then runs to its reply or its
// timeout, and the Acquire fails, so that a member that hangs holds it a
// few attempts' timeouts past its budget at most, even on a ctx that never
// ends (a waiter whose create Txn the only member applied as it was
// paused, its reply not sent, sent it again every 5 s for as long as ctx
// lasted). A few, not one: each call's first attempt is sent even past the
// budget (a Grant answered just before its timeout, after the budget
// ended, is followed by the create Txn, and, with nested prefixes, by the
// look at them), so that an Acquire with a short budget on a slow cluster
// can still take a free lock. Give ctx a deadline for an exact bound.
// Extend also gives up at the lease's deadline, when the lease has ended
// anyway, and a Release waiting for an Extend in flight returns when its
// own ctx ends. An Extend whose move got no answer settles it before it
// revokes anything (the move may land late), trying again for a second
// after ctx's end, so that one failure does not end a lease whose key is
// in place; it waits for that only until ctx ends (a tenth of a second
// more if it had ended already): the settle then goes on in the
// background, holding the lease's Release and Extend (each waits within
// its own ctx, as Locker.Close does), and ends the lease as lost if etcd never tells, and
// Extend returns ctx's error (it returned 2 s past its caller's deadline
// on a member that hung). A waiter
// also checks its place again after each renewal of its etcd lease, in case
// its watch sits on such a member. A Release whose first attempt timed out
// or lost its reply (Unavailable), or that retries one whose delete was
// sent and failed, and finds the key gone cannot tell its own delete from
// another's: it returns nil, as for a release (fence.Lease's Release), and
// revokes the etcd lease rather than keep it. One that retries a Release
// that sent nothing (its ctx done) finds the key gone by the revoke that
// Release made, and returns nil, once that revoke was confirmed; until
// then, or when that Release found the key gone already (it reads it, a
// read with no Raft commit, before it revokes) or its revoke found the
// etcd lease gone, an error matching fence.ErrLeaseLost. Revokes made to clean up (after a failed Acquire,
// a lost lease) are bounded by half a second even when ctx has
// ended, and after a failed Acquire, in an Extend, or in a Release, by
// what is left of the caller's ctx and, for
// an Acquire, of its wait budget (a tenth of a second once either has
// ended, enough for a member that answers; a quarter second after a late
// reply, whose give-back a budget already over does not cut short), so
// that a member that hangs does not hold the caller past its deadline;
// one that does not get through is tried again in the background (a lost
// lease that ran out during a quorum loss held its lock for nobody a
// whole TTL after quorum came back), until it gets through, etcd says the etcd lease
// is gone, or the client is closed (Locker.Close waits for those under
// way, within its ctx, so that closing the client after it does not cut
// them; not only for the etcd lease's TTL: a
// new leader gives every etcd lease its whole TTL again), as the request
// sent before ctx ended
// (the create Txn, a waiter's renewal, Release's delete dropped) may leave
// or create the key on it once a member that hung answers again, holding
// the lock for nobody until the etcd lease expires. On a client the user has closed, every call fails at once,
// with an error matching fence.ErrClosed (the Locker can grant no more
// leases: fence.Lead stops campaigning), and so do Acquire after
// Locker.Close and Extend during it, whose wait the work they start would
// escape (one under way whose move has not left, its Grant cut short,
// the lease as it was), and an Acquire under way when Close is called (waiting in line, or its Grant
// or create Txn not answered yet, which Close cuts short), once it has
// given its key back (Close waits for
// that within its ctx; a waiter that went on waited out its budget, and
// its give-back, tried once after Close, left its key for its etcd
// lease's TTL when it reached a member that hung or the client was
// closed after Close); after
// a Close that saw the Extends under way through, a revoke that does not
// get through is not retried in the background.
//
// # Close
//
// Locker.Close releases the leases still held, as redlock's Close does
// and as etcd's concurrency.Session.Close revokes the session's lease,
// and with it every lock it holds: each ends as released (Err returns
// fence.ErrReleased; Done and Context say so: a fence.Lead term ends, and
// Lead returns, its next Acquire refused), its key is deleted and its
// etcd lease revoked, not kept, so that the next in line takes the lock
// at once, with a greater token. Release of such a lease returns what
// Close's Release returned, Extend the lease's Err. Close does all that
// within its ctx, trying the next member after an attempt timeout as
// every call does (with one member of three hung, it released three
// leases in 1.2 s); a revoke that does not get through is retried in the
// background, which Close waits for within its ctx, and its error says
// what was left. A program that wants its locks held after it exits, until
// their etcd leases expire, does not call Close.
package etcdlock
