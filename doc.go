// Package fence defines distributed locks that stay safe after the lock is gone.
//
// A lock service can only promise that a lease was granted. It cannot stop a
// holder that pauses (a GC pause, a stalled network) past its lease, nor a
// holder whose lock vanished in a failover, from waking up and writing. So
// every lease that fence grants carries a fencing Token: for one lock name,
// every acquisition gets a token strictly greater than every token issued
// before it. The worker passes the token with each write, and the protected
// resource rejects a token lower than one it has already accepted:
//
//	UPDATE payment SET status = 'APPROVED', last_fencing_token = $2
//	 WHERE id = $1 AND last_fencing_token < $2
//
// Zero rows updated means the write was stale (or the row does not exist).
// Holding a Lease object never proves exclusivity: only the resource's token
// check makes stale work harmless.
//
// The package holds the contract that every backend implements: Locker,
// Lease, Token, the per-call options (Wait, TTL) and the error values.
// Backends live in their own packages: redislock for Redis (fencerueidis
// runs it over rueidis), redlock for Redlock over independent Redis
// masters, pglock for PostgreSQL, etcdlock for etcd, zklock for ZooKeeper
// (etcdlock, zklock and fencerueidis are modules of their own), and
// memlock, an in-memory reference implementation that the examples use. The conformance suite
// every backend passes lives in fencetest.
//
// # Leases
//
// Locker.Acquire waits up to the Wait budget (zero: try once) and returns a
// Lease or an error that matches ErrNotAcquired and says why: ErrHeld when
// another owner kept the lock for the whole budget, the context's error when
// ctx ended first, or the backend's error. A lease acquired with TTL expires
// after that time unless extended; a lease acquired without TTL is renewed by
// a watchdog until it is released or cannot be renewed in time. Either way
// its Done channel closes and its Context is cancelled once the lease has
// ended, and Err says why.
//
// Run acquires, calls a function and releases; Lead campaigns for a lock
// again and again and runs a function while it leads (leader election).
//
// # Metrics
//
// A backend given an Observer (redislock, redlock, pglock, etcdlock and
// memlock take one in their Options, zklock with WithObserver; guard in
// HTTPOptions and Table) reports each
// acquisition with its result and wait, each lease's end with its cause and
// hold time, replica-sync refusals, and guard decisions. The Observer
// interface depends on nothing; adapters for Prometheus (fenceprom) and
// OpenTelemetry (fenceotel) live in modules of their own.
//
// Locks are not re-entrant: acquiring a name that the same process already
// holds waits like any other caller, as with sync.Mutex.
package fence
