// Package redislock implements fence.Locker on Redis 7.0 or newer, through the
// caller's go-redis v9 client: standalone, Sentinel failover, Cluster or Ring
// (see Ring below for what a Ring does not give).
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
//	P:{N}:queue     the owners waiting for N, in arrival order (a list)
//	P:{N}:waiters   a hash: owner → "<lease ms> <try> <secret> <deadline ms>"
//	P:{N}:revoked:O owner O's acquisitions refuse (see Deadlines)
//	P:{N}:released-by the owner whose Release last deleted the lock, as long as its lease would have lasted
//	P:{N}:released  the channel on which the lock is granted to a waiter
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
// outlives its use. Being clock-floored, the tokens qualify for
// guard/redisstore's Store.ClockTokens, which lets the resource's own
// Redis refuse the tokens issued before it lost its records.
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
// The WAIT must reach the connection that ran the script, so the Locker
// must know what kind of client it has: pass a go-redis client itself (or
// a struct embedding one). A client of a type it cannot identify (a struct
// embedding the redis.UniversalClient interface) is asked, at the first
// synced call and again every 10 s while it answers one server, whether
// its server is a cluster node and whether its keys reach more than one
// server (with INFO, or for a user whose ACL refuses INFO with HELLO and
// a mark that each server keeps: see ReplicaSync); a cluster client or a
// Ring hidden so would send WAIT to a node
// of its choosing, and is refused (HiddenClusterError). A hidden Ring that
// gets more shards (or whose other shards were down when asked) is
// refused only once asked again: for up to 10 s its acquisitions may be
// confirmed by another shard's WAIT. Pass the *redis.Ring itself. So is, with an error matching fence.ErrInvalidOption
// at its first synced try, a cluster client whose servers are not in
// cluster mode (redis.NewFailoverClusterClient's, whose servers have no
// node table to count replicas by): give the Locker
// redis.NewFailoverClient's. The refusal is kept, and ReplicaSyncRefusal
// reports it. With ReplicaSync.Replicas given no node table is read, and
// such a client is not refused: its script and WAIT go to the slot
// master's own client.
//
// # Ring
//
// On a *redis.Ring every key and the channel of a lock name go to the shard
// the Ring hashes the name's tag {N} to, and replica sync runs there: the
// script and its WAIT on one connection to that shard, the expected count
// read from, and recorded on, that shard (each shard has its own
// P:replicas). Hooks added to the Ring itself do not see the synced calls
// (acquisitions and renewals), which go to the shard's client; hooks added
// to the shard clients see every call. Add them in RingOptions.NewClient:
// Ring.OnNewNode reaches only the shards that Ring.SetAddrs adds later, not
// those the Ring was made with.
//
// A Ring is not a cluster: each Ring client decides on its own, from its
// heartbeats, that a shard is down, and then hashes that shard's keys to
// the others (as it does when its addresses are changed). A lock taken on
// one shard can then be taken again on another, by the same process or by
// one whose Ring still sees the first shard: two holders at once, and
// replica sync does not prevent it. Their tokens stay increasing only by
// the clock floor: the second shard has no token record for the name, or
// an older one, so its token is its clock in microseconds, larger than
// the first holder's provided the two hosts' clocks differ by less than
// the time between the two acquisitions. A resource that checks tokens
// then refuses the older holder (if its own record is not on a Ring too:
// guard/redisstore refuses a *redis.Ring for that reason); nothing else does (the older lease ends
// at its next renewal, which goes to the new shard and finds the lock not
// its own, or at its deadline). When the shard comes back its keys move back, to a lock that
// may still be held there. Waiters stay subscribed on the shard they
// subscribed on and, after a reshard, may miss their grant and take the
// lock only when their timers fire. Use a Cluster, or a Sentinel-managed
// primary, where a lock must hold while a node is lost.
//
// # Clients that read from replicas
//
// A client that routes read-only commands to replicas (ClusterOptions
// ReadOnly, RouteRandomly or RouteByLatency, over a cluster or over a
// primary and its replicas given as its slots, as
// redis.NewFailoverClusterClient builds it) takes and reads locks on the
// primary: every call is a script (EVALSHA, or EVAL for Locker.Status's
// reads, which no client takes for a read), Status's read of the lock's
// PTTL and token record included, which a replica behind its primary
// would report free. Its
// waiters may subscribe on a replica, which hears the grants: Redis
// replicates them. A client that sends every command to a replica
// (redis.FailoverOptions.ReplicaOnly) can neither take nor read a lock;
// New cannot tell it (go-redis keeps that option in its dialer), and each
// call fails with the replica's READONLY, its error saying why (Status
// asks the server's role with INFO: for a user refused INFO it reads the
// replica's copy).
//
// # Waiting
//
// A caller that finds the lock held and has a wait budget queues, in the
// same script as the try: its owner id joins P:{N}:queue, and its entry in
// P:{N}:waiters records when its budget ends on the server's clock (each
// later try refreshes it). Every key a script touches is one of its
// declared keys, so a slot migration redirects it (ASK, TRYAGAIN) rather
// than fail it.
// It subscribes to the lock's release channel (sharded pub/sub on a
// cluster) and sends nothing else while it waits. On a client of a type
// New cannot identify (see Replica sync) it subscribes both ways, on one
// connection, and its scripts publish grants both ways: such a client may
// hide a cluster client, and a Locker on that cluster client, in another
// process, publishes with SPUBLISH only and hears nothing else; otherwise
// each side's grants to the other's waiters went unheard, and the lock,
// granted, sat idle until the waiter's timer (the old holder's TTL)
// (TestHandoffBetweenClusterClientAndWrapper). Where SPUBLISH and
// SSUBSCRIBE are refused (an ACL user without them), such a Locker
// publishes and subscribes with PUBLISH and SUBSCRIBE alone. A
// *redis.ClusterClient given its slots (ClusterOptions.ClusterSlots, as
// redis.NewFailoverClusterClient builds one) does the same: its servers
// need not be a cluster's, and Lockers on plain or Sentinel clients of
// them publish and subscribe the unsharded way
// (TestHandoffBetweenFailoverClusterClientAndClient).
//
// A release grants the lock: in the release script, it takes the first
// live owner off the queue (one whose entry is still there and whose
// budget has not ended; a revoked owner does not queue), sets the lock to it with a new token, issued exactly as
// an acquisition issues one, and publishes "g <owner> <token> <px> <try>
// <server ms> <mac>" on the channel; with no live waiter it publishes
// nothing. The waiter takes the lease from the message, with no command of
// its own: a handoff costs one round trip, and an acquisition after a wait
// two commands (the try that queued it and, later, its release). The lease
// counts from when the waiter sent the try that the grant followed, on the
// local clock alone. The waiter confirms a grant with one run of the
// acquire script (which finds the lock its own: same token, fresh expiry)
// when replica sync applies and no WAIT of the releaser covered the grant
// (the grant was written by the releaser's connection, and a WAIT proves
// nothing until the waiter's own connection writes; see below), when the
// grant is for less than its lease time (px is capped by what is left of
// the waiter's budget), or when more than a quarter of the
// lease has passed since that try (the lease maps its deadline to the
// server's clock from the grant's server time as it reads the message, so
// a grant read late would have its renewals refused as late).
//
// With replica sync, the first try of an Acquire that finds other Acquires
// of the same Locker waiting for the lock is sent without WAIT: it almost
// surely queues, and what it writes is used by nobody (the grant that
// follows is confirmed with WAIT). If it takes the lock after all, the
// lock is not used until a synced run of the acquire script (same owner:
// it finds the lock its own) has covered the take with its WAIT; refused,
// the lock is kept, as a refused waiter keeps a grant (see ReplicaSync),
// and the next try confirms it, or the withdrawal at the budget's end
// gives it back.
//
// With replica sync, a Release whose Locker has an Acquire waiting for the
// lock (one whose budget leaves it a whole lease) sends WAIT with the
// release script, in the same round trip, as an acquisition does. When the
// release grants the lock to one of that Locker's waiters and enough
// replicas acknowledge, the Locker tells the waiter so in memory: the
// grant, written on the release's connection, is covered by that WAIT,
// and the waiter takes it without a confirmation (unless it has sent a try
// since the one the grant followed: that try confirmed the grant, or gave
// it back). A waiter whose grant comes while such a release is in flight
// waits for its outcome before it confirms (for at most twice the sync
// timeout: a release stuck on its way
// for longer did not make that grant, or cannot tell in time); a grant the
// WAIT did not cover (too few acknowledgements, an error, or a releaser in
// another process) is confirmed as above. The Release pays the replica's
// acknowledgement (up to the sync timeout when replicas lag; a Release
// whose context ends sooner than twice that timeout sends no WAIT), and
// reports what its script did whatever the WAIT counted. Cancelled while
// it waits, it returns the cancellation's error, as one cancelled during
// any round trip does, though its script may have deleted the lock (the
// lease then gives the lock back owner-checked, which finds it granted on
// and leaves it). A contended acquisition with sync, handed on within one
// Locker, costs three commands (its queued try, its release and that
// release's WAIT); from another process's release, four (its queued try,
// the confirmation and its WAIT, its release).
//
// Waiters get the lock in the order they queued, across processes. A free
// lock with a live owner queued at its head (its holder's lease ran out,
// nobody released it) is granted to that owner by whichever acquisition
// finds it so, and the acquisition finds the lock held; the waiters, whose
// timers run to the holder's TTL, try when it has run out. A waiter that
// died while queued is granted the lock for no longer than its budget had
// left, and the others' timers move to the end of that grant. A waiter
// that gives up withdraws (its entry is deleted) and gives the lock
// back, to the next waiter, if a grant reached it meanwhile. Its id stays
// in the list until it reaches the head, or until a waiter joining a list
// more than half made of such ids rebuilds it from the live ones, so the
// list stays within twice the waiters (plus a few) however long the lock
// is held.
//
// A grant is signed: the mac is SHA-1 of a secret of the waiter's (64
// random bits, sent with its tries, kept in its entry, never
// published) and the grant's numbers. A client that may publish on the
// channel but cannot read fence's keys cannot make a waiter take a grant
// the script did not make; one that can read them could as well delete
// the lock, so the threat model is the one every Redis lock has: clients
// with access to the keys are trusted. A forged or stale grant is
// confirmed by a try, which finds the truth (so is a genuine one replayed
// after a later try of its waiter). Grants to other owners, which a
// waiter cannot check, move its timer no later than its own try set it,
// and one that pushes a grant kept for a joining waiter out of the
// Locker's memory makes that waiter try at once.
//
// Waiters of an older fence (before the queue) set the waiting mark
// P:{N}:waiting instead; while it is there and no queued waiter is live, a
// release publishes "released" for them. Their releases and acquisitions
// know no queue: a release of theirs grants nothing (this version's
// waiters try when the holder's TTL would have run out), and their
// acquisitions take a free lock ahead of the queue. A "released" message,
// or a subscription made again after its connection broke, wakes a waiter
// of this version to try. Nothing is ever held twice.
//
// A wait rides out a failover or a restart: transient errors (connection
// refused or timed out, LOADING, READONLY, MASTERDOWN, too few replica
// acknowledgements, ...) are retried with back-off within the wait budget;
// permanent ones (WRONGTYPE, auth, ACL, a bad token record) end it at once.
//
// # Batching
//
// On a Locker made with a *redis.Client (not a cluster client, not
// fencerueidis's connection), a script call that finds another call of the
// same Locker in flight is not sent on its own: it waits in a queue, and up
// to two sender goroutines each take the whole queue and send it as one
// pipeline on one connection (with one WAIT after it when replica sync
// applies, standing for every call in it), then hand each caller its own
// reply or error. Calls followed by WAIT are batched apart from those
// that need none (a release, a queued try), so that a slow or missing
// replica, which holds a WAIT for its timeout, does not hold them. A lone call goes straight through, as before, so the
// uncontended latency does not change; many concurrent calls cost the
// client and the server one write and one read per batch rather than per
// command.
//
// Hooks added to the client (AddHook) see a batch as one pipeline: their
// ProcessPipelineHook runs, with every script call of the batch in it, and
// their ProcessHook does not. The pipeline is sent with the first caller's
// context values (a tracing span in it, say), not the others', without the
// callers' cancellation (one caller leaving must not fail the others) and
// with the latest of their deadlines (none if one of them has none). A
// caller whose context ends before a sender took its call leaves the queue
// and its call is never sent; one whose call was taken stops waiting at its
// deadline, and a late acquisition is then given back as any other.
//
// # Leases
//
// Without fence.TTL a lease lasts Options.WatchdogTTL (default 30 s) and a
// watchdog goroutine renews it every third of that. A renewal that finds the
// lock gone or owned by another ends the lease at once, and so does one
// that finds the client closed (the error matches fence.ErrClosed too, on
// which fence.Lead stops at once; go-redis's redis.ErrClosed counts only
// when a PING says so as well, since a Ring's shard replaced under a call
// gives it); renewals that fail for other reasons are retried until the
// local deadline, when the lease ends. With fence.TTL the lease simply
// expires, and its loss is noticed at the deadline, by Extend or by
// Release.
//
// A renewal (and an acquisition's script finding the lock already its own)
// never moves the lock's expiry earlier (PEXPIRE … GT): a short Extend that
// was held up on its way, given up on, and overtaken by a longer one would
// otherwise cut the expiry below the Deadline the longer one gave, and
// another owner could take the lock inside the lease
// (TestStaleRenewalDoesNotShortenLock). Extend with a shorter ttl than is
// left moves Deadline earlier and leaves the lock held until the later time.
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
// A renewal run before the deadline whose answer did not come in time (the
// caller gave up, the connection dropped, replica sync refused it) may have
// moved the expiry without moving Deadline (so may one whose answer came
// after the lease had ended): the lock would outlive the lease by up to
// that renewal's TTL, held by nobody. If the lease then ends unreleased,
// or by a Release that failed, the lock, if still its own, is given back in
// the background (owner-checked). A Release after the lease ended does the
// same, and returns the lease's error.
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
// may be on its way. go-redis itself sends a command again (MaxRetries)
// after its read timed out, and the first may still arrive, late: a lease
// one of whose tries took half the client's ReadTimeout or more is released
// with the same mark, so that such a try, arriving after the Release,
// refuses rather than take the lock for its lease time. Such a lease that
// ends at its deadline, unreleased, gives the lock back at once
// (owner-checked) and leaves the mark too: the first copy, arriving
// during the lease, finds the lock its own and moves its expiry past the
// deadline. An Acquire that returns without a lease after such a try
// revokes its owner likewise. A copy delayed for longer than the mark
// (a minute, or the lease time if longer) is not covered.
//
// go-redis also sends a command again after its connection broke, and a
// server going down can run a script and lose its reply with the
// connection, then refuse the resend's dial: the Acquire fails with the
// refusal (ECONNREFUSED), and a server that kept its data (persistence)
// has the lock when it is back. So on a client that resends (MaxRetries
// not -1), an Acquire failed by a refusal leaves a give-back too. A
// give-back that fails on its way (refused, reset, timed out) waits in the
// Locker's parking, where one goroutine for all of them tries one of each
// server's (a cluster's node, a Ring's shard), with back-off up to a
// second and for at most a second each, until one gets through, then
// sends all of that server's (each dropped when its lock would have
// expired; the goroutine ends with the last, or when the client is
// closed). While a server is down, each failed Acquire thus holds some
// 300 bytes for its lease time, not a goroutine.
//
// The same resend sends a Release again whose script ran but whose reply
// was lost with the connection, and that second run finds the lock gone,
// or granted already to the next waiter. So that it does not report a loss
// that did not happen, a Release that deletes the lock renames it to
// P:{N}:released-by, which keeps its owner for what was left of the lock's
// expiry, and a run that finds the lock not its own but that record its
// own answers as the first did: Release returns nil. The record costs
// about a microsecond of the server's time per release and one key per
// lock name (each release overwrites it), as Redisson's unlock keeps a
// marker per request for the same reason. An ACL user denied RENAME
// releases with DEL, without the record (fence doctor warns of it). A
// resend after the lease's deadline, or after another owner's release of
// the same lock (the waiter the first run handed the lock to may take it
// and release it before the resend comes), is not covered (an error
// matching fence.ErrLeaseLost).
//
// A try that takes the lock (or confirms a grant) but whose reply comes
// after the deadline of the lease it would give (the lease time counted from
// when the try was sent, less the drift allowance: a paused or starved
// server, a slow network) gives no lease: one already ended would reach the
// caller with its Context done. It is treated as a try given up on: the lock
// is given back, owner-checked, with the revocation mark, and the Acquire
// tries again with a new owner within what is left of its wait budget; with
// none left, or with no budget, it returns an error matching
// fence.ErrNotAcquired (and fence.ErrLeaseLost) that says the reply came too late.
// It waits for the give-back until ctx ends, or the wait budget does but
// no sooner than 250 ms after the late reply (the first try runs on ctx
// alone, so its late reply may come past the budget; a server that
// answers again frees the lock in a round trip): a give-back that hangs
// (the server stopped answering) goes on in the background, as
// WaitGiveBacks's do.
//
// The wait budget (fence.Wait) bounds the waiting: the pauses, the
// subscription and every try after the first. The first try runs on ctx
// alone, as an Acquire without a budget does, so that an uncontended
// Acquire with a budget costs what one without does (no context, timer or
// call goroutine of its own). With no deadline on ctx, a server that never
// answers therefore holds it for the client's own timeouts (5 s with
// go-redis's defaults, about 25 s through a hung Sentinel's lookups),
// however short the budget, and about 40 s when the call goes out in a
// batch (another call of the Locker was in flight, such as the background
// give-back of an acquisition abandoned on that server): go-redis retries a
// pipeline to a hung server for 40 s with its defaults (40 to 43 s measured
// for the first Acquire without a deadline after two that had ended by
// theirs). A caller for whom the budget is the only
// deadline gives ctx one a little past it (fence exec ends it 1 s after
// --wait): the budget still ends first, so a lock held throughout is
// ErrHeld, and a hung server ctx's error.
//
// A lease proves nothing once its holder has paused: pass its Token to the
// protected resource and have the resource reject stale tokens.
package redislock
