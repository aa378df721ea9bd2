package fence

import (
	"errors"
	"fmt"
)

// Errors returned by lockers and leases. Match them with errors.Is: the
// errors returned wrap one of these together with the detail (the lock name,
// the context's error, the backend's error).
var (
	// ErrNotAcquired means Acquire did not take the lock. The error also
	// wraps the reason: ErrHeld, ctx.Err(), ErrNotReplicated or a backend
	// error.
	ErrNotAcquired = errors.New("fence: lock not acquired")

	// ErrHeld means another owner held the lock for the whole wait budget.
	ErrHeld = errors.New("fence: held by another owner")

	// ErrLeaseLost means the lease ended without being released: the lock
	// expired, was removed, was taken by another owner, or could not be
	// renewed before its deadline.
	ErrLeaseLost = errors.New("fence: lease lost")

	// ErrReleased is the Err of a lease that its owner released.
	ErrReleased = errors.New("fence: lease released")

	// ErrNotReplicated means the lock was written to the primary but not
	// acknowledged by enough replicas in time; see NotReplicatedError.
	ErrNotReplicated = errors.New("fence: not replicated")

	// ErrInvalidName means the lock name was rejected; see ValidateName.
	ErrInvalidName = errors.New("fence: invalid lock name")

	// ErrInvalidOption means an option was out of range.
	ErrInvalidOption = errors.New("fence: invalid option")

	// ErrClosed means the Locker was closed, or the client it runs on (a
	// go-redis or rueidis client, a *sql.DB, an etcd client, a ZooKeeper
	// connection; for redlock, so many nodes' clients that no majority is
	// left), and grants no more leases (the Close of redlock's Locker and
	// etcdlock's, which also release the leases still held): Acquire
	// fails with it (and ErrNotAcquired) at once, whatever its wait
	// budget, Lead stops campaigning, and Run does not retry a Release
	// that failed with it.
	ErrClosed = errors.New("fence: locker closed")
)

// NotReplicatedError reports a write that too few replicas acknowledged
// within the timeout. It matches ErrNotReplicated.
type NotReplicatedError struct {
	Acked    int // replicas that acknowledged the write in time
	Required int // replicas the acknowledgement rule required
}

// Error describes the failure with its figures.
func (e *NotReplicatedError) Error() string {
	return fmt.Sprintf("fence: not replicated: %d of %d required replicas acknowledged", e.Acked, e.Required)
}

// Is reports whether target is ErrNotReplicated.
func (e *NotReplicatedError) Is(target error) bool { return target == ErrNotReplicated }

// NotAcquired returns an error that matches ErrNotAcquired and why. Backends
// use it so that every Locker reports failures the same way.
func NotAcquired(name string, why error) error {
	return fmt.Errorf("%w: %q: %w", ErrNotAcquired, name, why)
}
