// Package redislock implements fence.Locker on Redis 7.0 or newer, through the
// caller's go-redis v9 client: standalone, Sentinel failover or Cluster.
//
// # Keys
//
// A lock name N under the prefix P (default "fence") uses keys and a
// channel that share the hash tag {N}, so on a cluster they live in one slot
// (and a non-cluster primary with replicas holds one more key, P:replicas;
// see Replica sync):
//
//	P:{N}           the lock: the owner's 128-bit random id, with the lease's expiry
//	P:{N}:token     the last token issued for N, kept for Options.TokenRetention
//	P:{N}:waiting   set while a caller may wait for N, for its wait budget
//	P:{N}:released  the channel that Release publishes on, while P:{N}:waiting is set
//
// # Tokens
//
// The acquire script checks the lock, issues the token and sets the expiry in
// one round trip. The token is max(last + 1, the server's clock in
// microseconds). The clock floor keeps tokens increasing when the last-token
// record is lost: Redis restarted without persistence, the key evicted, or a
// failover to a replica that missed the last write, provided the clocks of
// the Redis hosts differ by less than the time such a loss takes to happen
// (a restart or a failover takes seconds; NTP keeps hosts within
// milliseconds). The record expires after its retention period, so no key
// outlives its use.
//
// Lua counts in doubles, exact up to 2^53; a clock-floored token stays far
// below that (2^53 µs is the year 2255). A record that is not a canonical
// decimal integer below 2^53 - 1 was not written by fence, and the script
// refuses it (ErrBadTokenRecord, naming the key) rather than repeat a token
// or hand out a negative one.
//
// # Replica sync
//
// With ReplicaSync on (the default), each acquisition and renewal is
// followed by WAIT on the same connection, in the same round trip, for as
// many replica acknowledgements as the rule asks of the replicas the
// primary is expected to have. That expected count is recorded on the
// primary, in the key P:replicas ("<master_replid> <count>", no expiry), so
// that it survives the process: a replica seen once keeps counting, for
// every client of that primary, until an operator lowers the record
// (Locker.SetExpectedReplicas) or a failover gives the primary a new
// replication id. On a cluster the count is read from the cluster's node
// table instead, and scripts follow MOVED and ASK redirections and retry
// TRYAGAIN, so a slot migration does not fail acquisitions; waiters
// subscribe again on the slot's new node when Redis drops their
// subscription.
//
// # Waiting
//
// A caller that finds the lock held and has a wait budget marks the name as
// waited on (P:{N}:waiting, in the same script as the try, for its wait
// budget; a release publishes only while the mark is there), subscribes to
// the lock's release channel (sharded pub/sub on a cluster), and tries again
// when a release is published or when the holder's TTL has run out. It sends
// nothing else while it waits. One subscription per lock name is shared by
// the Locker's waiters, and a release wakes one of them; it belongs to none
// of them, so a waiter that gives up does not end it for the others.
//
// While processes of an older fence (before the waiting mark) wait on the
// same locks as this one during an upgrade, those waiters set no mark: this
// version's releases do not tell them, and they take the lock when the
// holder's TTL runs out (a watchdog lease's up to 30 s) or when a release
// that a current waiter marked wakes them. Nothing is ever held twice.
//
// A wait rides out a failover or a restart: transient errors (connection
// refused or timed out, LOADING, READONLY, MASTERDOWN, too few replica
// acknowledgements, ...) are retried with back-off within the wait budget;
// permanent ones (WRONGTYPE, auth, ACL, a bad token record) end it at once.
//
// # Leases
//
// Without fence.TTL a lease lasts Options.WatchdogTTL (default 30 s) and a
// watchdog goroutine renews it every third of that. A renewal that finds the
// lock gone or owned by another ends the lease at once; renewals that fail
// for other reasons are retried until the local deadline, when the lease
// ends. With fence.TTL the lease simply expires, and its loss is noticed at
// the deadline, by Extend or by Release.
//
// A renewal carries the lease's deadline on the server's clock (mapped
// from the server time that the last acquire or renew script returned,
// erring early by 1%), and the script refuses to move the expiry once that
// has passed. A renewal that sat in a paused server's socket until after
// the holder gave up therefore cannot keep the lock for a lease nobody uses;
// the lock expires when it would have. This relies on the two clocks'
// rates agreeing within 1% over one lease, not on their settings agreeing;
// a server clock that steps backwards during a lease loosens it (as it
// loosens Redis's own key expiry).
//
// # Deadlines
//
// Every call fence makes returns by its context's deadline whatever the
// client's options: go-redis only puts the deadline on the socket with
// ContextTimeoutEnabled, so without it each command runs on a goroutine
// (one of a few that the Locker keeps for a moment between calls) that the
// caller leaves when the context ends. A plain *redis.Client with
// ContextTimeoutEnabled is called directly when the context has a deadline:
// it ends the call at the deadline itself. A cancellation before the
// deadline then ends a call to a hung server only at the client's
// ReadTimeout or the deadline, whichever is first (5 s with go-redis's
// defaults); a caller that needs cancellation honoured at once should leave
// ContextTimeoutEnabled off. A client with ReadTimeout or WriteTimeout -2
// sets no socket deadlines, so fence runs its calls on goroutines as if
// ContextTimeoutEnabled were off. The goroutine ends when the client's
// own timeout or the server's late answer ends the command; a late answer
// to an acquisition that took the lock gives the lock back. An acquisition
// whose answer is lost altogether (the client's own timeout closed the
// connection, yet the command may still run) is revoked: the release script
// leaves a mark, P:{N}:revoked:<owner>, for a minute, and the acquire script
// refuses a marked owner, so the lock is freed whichever of the two runs
// first. The mark is left even when the release deletes the lock: a waiting
// Acquire retries with the same owner, so more than one of its acquisitions
// may be on its way.
//
// A lease proves nothing once its holder has paused: pass its Token to the
// protected resource and have the resource reject stale tokens.
package redislock
