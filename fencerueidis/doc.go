// Package fencerueidis runs redislock over a rueidis.Client, so that users
// of github.com/redis/rueidis get fence's Redis lock with rueidis's
// automatic pipelining: concurrent acquisitions and releases of a process
// share a connection and its round trips.
//
// New returns a *redislock.Locker: the same type, the same lock algorithm,
// scripts, keys, replica sync, waiting and deadlines as redislock.New on
// go-redis, and the two interoperate on the same lock names. Only the
// transport differs.
//
// # Design
//
// redislock makes few kinds of Redis calls: its scripts by EVALSHA, sent
// in full on NOSCRIPT (acquire, extend, release, the replica record, which
// reads INFO replication), with WAIT pipelined after them on the same
// connection when replica sync applies; Status's reads (the lock's PTTL
// and GET, in a script so that a client sending read-only commands to
// replicas reads them on the primary, and the replica record), always in
// full and each on a connection of rueidis's blocking pool (sent as a
// blocking command), so that they answer while the server pauses writes
// even when a write of the process waits out the pause on the shared
// connection; SUBSCRIBE to
// a lock's release channel while someone waits (on a dedicated connection
// of the primary, shared by the Locker's waiters, for a client that routes
// to replicas, since rueidis's SUBSCRIBE is read-only too). The internal package
// internal/redisconn names exactly these as an interface, and redislock
// dispatches to it at the three places that make them, keeping its go-redis
// calls as they are (so that their allocation count, measured in
// redislock's alloc test, does not change). This package implements the
// interface on rueidis and reaches redislock's constructor through
// redisconn's hook; the module is separate so that rueidis does not enter
// the library's go.mod. A copy of the lock algorithm would drift; a seam of
// three calls does not.
//
// Commands go through rueidis's Do and DoMulti with the client's own
// pipelining: a script with WAIT after it is one DoMulti, which rueidis
// sends on one connection (WAIT blocks, so rueidis gives the pair a
// dedicated connection), so WAIT counts the script's write. A WAIT that
// fails after its script ran (an ACL that denies it, a lost connection)
// is told apart from the script's own error (redisconn.ErrWait), so that
// the lock the script took is given back at once, as on go-redis. Server errors
// are passed to redislock as redisconn.Error, so its retry rules (LOADING,
// READONLY, …) read them as they read go-redis's.
//
// Redis Cluster is not supported yet: its WAIT must go to the slot's master
// on the script's connection, and its release channels need SSUBSCRIBE with
// resubscription on slot moves, which redislock does through go-redis's
// cluster client. New refuses a cluster client, and a Sentinel client
// made with ReplicaOnly, whose every command goes to a replica that
// refuses the lock's writes (TestSentinelReplicaOnlyRefused; read from
// rueidis's own client type, as the closed flag below is: a wrapper is
// taken at its word).
//
// Deadlines: every call of the Locker ends by its caller's deadline, even
// on a server that hangs (see TestHungServer). rueidis bounds a command's
// wait for its reply by ctx, but not the reconnection it may start for it,
// so calls with a deadline run on redislock's call goroutines, as they do
// on go-redis without ContextTimeoutEnabled. A connection that such a
// deadline closed answers the next commands with that deadline's error
// until rueidis dials again; the adapter sends such a command again, at
// most twice, rather than report another call's deadline as its own.
// Such a command was never written: rueidis v1.0.79 closes the connection
// only from a synchronous call (one command or one DoMulti in flight, all
// under the deadline's own context), and fails the commands queued behind
// it without sending them (pipe.failSync). Were one to have run, acquire
// and extend are safe to run again for the same owner, but a release run
// twice would report a lease lost that it had released. A command whose
// connection the server closed (EOF, a reset: CLIENT KILL, a restart, a
// failover) is sent again too, at most twice, as go-redis does and with
// that risk: rueidis sends again only read-only commands
// (TestCallsAfterConnectionsKilled).
//
// RESP2: on a client made with AlwaysRESP2, rueidis subscribes on a
// connection of its own, and once that connection is killed (CLIENT KILL,
// a proxy's idle timeout) rueidis v1.0.79's Receive retries it dead without
// subscribing again, so waiters were not woken by releases. Subscribe asks
// the protocol once (a script's map reply, which RESP2 flattens) and, on
// RESP2 (and on a client that routes to replicas), subscribes through a
// dedicated client instead, whose hooks report the connection's death. The
// waiters of a Locker share that connection, every name waited on
// subscribed on it, and it is closed when the last of them leaves: one
// connection of rueidis's blocking pool per Locker while anyone waits,
// whatever the number of names (TestWaitersSpareBlockingPool). That pool
// also runs replica sync's script and WAIT pairs and Status's reads, so
// New refuses a BlockingPoolSize of 1, which left them none while someone
// waited, not even a woken waiter's own try at the lock
// (TestBlockingPoolOfOneRefused; read from rueidis's own client types, a
// wrapper taken at its word); the default is 1024. Lockers that share a
// client take one connection each for their waiters, so give the pool one
// more than their number: New sees one Locker at a time, and two on a
// pool of 2 left a woken waiter none, as one on a pool of 1
// (TestBlockingPoolOfTwoTwoLockers, skipped: a design question). They wait for a
// connection under their context (Status's reads are sent as blocking
// commands, not through Dedicated, whose wait for the pool takes no
// context and outlived Status's deadline:
// TestCallsLeaveNoPoolWaitPastDeadline); only the shared connection's own
// Dedicate waits without one, on its goroutine, while its waiters wait
// under theirs. On RESP3, the default, the subscription shares the
// command connection and is restored with it (TestSubscriptionKilled). rueidis's Receive leaves its
// channel subscribed when its context ends, and a dedicated connection
// keeps a channel subscribed until told, so when the last waiter on a name
// leaves, the adapter sends UNSUBSCRIBE itself (a new subscription to that
// channel waits for it: TestResubscribeAfterUnsubscribe); and since a
// dedicated connection is not closed with its client, the shared
// connection also watches the client's closing through a Receive of its
// own, on another channel (TestClientClosedUnderWaiter,
// TestSubscriptionsEndWithWaiters).
//
// Closing: once the rueidis client is closed, every call of the Locker
// fails with an error matching fence.ErrClosed, and its parked give-backs
// are dropped (the parking's goroutine ends at its next try). rueidis
// v1.0.79 does not always say so itself: a client closed after a failed
// dial answers with that dial's error and then dials again, and one closed
// while a dial is under way keeps the new connection, so the adapter reads
// the flag that the client's Close sets (single and Sentinel clients, and
// standalone ones with replicas; a client of another type, a wrapper, or a
// standalone one with EnableRedirect and no replicas, is taken at its word)
// (TestParkingEndsWithClosedClient, TestClosedAfterTimeout). Conversely,
// rueidis.ErrClosing from a client whose flag says open (its Sentinel
// client gives it to a call on the old primary's connection, closed by a
// switch) is a failed call, not a closed client: a watchdog renewal that
// gets it is retried (TestRenewalClosingOnOpenClientKeepsLease).
package fencerueidis
