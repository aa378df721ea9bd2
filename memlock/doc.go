// Package memlock is an in-memory fence.Locker: the reference
// implementation of fence's contract, in the manner of hashicorp/raft's
// InmemStore. Examples, documentation and users' own tests run on it without
// any server.
//
// A Locker keeps its locks in the process's memory, so it excludes only the
// goroutines of one process and its locks vanish with it; it is not a
// distributed lock. Everything else follows the contract: each acquisition
// gets a fencing token strictly greater than every token the Locker issued
// before it (counted from 1 in each Locker: a resource that keeps accepted
// tokens across a restart of the process, in a database say, refuses the
// new Locker's smaller tokens as stale, so give such a resource a backend
// whose tokens outlive the process; TestTokensCountFromOnePerLocker);
// Acquire waits for a held lock until it is released or expires
// (a release hands the lock to the longest-waiting caller at once, without
// polling); a lease with fence.TTL expires after that time unless extended;
// a lease without TTL is renewed by a watchdog timer every third of the
// watchdog TTL until it is released; and a lease that ends closes its Done
// channel and cancels its Context with Err as the cause.
//
// A Release whose ctx is already done does what the backends' Release does
// when its request cannot get through: the lease ends at once (Err returns
// fence.ErrReleased, Done is closed, Context is cancelled), its lock stays
// held by it until its deadline, and Release returns ctx's error; calling
// Release again before the deadline frees the lock.
//
// Remove deletes a lock behind its holder's back, as an operator or a
// failover would, so that tests can exercise the lost-lease path.
//
// Time comes from the time package (time.Now and timers), so tests can run a
// Locker inside a testing/synctest bubble and let a fake clock move
// instead of waiting for real time to pass.
package memlock
